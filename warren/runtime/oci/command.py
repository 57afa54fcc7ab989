"""The one typed wrapper warren uses to run an external tool (runc, runsc, ip, nft, patchelf, ...).

Rules it enforces for every caller:

* argv is a list, never a shell string;
* every call has an explicit ``timeout`` (seconds); on expiry, or when the awaiting task is cancelled,
  the child gets SIGTERM, then SIGKILL after ``grace`` seconds, and is always waited for (reaped);
* a failure raises :class:`RuntimeCommandError`, carrying the exit status and the tail of stderr.

Usage::

    result = await run_command(["runc", "--version"], timeout=5)
    print(result.stdout_text)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from warren.errors import RuntimeFailure

__all__ = ["CommandResult", "RuntimeCommandError", "run_command"]

_log = logging.getLogger(__name__)

STDERR_TAIL = 4000
"""How many characters of a failing tool's stderr go into the error: enough for any runc/runsc message."""

DEFAULT_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL when a command is abandoned."""


class RuntimeCommandError(RuntimeFailure):
    """An external tool could not be started, exited non-zero, or overran its deadline."""

    def __init__(self, argv: Sequence[str], reason: str, *, returncode: int | None, stderr: str) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.reason = reason
        detail = f": {stderr}" if stderr else ""
        super().__init__(f"{' '.join(self.argv[:3])}: {reason}{detail}")


@dataclass(frozen=True)
class CommandResult:
    """What a finished command produced."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    duration: float
    """Wall-clock seconds from spawn to exit."""

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")


_REASON = re.compile(r"(?i)error|rejected|cannot|failed|panic|denied|invalid")


def _tail(data: bytes) -> str:
    """The end of a tool's output; for long output (a Go panic with a state dump) the lines that name
    the reason come first, cut to their last 400 characters, where Go puts the message."""
    text = data.decode("utf-8", "replace").strip()
    if len(text) <= STDERR_TAIL:
        return text
    reasons = [line[-400:] for line in text.splitlines() if _REASON.search(line)][:5]
    tail = text[-(STDERR_TAIL - sum(len(r) for r in reasons)) // 2:]
    return "\n".join([*reasons, "...", tail])


def _read_tail(path: Path, start: int) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(max(start, fh.seek(0, os.SEEK_END) - STDERR_TAIL))
            return fh.read()
    except OSError:
        return b""


async def _terminate(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM, wait up to ``grace``, SIGKILL, and always wait for the exit status."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await proc.wait()
        return
    except TimeoutError:
        _log.warning("pid %d ignored SIGTERM for %.1fs; sending SIGKILL", proc.pid, grace)
    except asyncio.CancelledError:
        # Cancelled again while being polite: stop being polite, but still reap before leaving.
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())
        raise
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await asyncio.shield(proc.wait())


async def run_command(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,  # noqa: ASYNC109 -- enforcing the deadline is this wrapper's job (house rule 7)
    stdin: bytes | None = None,
    check: bool = True,
    output: Path | None = None,
    env: Mapping[str, str] | None = None,
    grace: float = DEFAULT_GRACE,
) -> CommandResult:
    """Run ``argv`` to completion and return its exit status and output.

    ``output``: send the child's stdout *and* stderr to this file (appended) instead of pipes. Needed
    for ``runc run -d`` / ``runsc run --detach``: the detached container inherits the runtime's stdio,
    so a pipe would never reach EOF. On failure the file's new tail becomes the error's stderr.

    ``check``: raise :class:`RuntimeCommandError` on a non-zero exit (default); with ``check=False``
    the caller inspects ``returncode`` itself. Timeouts and spawn failures always raise.
    """
    args = [os.fspath(a) for a in argv]
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("LC_ALL", "C")  # tool messages are parsed and shown; keep them in English
    out_fh = None
    out_start = 0
    if output is not None:
        out_fh = output.open("ab")
        out_start = out_fh.tell()
    started = time.monotonic()
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=out_fh if out_fh is not None else asyncio.subprocess.PIPE,
                stderr=out_fh if out_fh is not None else asyncio.subprocess.PIPE,
                env=child_env,
            )
        except OSError as exc:
            raise RuntimeCommandError(args, f"cannot execute ({exc.strerror})", returncode=None, stderr="") from exc
    finally:
        if out_fh is not None:
            out_fh.close()  # the child holds its own copy of the descriptor
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr = await proc.communicate(stdin)
    except TimeoutError as exc:
        await _terminate(proc, grace)
        raise RuntimeCommandError(args, f"timed out after {timeout:g}s", returncode=None, stderr="") from exc
    except BaseException:
        await _terminate(proc, grace)
        raise
    duration = time.monotonic() - started
    returncode = proc.returncode
    assert returncode is not None  # communicate() returns only after the child exited
    if output is not None:
        stdout, stderr = b"", (_read_tail(output, out_start) if returncode != 0 else b"")
    result = CommandResult(tuple(args), returncode, stdout or b"", stderr or b"", duration)
    if check and returncode != 0:
        raise RuntimeCommandError(args, f"exit status {returncode}", returncode=returncode, stderr=_tail(result.stderr))
    return result
