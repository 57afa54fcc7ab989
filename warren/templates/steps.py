"""Build steps of the E2B template API, pure: parsing, the metadata they fold into, cache keys, file hashes.

A build is a base (``fromImage`` / ``fromTemplate``) and a list of steps. Steps that touch the
filesystem (RUN, COPY, WORKDIR, USER) run in a build sandbox; ENV only changes the metadata. The
metadata (env, workdir, user) after any prefix of the steps is a pure function of the base and the
steps, so a cached prefix never needs to be re-run to know it.

Cache keys chain: ``keys[0]`` names the base (its layers and metadata), ``keys[i]`` the state after
the first ``i`` steps; each step's key covers its type, arguments and, for COPY, the uploaded files'
hash. Nothing here does I/O except :func:`files_hash_of_tar`, which reads one tar.
"""

from __future__ import annotations

import enum
import hashlib
import io
import json
import posixpath
import re
import stat
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any

from warren.errors import InvalidRequestError

CACHE_FORMAT = 1
"""Bumped when the meaning of a step changes, so that old cache keys stop matching."""

ROOT = "root"
DEFAULT_USER = "user"
"""E2B's default sandbox user: builds from an image start as it, in its home."""

_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_GLOB_CHARS = frozenset("*?[{")


class StepType(enum.StrEnum):
    RUN = "RUN"
    COPY = "COPY"
    ENV = "ENV"
    WORKDIR = "WORKDIR"
    USER = "USER"


FS_STEPS = frozenset({StepType.RUN, StepType.COPY, StepType.WORKDIR, StepType.USER})
"""Steps that change the filesystem (USER creates a missing account, WORKDIR its directory)."""


@dataclass(frozen=True)
class Step:
    index: int
    """0-based position in the request; the SDK names it ``str(index + 1)`` (0 is the base)."""
    type: StepType
    args: tuple[str, ...]
    files_hash: str | None = None
    force: bool = False

    @property
    def name(self) -> str:
        """The ``step`` of log entries and of ``reason``: what the SDK maps back to a stack trace."""
        return str(self.index + 1)

    def describe(self) -> str:
        if self.type is StepType.ENV:
            pairs = zip(self.args[::2], self.args[1::2], strict=True)
            return "ENV " + " ".join(f"{k}={v}" for k, v in pairs)
        if self.type is StepType.COPY:
            return f"COPY {self.args[0]} {self.args[1]}"
        if self.type is StepType.RUN:
            suffix = f" (as {self.args[1]})" if len(self.args) > 1 and self.args[1] else ""
            return f"RUN {self.args[0]}{suffix}"
        return f"{self.type.value} {self.args[0]}"

    def canonical(self) -> dict[str, Any]:
        """What the cache key of this step covers (never the force flags)."""
        out: dict[str, Any] = {"type": self.type.value, "args": list(self.args)}
        if self.files_hash is not None:
            out["filesHash"] = self.files_hash
        return out


@dataclass(frozen=True)
class BuildRequest:
    """A parsed ``POST /v2/templates/{id}/builds/{buildID}`` body."""

    from_image: str | None
    from_template: str | None
    steps: tuple[Step, ...]
    start_cmd: str | None = None
    ready_cmd: str | None = None
    force: bool = False
    registry_auth: tuple[str, str] | None = None
    """``fromImageRegistry`` of type ``registry``: (username, password) for the base image's registry."""

    @property
    def first_forced(self) -> int:
        """How many leading steps may come from the cache (``len(steps)`` if none is forced)."""
        if self.force:
            return 0
        return next((s.index for s in self.steps if s.force), len(self.steps))


@dataclass(frozen=True)
class Metadata:
    """Process defaults of the template being built: what RUN steps and later sandboxes get."""

    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str = DEFAULT_USER

    def canonical(self) -> dict[str, Any]:
        return {"env": dict(sorted(self.env.items())), "workdir": self.workdir, "user": self.user}


