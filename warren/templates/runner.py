"""The steps of a build, run in its build sandbox through the guest agent.

RUN is ``process.Process/Start`` under the step's user, workdir and env; COPY uploads the context tar
over ``/files`` and unpacks it with the guest helper (:mod:`warren.templates.guest_helper`, run by the
agent bundle's Python); WORKDIR and USER make the directory or the account. A step that fails raises
``BuildFailed`` with its SDK step name.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from warren.errors import WarrenError
from warren.guestclient import AgentError, OutputCallback, ProcessResult
from warren.runtime.base import AGENT_MOUNT
from warren.templates import guest_helper
from warren.templates.buildlog import BuildLog
from warren.templates.model import BASE_STEP, FINALIZE_STEP, BuildFailed
from warren.templates.steps import (
    DEFAULT_USER,
    ROOT,
    Metadata,
    Step,
    StepType,
    account_name,
    copy_is_glob,
    copy_source_base,
    files_hash_of_tar,
    resolve_path,
)
from warren.templates.uploads import UploadStore

SCRATCH = guest_helper.SCRATCH
HELPER_ARGV = (f"{AGENT_MOUNT}/bin/python3", "-S", "-E", "-B", "-c")
HELPER_TIMEOUT_S = 600.0
_COPY_CHUNK = 1 << 20


class BuildAgent(Protocol):
    """The guest agent calls a build makes (``warren.guestclient.AgentClient``)."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> ProcessResult: ...

    async def write_file(self, path: str, data: bytes | AsyncIterator[bytes], *, user: str = "root") -> None: ...


