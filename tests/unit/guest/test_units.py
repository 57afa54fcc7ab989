"""Pure functions of the guest agent, in-process (no agent subprocess)."""

from __future__ import annotations

import ast
import asyncio
import os
import stat
from pathlib import Path

import pytest

from warren.guest import connect, files, filesystem, main, multipart, process, users
from warren.guest.errors import HttpError, RpcError

GUEST_DIR = Path(__file__).resolve().parents[3] / "warren" / "guest"


def test_guest_package_imports_only_stdlib_and_itself() -> None:
    import sys

    for path in GUEST_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    continue
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", f"{path.name} imports {name}"


def test_parse_args_defaults_and_env_port() -> None:
    opts = main.parse_args([], environ={})
    assert (opts.host, opts.port, opts.passwd) == ("0.0.0.0", 49983, "/etc/passwd")
    assert main.parse_args([], environ={"WARREN_AGENT_PORT": "5000"}).port == 5000
    opts = main.parse_args(["--port=7", "--host", "::1", "--passwd", "/p"], environ={"WARREN_AGENT_PORT": "5"})
    assert (opts.host, opts.port, opts.passwd) == ("::1", 7, "/p")
    with pytest.raises(main.UsageError):
        main.parse_args(["--bogus"], environ={})
    with pytest.raises(main.UsageError):
        main.parse_args(["--port", "x"], environ={})


def test_field_readers_accept_camel_and_snake_case() -> None:
    assert connect.field({"watcherId": "a"}, "watcher_id") == "a"
    assert connect.field({"watcher_id": "b"}, "watcher_id") == "b"
    assert connect.get_int({"size": "42"}, "size") == 42
    assert connect.get_int({"pid": 7}, "pid") == 7
    assert connect.get_bytes({"stdin": "aGk="}, "stdin") == b"hi"
    assert connect.get_bytes({"stdin": "aGk"}, "stdin") == b"hi"  # unpadded
    assert connect.get_bytes({"stdin": "-_8"}, "stdin") == b"\xfb\xff"  # URL-safe
    assert connect.get_enum({"signal": "SIGNAL_SIGKILL"}, "signal", {"SIGNAL_SIGKILL": 9}) == 9
    assert connect.get_enum({"signal": 15}, "signal", {}) == 15
    with pytest.raises(RpcError) as exc:
        connect.get_int({"pid": "x"}, "pid")
    assert exc.value.code == "invalid_argument"


def test_end_stream_envelope() -> None:
    assert connect.end_stream() == b"\x02\x00\x00\x00\x02{}"
    err = connect.end_stream(RpcError("not_found", "gone"))
    assert err[0] == 2 and b'"code":"not_found"' in err


def test_exit_info_matches_go_strings() -> None:
    ok = process.ExitInfo.from_wait_status(0)
    assert ok.to_event() == {"event": {"end": {"status": "exit status 0", "exited": True}}}
    failed = process.ExitInfo.from_wait_status(3 << 8)
    assert failed.to_event()["event"]["end"] == {
        "status": "exit status 3",
        "exitCode": 3,
        "exited": True,
        "error": "exit status 3",
    }
    killed = process.ExitInfo.from_wait_status(9)
    assert killed.to_event()["event"]["end"] == {
        "status": "signal: killed",
        "exitCode": -1,
        "error": "signal: killed",
    }


def test_go_mode_string() -> None:
    assert filesystem.go_mode_string(stat.S_IFREG | 0o644) == "-rw-r--r--"
    assert filesystem.go_mode_string(stat.S_IFDIR | 0o755) == "drwxr-xr-x"
    assert filesystem.go_mode_string(stat.S_IFLNK | 0o777) == "Lrwxrwxrwx"
    assert filesystem.go_mode_string(stat.S_IFDIR | stat.S_ISVTX | 0o777) == "dtrwxrwxrwx"
    assert filesystem.go_mode_string(stat.S_IFREG | stat.S_ISUID | 0o755) == "urwxr-xr-x"


def test_rfc3339() -> None:
    assert filesystem.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert filesystem.rfc3339(1_500_000_000) == "1970-01-01T00:00:01.500Z"
    assert filesystem.rfc3339(1_000_001_000) == "1970-01-01T00:00:01.000001Z"
    assert filesystem.rfc3339(1_000_000_001) == "1970-01-01T00:00:01.000000001Z"


