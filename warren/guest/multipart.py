"""A streaming multipart/form-data parser: parts are read chunk by chunk, never held whole."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

MAX_PART_HEAD = 16 * 1024


class MultipartError(ValueError):
    """The body is not well-formed multipart."""


class MultipartReader:
    """``await next_part()`` gives a part's headers (None after the last), then ``await read()``
    gives its body in chunks until b""."""

    def __init__(self, read: Callable[[], Awaitable[bytes]], boundary: str) -> None:
        if not boundary or len(boundary) > 200:
            raise MultipartError("missing or invalid multipart boundary")
        self._source = read
        # A virtual CRLF in front lets the first delimiter match like every later one.
        self._buf = bytearray(b"\r\n")
        self._delim = b"\r\n--" + boundary.encode("latin-1")
        self._eof = False
        self._state = "preamble"  # preamble | after_delim | body | done

    async def _fill(self) -> None:
        if self._eof:
            raise MultipartError("unexpected end of multipart body")
        data = await self._source()
        if not data:
            self._eof = True
            return
        self._buf += data

    async def next_part(self) -> dict[str, str] | None:
        while self._state == "body":
            await self.read()
        if self._state == "done":
            return None
        if self._state == "preamble":
            start = 0
            while True:
                idx = self._buf.find(self._delim, start)
                verdict = None if idx < 0 else self._is_boundary(idx + len(self._delim))
                if verdict:
                    del self._buf[: idx + len(self._delim)]
                    break
                if verdict is False:
                    start = idx + 1
                    continue
                await self._fill()
            self._state = "after_delim"
        # after a delimiter: "--" ends the body, else optional padding then CRLF and the headers
        while len(self._buf) < 2:
            await self._fill()
        if self._buf[:2] == b"--":
            self._state = "done"
            return None
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self._buf) > MAX_PART_HEAD:
                raise MultipartError("part headers too large")
            await self._fill()
        first_crlf = self._buf.find(b"\r\n")
        head = bytes(self._buf[first_crlf + 2 : end])
        del self._buf[: end + 4]
        headers: dict[str, str] = {}
        for line in head.split(b"\r\n"):
            if not line:
                continue
            name, sep, value = line.partition(b":")
            if not sep:
                raise MultipartError("bad part header")
            headers[name.decode("latin-1").strip().lower()] = value.decode("utf-8", "surrogateescape").strip()
        self._state = "body"
        return headers

    def _is_boundary(self, pos: int) -> bool | None:
        """Whether a delimiter match ending at ``pos`` is a real boundary: it must be followed by
        "--" or by optional blanks and CRLF. None: not enough bytes buffered to tell."""
        buf = self._buf
        if len(buf) - pos < 2:
            return None
        if buf[pos : pos + 2] == b"--":
            return True
        while pos < len(buf) and buf[pos] in b" \t":
            pos += 1
        if len(buf) - pos < 2:
            return None
        return buf[pos : pos + 2] == b"\r\n"

    async def read(self) -> bytes:
        """The next chunk of the current part; b"" at its end."""
        if self._state != "body":
            return b""
        start = 0
        while True:
            idx = self._buf.find(self._delim, start)
            if idx < 0:
                safe = len(self._buf) - (len(self._delim) - 1)
                if safe > 0:
                    return self._take(safe)
                await self._fill()
                start = 0
                continue
            verdict = self._is_boundary(idx + len(self._delim))
            if verdict is False:
                start = idx + 1
                continue
            if idx > 0:
                return self._take(idx)
            if verdict is None:
                await self._fill()
                continue
            del self._buf[: len(self._delim)]
            self._state = "after_delim"
            return b""

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


_PARAM = re.compile(r';\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')
_HTML5_ESCAPE = re.compile(r"%(22|0[0-9A-Fa-f]|1[0-9A-Fa-f])")


def parse_disposition(value: str) -> dict[str, str]:
    """The parameters of a Content-Disposition header (``name``, ``filename``), unescaped.

    Quoted strings take backslash escapes; browsers and httpx also percent-escape '"' and control
    characters (HTML5 form encoding), which is undone; ``filename*`` (RFC 5987) wins over ``filename``.
    """
    params: dict[str, str] = {}
    for key, raw in _PARAM.findall(value):
        key = key.lower()
        if raw.startswith('"'):
            val = re.sub(r"\\(.)", r"\1", raw[1:-1])
            val = _HTML5_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), val)
        else:
            val = raw.strip()
        if key.endswith("*"):
            charset, _, rest = val.partition("'")
            _lang, _, encoded = rest.partition("'")
            from urllib.parse import unquote

            key = key[:-1]
            val = unquote(encoded, encoding=charset or "utf-8", errors="surrogateescape")
            params[key] = val
            continue
        params.setdefault(key, val)
    return params