class StepRunner:
    """Runs one build's steps in its sandbox; every line of output goes to the build's log."""

    def __init__(self, agent: BuildAgent, log: BuildLog, uploads: UploadStore, *, step_timeout_s: float) -> None:
        self._agent = agent
        self._log = log
        self._uploads = uploads
        self._step_timeout_s = step_timeout_s

    async def prepare(self, *, provision: bool) -> str:
        """Make the sandbox ready for steps (the scratch dir; the default user when ``provision``); the shell."""
        info = await self._helper("prepare", {}, BASE_STEP)
        if provision:
            made = await self._helper("ensure_user", {"name": DEFAULT_USER}, BASE_STEP)
            if made.get("created"):
                self._log.add(f"Created the default user '{DEFAULT_USER}'", step=BASE_STEP)
        return "/bin/bash" if info.get("bash") else "/bin/sh"

    async def cleanup(self) -> None:
        """Remove the scratch files, so they are not sealed into the layer."""
        await self._helper("cleanup", {}, FINALIZE_STEP)

    async def run(self, step: Step, meta: Metadata, shell: str) -> None:
        if step.type is StepType.RUN:
            await self._run(step, meta, shell)
        elif step.type is StepType.COPY:
            await self._copy(step, meta)
        elif step.type is StepType.WORKDIR:
            path = resolve_path(step.args[0], meta)
            await self._helper("mkdir", {"path": path, "owner": meta.user}, step.name)
        elif step.type is StepType.USER:
            name = account_name(step.args[0])
            made = await self._helper("ensure_user", {"name": name}, step.name)
            if made.get("created"):
                self._log.add(f"Created user '{name}' (uid {made.get('uid')})", step=step.name)

    async def _run(self, step: Step, meta: Metadata, shell: str) -> None:
        cmd = step.args[0]
        user = step.args[1] if len(step.args) > 1 and step.args[1] else meta.user
        argv = [shell, "-l", "-c", cmd] if shell == "/bin/bash" else [shell, "-c", cmd]
        lines = LineLogger(lambda text, stream: self._log.add(text, step=step.name,
                                                              level="error" if stream == "stderr" else "info"))
        try:
            result = await self._agent.run(argv, user=user, cwd=meta.workdir, envs=meta.env,
                                           timeout_s=self._step_timeout_s, on_output=lines.feed)
        except AgentError as exc:
            raise BuildFailed(f"step {step.name} ({step.describe()}) could not run: {exc}", step.name) from exc
        finally:
            lines.flush()
        if result.timed_out:
            raise BuildFailed(f"step {step.name} ({step.describe()}) was killed after "
                              f"{self._step_timeout_s:.0f}s", step.name)
        if result.exit_code != 0:
            detail = f" ({result.error})" if result.error and not result.error.startswith("exit status") else ""
            raise BuildFailed(
                f"step {step.name} ({step.describe()}) failed: exit code {result.exit_code}{detail}", step.name
            )  # fmt: skip

    async def _copy(self, step: Step, meta: Metadata) -> None:
        assert step.files_hash is not None
        src, dest = step.args[0], step.args[1]
        upload = self._uploads.path(step.files_hash)
        if not upload.is_file():
            raise BuildFailed(f"the files of step {step.name} ({step.describe()}) were never uploaded "
                              f"(filesHash {step.files_hash})", step.name)  # fmt: skip

        def verify() -> str:
            with open(upload, "rb") as fh:
                return files_hash_of_tar(fh, src, dest)

        try:
            actual = await asyncio.to_thread(verify)
        except WarrenError as exc:
            self._uploads.remove(step.files_hash)
            raise BuildFailed(f"step {step.name}: {exc}", step.name) from exc
        if actual != step.files_hash:
            self._uploads.remove(step.files_hash)
            raise BuildFailed(
                f"the uploaded files of step {step.name} ({step.describe()}) do not match their filesHash "
                f"{step.files_hash} (got {actual}); the upload was discarded, build again to re-send it",
                step.name,
            )
        remote = f"{SCRATCH}/{step.files_hash}.tar"
        try:
            await self._agent.write_file(remote, _read_chunks(upload), user=ROOT)
        except AgentError as exc:
            raise BuildFailed(f"step {step.name}: copying the files into the build sandbox failed: {exc}",
                              step.name) from exc  # fmt: skip
        target = resolve_path(dest, meta) + ("/" if dest.endswith("/") else "")
        owner = step.args[2] if len(step.args) > 2 and step.args[2] else meta.user
        args = {"tar": remote, "src": copy_source_base(src), "dest": target, "owner": owner,
                "mode": step.args[3] if len(step.args) > 3 else "", "glob": copy_is_glob(src)}  # fmt: skip
        done = await self._helper("copy", args, step.name)
        self._log.add(f"Copied {src} to {done.get('target', target)}", step=step.name)

    async def _helper(self, op: str, args: Mapping[str, Any], step: str) -> dict[str, Any]:
        argv = [*HELPER_ARGV, _helper_source(), op, json.dumps(dict(args))]
        try:
            result = await self._agent.run(argv, user=ROOT, cwd="/", timeout_s=HELPER_TIMEOUT_S)
        except AgentError as exc:
            raise BuildFailed(f"step {step}: {op} failed in the build sandbox: {exc}", step) from exc
        if not result.ok:
            reason = result.output_tail() or f"exit code {result.exit_code}"
            raise BuildFailed(f"step {step}: {reason}", step)
        try:
            out = json.loads(result.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise BuildFailed(f"step {step}: {op} answered {result.stdout[-200:]!r}", step) from exc
        return out if isinstance(out, dict) else {}


class LineLogger:
    """Splits process output into lines for the build log (partial lines wait for their newline)."""

    def __init__(self, emit: Callable[[str, str], None]) -> None:
        self._emit = emit
        self._partial: dict[str, bytes] = {}

    def feed(self, stream: str, data: bytes) -> None:
        buf = self._partial.get(stream, b"") + data
        *lines, rest = buf.split(b"\n")
        for line in lines:
            self._emit(line.decode(errors="replace").rstrip("\r"), stream)
        if len(rest) > 8192:
            self._emit(rest.decode(errors="replace"), stream)
            rest = b""
        self._partial[stream] = rest

    def flush(self) -> None:
        for stream, rest in self._partial.items():
            if rest:
                self._emit(rest.decode(errors="replace").rstrip("\r"), stream)
        self._partial.clear()


@functools.cache
def _helper_source() -> str:
    return Path(guest_helper.__file__).read_text()


async def _read_chunks(path: Path) -> AsyncIterator[bytes]:
    fh = await asyncio.to_thread(path.open, "rb")
    try:
        while chunk := await asyncio.to_thread(fh.read, _COPY_CHUNK):
            yield chunk
    finally:
        fh.close()


__all__ = ["HELPER_ARGV", "SCRATCH", "BuildAgent", "LineLogger", "StepRunner"]