def test_resolve_path() -> None:
    u = users.User("user", 1000, 1000, "/home/user", "/bin/sh", (1000,))
    assert users.resolve_path("a/b", u, None) == "/home/user/a/b"
    assert users.resolve_path("../x", u, None) == "/home/x"
    assert users.resolve_path("~/f", u, None) == "/home/user/f"
    assert users.resolve_path("~", u, None) == "/home/user"
    assert users.resolve_path("/abs", u, None) == "/abs"
    assert users.resolve_path("", u, "/work") == "/work"
    assert users.resolve_path("", u, None) == "/home/user"
    with pytest.raises(users.PathError):
        users.resolve_path("~other/x", u, None)


def test_accounts_parse_passwd_and_groups(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    group = tmp_path / "group"
    passwd.write_text("# c\nroot:x:0:0::/root:/bin/sh\nbad line\nuser:x:1000:100::/home/user:/bin/sh\n")
    group.write_text("users:x:100:\nwheel:x:10:root,user\ndocker:x:999:user\n")
    acc = users.Accounts(str(passwd), str(group))
    u = acc.user("user")
    assert u is not None and (u.uid, u.gid, u.home, u.groups) == (1000, 100, "/home/user", (100, 10, 999))
    assert acc.user("nobody-here") is None
    assert acc.user_name(1000) == "user" and acc.user_name(4321) == "4321"
    assert acc.group_name(10) == "wheel"
    passwd.write_text("root:x:0:0::/root:/bin/sh\nnew:x:5:5::/n:/bin/sh\n")
    assert acc.exists("new") and not acc.exists("user")  # re-read on change


def test_ensure_dirs_creates_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    users.ensure_dirs(str(target), os.getuid(), os.getgid())
    assert target.is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        users.ensure_dirs(str(tmp_path / "file" / "sub"), os.getuid(), os.getgid())


def test_signature_matches_the_sdk() -> None:
    from e2b.sandbox.signature import get_signature

    sdk = get_signature("/home/user/a.txt", "read", "user", "tok", None)["signature"]
    assert files.make_signature("/home/user/a.txt", "read", "user", "tok", None) == sdk
    sdk = get_signature("p", "write", None, "tok", 60)
    assert files.make_signature("p", "write", "", "tok", str(sdk["expiration"])) == sdk["signature"]


def test_accept_encoding_negotiation() -> None:
    assert files._accept_gzip("") is False
    assert files._accept_gzip("gzip") is True
    assert files._accept_gzip("gzip, deflate") is True
    assert files._accept_gzip("identity, gzip;q=0.5") is False
    assert files._accept_gzip("gzip;q=0") is False
    assert files._accept_gzip("*;q=1, identity;q=0") is True
    with pytest.raises(HttpError) as exc:
        files._accept_gzip("br, identity;q=0")
    assert exc.value.status == 406


def _parse_multipart(body: bytes, boundary: str, chunk: int) -> list[tuple[dict[str, str], bytes]]:
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]

    async def read() -> bytes:
        return pieces.pop(0) if pieces else b""

    async def run() -> list[tuple[dict[str, str], bytes]]:
        reader = multipart.MultipartReader(read, boundary)
        out = []
        while (headers := await reader.next_part()) is not None:
            data = b""
            while chunk := await reader.read():
                data += chunk
            out.append((headers, data))
        return out

    return asyncio.run(run())


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 100000])
def test_multipart_reader_any_chunking(chunk: int) -> None:
    body = (
        b"preamble\r\n--XyZ\r\n"
        b'Content-Disposition: form-data; name="file"; filename="/a/b.txt"\r\n'
        b"Content-Type: text/plain\r\n\r\n"
        b"line1\r\n--XyZ-not-a-boundary\r\nline3"
        b"\r\n--XyZ\r\n"
        b'Content-Disposition: form-data; name="other"\r\n\r\n'
        b"\r\n--XyZ--\r\nepilogue"
    )
    parts = _parse_multipart(body, "XyZ", chunk)
    assert len(parts) == 2
    assert parts[0][0]["content-type"] == "text/plain"
    assert parts[0][1] == b"line1\r\n--XyZ-not-a-boundary\r\nline3"
    assert parts[1][1] == b""


def test_parse_disposition() -> None:
    d = multipart.parse_disposition('form-data; name="file"; filename="/x/a%22b\\\\c.txt"')
    assert d == {"name": "file", "filename": '/x/a"b\\c.txt'}
    d = multipart.parse_disposition("form-data; name=file; filename*=UTF-8''%2Fh%C3%A9.txt")
    assert d["filename"] == "/hé.txt"