def _str_list(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(f"{what} must be a list of strings")
    return tuple(value)


def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(f"{key} must be a string")
    return value


def parse_step(index: int, raw: Any) -> Step:
    """One element of ``steps``; raises ``InvalidRequestError`` naming the step."""
    where = f"step {index + 1}"
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{where} must be an object")
    try:
        kind = StepType(str(raw.get("type", "")).upper())
    except ValueError:
        raise InvalidRequestError(
            f"{where}: unsupported type {raw.get('type')!r}; expected one of {[t.value for t in StepType]}"
        ) from None
    args = _str_list(raw.get("args") or [], f"{where} args")
    files_hash = raw.get("filesHash")
    force = raw.get("force") is True
    if kind is StepType.RUN:
        if not 1 <= len(args) <= 2 or not args[0].strip():
            raise InvalidRequestError(f"{where}: RUN needs a command and optionally a user")
    elif kind is StepType.COPY:
        if not 2 <= len(args) <= 4 or not args[0] or not args[1]:
            raise InvalidRequestError(f"{where}: COPY needs a source and a destination")
        if not isinstance(files_hash, str) or not _HASH_RE.match(files_hash):
            raise InvalidRequestError(f"{where}: COPY needs filesHash, the sha256 of the uploaded files")
        if len(args) > 3 and args[3] and not re.fullmatch(r"[0-7]{3,4}", args[3]):
            raise InvalidRequestError(f"{where}: COPY mode must be octal like 0755, not {args[3]!r}")
        validate_copy_source(args[0], where)
    elif kind is StepType.ENV:
        if not args or len(args) % 2:
            raise InvalidRequestError(f"{where}: ENV needs key/value pairs")
        for name in args[::2]:
            if not _ENV_NAME.match(name):
                raise InvalidRequestError(f"{where}: invalid environment variable name {name!r}")
    elif len(args) != 1 or not args[0]:
        raise InvalidRequestError(f"{where}: {kind.value} needs exactly one argument")
    if kind is not StepType.COPY:
        files_hash = None
    return Step(index, kind, args, files_hash, force)


def parse_build_request(body: Mapping[str, Any]) -> BuildRequest:
    """The build-start body (``TemplateBuildStartV2``)."""
    from_image = _opt_str(body, "fromImage")
    from_template = _opt_str(body, "fromTemplate")
    if from_image and from_template:
        raise InvalidRequestError("give either fromImage or fromTemplate, not both")
    if not from_image and not from_template:
        raise InvalidRequestError("fromImage or fromTemplate is required")
    raw_steps = body.get("steps") or []
    if not isinstance(raw_steps, list):
        raise InvalidRequestError("steps must be a list")
    auth: tuple[str, str] | None = None
    registry = body.get("fromImageRegistry")
    if registry is not None:
        if not isinstance(registry, dict) or registry.get("type") != "registry":
            kind = registry.get("type") if isinstance(registry, dict) else None
            raise InvalidRequestError(f"fromImageRegistry of type {kind!r} is not supported (only 'registry')")
        username, password = registry.get("username"), registry.get("password")
        if not isinstance(username, str) or not isinstance(password, str) or not username:
            raise InvalidRequestError("fromImageRegistry needs a username and a password")
        auth = (username, password)
    return BuildRequest(
        from_image=from_image,
        from_template=from_template,
        steps=tuple(parse_step(i, s) for i, s in enumerate(raw_steps)),
        start_cmd=_opt_str(body, "startCmd"),
        ready_cmd=_opt_str(body, "readyCmd"),
        force=body.get("force") is True,
        registry_auth=auth,
    )


# --------------------------------------------------------------------------- metadata


def expand_vars(value: str, env: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced from ``env`` (unset: empty), as a shell would for ENV values."""
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def home_of(user: str) -> str:
    """Where relative paths of ``user`` resolve when no workdir is set (the account's usual home)."""
    return "/root" if user in (ROOT, "0") else f"/home/{user}"


def account_name(user_arg: str) -> str:
    """The account of a USER argument: ``name`` or ``name:group`` (the group is ignored)."""
    return user_arg.split(":", 1)[0]


def resolve_path(path: str, meta: Metadata) -> str:
    """An absolute, normalized path: relative ones resolve against the workdir, else the user's home."""
    base = meta.workdir or home_of(meta.user)
    return posixpath.normpath(posixpath.join(base, path))


def apply_step(meta: Metadata, step: Step) -> Metadata:
    """The metadata after ``step`` (RUN and COPY leave it as it is)."""
    if step.type is StepType.ENV:
        env = dict(meta.env)
        for name, value in zip(step.args[::2], step.args[1::2], strict=True):
            env[name] = expand_vars(value, env)
        return replace(meta, env=env)
    if step.type is StepType.WORKDIR:
        return replace(meta, workdir=resolve_path(step.args[0], meta))
    if step.type is StepType.USER:
        return replace(meta, user=account_name(step.args[0]))
    return meta


def fold(meta: Metadata, steps: Iterable[Step]) -> Metadata:
    for step in steps:
        meta = apply_step(meta, step)
    return meta


def env_from_image(entries: Iterable[str]) -> dict[str, str]:
    """An image config's ``Env`` (``K=V`` strings) as a map; the last one of a name wins."""
    out: dict[str, str] = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        if sep and name:
            out[name] = value
    return out


# --------------------------------------------------------------------------- cache keys


def base_key(parents: Sequence[str], meta: Metadata, *, provision: bool, source: str) -> str:
    """The key of a build's starting point: its parent layers, metadata, and whether it is provisioned."""
    doc = {"v": CACHE_FORMAT, "parents": list(parents), "meta": meta.canonical(), "provision": provision,
           "source": source}  # fmt: skip
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def chain_keys(base: str, steps: Sequence[Step]) -> list[str]:
    """``keys[i]``: the state after the first ``i`` steps (``keys[0] == base``); ``len(steps) + 1`` keys."""
    keys = [base]
    for step in steps:
        digest = hashlib.sha256(keys[-1].encode() + b"\n" + json.dumps(step.canonical(), sort_keys=True).encode())
        keys.append(digest.hexdigest())
    return keys


def seal_point(steps: Sequence[Step]) -> int:
    """How many steps the new layer covers: up to and including the last filesystem step (0 if none)."""
    return max((s.index + 1 for s in steps if s.type in FS_STEPS), default=0)


def cache_search(
    keys: Sequence[str], usable: int, lookup: Callable[[str], tuple[str, ...] | None]
) -> tuple[int, tuple[str, ...]] | None:
    """The longest cached prefix: ``(i, layers)`` for the largest ``i <= usable`` whose key is cached."""
    for i in range(min(usable, len(keys) - 1), -1, -1):
        layers = lookup(keys[i])
        if layers is not None:
            return i, layers
    return None


# --------------------------------------------------------------------------- COPY


def validate_copy_source(src: str, where: str = "COPY") -> None:
    """The SDK's rule: relative, and not escaping the build context."""
    normalized = posixpath.normpath(src)
    if src.startswith("/") or normalized == ".." or normalized.startswith("../"):
        raise InvalidRequestError(f"{where}: source {src!r} must be a relative path inside the build context")


def copy_source_base(src: str) -> str:
    """The directory or file a COPY source names, without its glob part (``""`` is the context root).

    ``app/*.py`` -> ``app``; ``conf/`` -> ``conf``; ``*.txt`` -> ``""``; ``./a/b.txt`` -> ``a/b.txt``.
    """
    parts: list[str] = []
    for part in posixpath.normpath(src).split("/"):
        if part in ("", ".") or any(c in _GLOB_CHARS for c in part):
            if part not in ("", "."):
                break
            continue
        parts.append(part)
    return "/".join(parts)


def copy_is_glob(src: str) -> bool:
    return any(c in _GLOB_CHARS for c in src)


def files_hash_of_tar(fileobj: IO[bytes], src: str, dest: str) -> str:
    """Recompute the SDK's ``filesHash`` (``e2b.template.utils.calculate_files_hash``) from its upload.

    The SDK hashes ``COPY <src> <dest>``, then for every file in sorted order its path relative to
    the context, ``st_mode`` and (but for directories) ``st_size``, then the symlink target or the
    file content. Its tar holds the same files in the same order under the same relative paths, with
    the permission bits as the mode, so the hash can be rebuilt from the tar alone. Raises
    ``InvalidRequestError`` for something that is not a (gzipped) tar.
    """
    hasher = hashlib.sha256(f"COPY {src} {dest}".encode())
    contents: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=fileobj, mode="r:*") as tar:
            for member in tar:
                hasher.update(member.name.encode())
                if member.issym():
                    hasher.update(str(stat.S_IFLNK | member.mode).encode())
                    hasher.update(str(len(member.linkname.encode())).encode())
                    hasher.update(member.linkname.encode())
                    continue
                if member.isdir():
                    hasher.update(str(stat.S_IFDIR | member.mode).encode())
                    continue
                if member.islnk():
                    data = contents.get(member.linkname, b"")
                elif member.isreg():
                    extracted = tar.extractfile(member)
                    data = extracted.read() if extracted is not None else b""
                else:
                    hasher.update(str(_FILE_TYPES.get(member.type, 0) | member.mode).encode())
                    hasher.update(b"0")
                    continue
                contents[member.name] = data
                hasher.update(str(stat.S_IFREG | member.mode).encode())
                hasher.update(str(len(data)).encode())
                hasher.update(data)
    except (tarfile.TarError, EOFError, OSError, UnicodeError) as exc:
        raise InvalidRequestError(f"the uploaded files are not a readable tar archive: {exc}") from exc
    return hasher.hexdigest()


_FILE_TYPES = {tarfile.FIFOTYPE: stat.S_IFIFO, tarfile.CHRTYPE: stat.S_IFCHR, tarfile.BLKTYPE: stat.S_IFBLK}


def files_hash_of_bytes(data: bytes, src: str, dest: str) -> str:
    return files_hash_of_tar(io.BytesIO(data), src, dest)


__all__ = [
    "CACHE_FORMAT",
    "DEFAULT_USER",
    "FS_STEPS",
    "ROOT",
    "BuildRequest",
    "Metadata",
    "Step",
    "StepType",
    "account_name",
    "apply_step",
    "base_key",
    "cache_search",
    "chain_keys",
    "copy_is_glob",
    "copy_source_base",
    "env_from_image",
    "expand_vars",
    "files_hash_of_bytes",
    "files_hash_of_tar",
    "fold",
    "home_of",
    "parse_build_request",
    "parse_step",
    "resolve_path",
    "seal_point",
    "validate_copy_source",
]
