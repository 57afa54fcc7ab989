"""A Dockerfile as an E2B template build: the same request the SDK's ``Template.from_dockerfile`` sends.

The SDK's own Dockerfile converter (``e2b.template.dockerfile_parser``: quoting, ``ARG``/``ENV``
expansion, heredocs, ``COPY --chown/--chmod``, ``ENTRYPOINT``/``CMD`` folding) drives a recorder
here instead of a ``Template``, so ``warren build`` and the SDK agree on every instruction:

    FROM image           fromImage (or fromTemplate when the CLI finds a template of that name)
    RUN cmd              RUN [cmd]
    ENV k=v ...          ENV [k, v, ...]         (ARG too: it becomes a build-time ENV, as in the SDK)
    WORKDIR p            WORKDIR [p]
    USER u               USER [u]
    COPY/ADD src dest    COPY [src, dest, chown, chmod] + filesHash (the SDK's hash of the files)
    CMD / ENTRYPOINT     startCmd (exec form shell-quoted; ENTRYPOINT + CMD combined like Docker)

Like the SDK, the build starts as ``root`` in ``/`` and ends as ``user`` in ``/home/user`` unless
the Dockerfile set a USER or WORKDIR. A Dockerfile has no readiness check, so its start command gets
no ready command (the SDK waits a fixed 20 s at build time; warren would wait at every create).
EXPOSE, VOLUME, LABEL, MAINTAINER are ignored; multi-stage builds are refused.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from warren.errors import InvalidRequestError
from warren.templates.steps import validate_copy_source


@dataclass(frozen=True)
class CopyFiles:
    """One COPY step's files: what to tar and upload under ``files_hash``."""

    src: str
    dest: str
    files_hash: str


@dataclass
class DockerfileBuild:
    base_image: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    copies: list[CopyFiles] = field(default_factory=list)
    start_cmd: str | None = None
    warnings: list[str] = field(default_factory=list)

    def request(self, *, from_template: str | None = None, force: bool = False) -> dict[str, Any]:
        """The ``POST /v2/templates/{id}/builds/{buildID}`` body."""
        body: dict[str, Any] = {"steps": self.steps, "force": force}
        if from_template is not None:
            body["fromTemplate"] = from_template
        else:
            body["fromImage"] = self.base_image
        if self.start_cmd:
            body["startCmd"] = self.start_cmd
        return body


class _Recorder:
    """The ``DockerfileParserInterface`` the SDK's converter calls, recording wire-format steps."""

    def __init__(self, context: Path, ignore: list[str], out: DockerfileBuild) -> None:
        self._context = context
        self._ignore = ignore
        self._out = out

    def _step(self, kind: str, args: list[str], **extra: Any) -> _Recorder:
        self._out.steps.append({"type": kind, "args": args, "force": False, **extra})
        return self

    def run_cmd(self, command: str | list[str], user: str | None = None) -> _Recorder:
        commands = [command] if isinstance(command, str) else command
        return self._step("RUN", [" && ".join(commands), *([user] if user else [])])

    def copy(
        self,
        src: str,
        dest: str,
        force_upload: bool | None = None,
        user: str | None = None,
        mode: int | None = None,
        resolve_symlinks: bool | None = None,
        gzip: bool | None = None,
    ) -> _Recorder:
        from e2b.template.utils import calculate_files_hash

        validate_copy_source(src)
        try:
            files_hash = calculate_files_hash(src, dest, str(self._context), self._ignore, False, None)
        except ValueError as exc:
            raise InvalidRequestError(f"COPY {src}: {exc}") from exc
        self._out.copies.append(CopyFiles(src, dest, files_hash))
        args = [src, dest, user or "", f"{mode:04o}" if mode is not None else ""]
        return self._step("COPY", args, filesHash=files_hash)

    def set_workdir(self, workdir: str) -> _Recorder:
        return self._step("WORKDIR", [str(workdir)])

    def set_user(self, user: str) -> _Recorder:
        return self._step("USER", [user])

    def set_envs(self, envs: dict[str, str]) -> _Recorder:
        if not envs:
            return self
        return self._step("ENV", [item for key, value in envs.items() for item in (key, value)])

    def set_start_cmd(self, start_cmd: str, ready_cmd: Any) -> _Recorder:
        self._out.start_cmd = start_cmd
        return self


def translate(dockerfile: str, context: Path) -> DockerfileBuild:
    """Translate Dockerfile text; COPY sources are hashed from ``context`` (honouring ``.dockerignore``).

    Raises ``InvalidRequestError`` with the converter's message for what it cannot translate.
    """
    from e2b.template.dockerfile_parser import DockerfileSyntaxError, parse_dockerfile
    from e2b.template.utils import read_dockerignore

    out = DockerfileBuild(base_image="")
    recorder = _Recorder(context, read_dockerignore(str(context)), out)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):  # the converter print()s its warnings
            out.base_image = parse_dockerfile(dockerfile, recorder)
    except (DockerfileSyntaxError, ValueError) as exc:
        raise InvalidRequestError(f"Dockerfile: {exc}") from exc
    out.warnings = [line for line in printed.getvalue().splitlines() if line.strip()]
    return out


def context_tar(copy: CopyFiles, context: Path) -> IO[bytes]:
    """The gzipped tar the SDK uploads for a COPY step (a temporary file; the caller closes it)."""
    from e2b.template.utils import read_dockerignore, tar_file_stream

    stream: IO[bytes] = tar_file_stream(copy.src, str(context), read_dockerignore(str(context)), False, True)
    return stream


def read_dockerfile(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequestError(f"cannot read {path}: {os.strerror(exc.errno or 0) or exc}") from exc


__all__ = ["CopyFiles", "DockerfileBuild", "context_tar", "read_dockerfile", "translate"]
