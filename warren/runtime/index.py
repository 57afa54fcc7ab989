"""The node's durable index of runtimes it can run, by runtime hash.

Memory is the read path (:meth:`RuntimeIndex.resolve`, :meth:`RuntimeIndex.hashes` do no IO); one
JSON file is write-through persistence. :meth:`RuntimeIndex.register` rewrites the file durably
(temp file in the same directory, fsync, rename, fsync the directory) *before* the new entry enters
memory, so every hash the node can advertise from memory is already on disk and survives a crash
or restart. There is therefore no startup gate: :meth:`RuntimeIndex.load` at start restores every
hash ever advertised. Entries are never released (a snapshot may name a runtime for a long time).

File shape::

    {"format": 1, "runtimes": {"<hash>": {"record": {...}, "registered_at": <unix s>,
                                          "config_name": "<name>"|null, "config_version": "<v>"|null}}}

On load, an entry whose record does not parse or does not hash to its key is dropped alone (with a
warning); a file that does not decode at all starts the index empty, and the next registration
rewrites it whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warren.errors import ConflictError, HostError, InvalidRequestError
from warren.trees import fsync_dir

from .records import RuntimeConfig, RuntimeRecord, validate_runtime_configs

log = logging.getLogger("warren.runtime.index")

_FORMAT = 1


class RuntimeMissError(ConflictError):
    """A runtime hash this node has never registered (the API answers 409)."""

    def __init__(self, runtime_hash: str) -> None:
        super().__init__(f"runtime {runtime_hash} is not registered on this node")
        self.runtime_hash = runtime_hash


@dataclass(frozen=True)
class Provenance:
    """When a runtime's record was registered, and from which config if one was named."""

    registered_at: float
    config_name: str | None = None
    config_version: str | None = None


@dataclass(frozen=True)
class _Entry:
    record: RuntimeRecord
    provenance: Provenance

    def to_dict(self) -> dict[str, Any]:
        return {
            "config_name": self.provenance.config_name,
            "config_version": self.provenance.config_version,
            "record": self.record.to_dict(),
            "registered_at": self.provenance.registered_at,
        }


class RuntimeIndex:
    """Runtime hash → record, persisted in the JSON file at ``path``.

    Call :meth:`load` once at start (``register`` loads first if nobody did, so it never overwrites
    a file it has not read).
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._loaded = False
        self._lock = asyncio.Lock()
        # Writes run in threads; a cancelled register's write may still be running when the next
        # one starts. They are serialized here, and an older write never replaces a newer file.
        self._write_lock = threading.Lock()
        self._write_seq = 0
        self._disk_seq = 0

    def load(self) -> None:
        """Read the file into memory (a missing file is an empty index). Small; call before serving."""
        self._loaded = True
        self._entries = {}
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("runtime index %s unreadable (%s); starting empty", self.path, exc)
            return
        try:
            data = json.loads(raw)
            if (
                not isinstance(data, dict)
                or data.get("format") != _FORMAT
                or not isinstance(data.get("runtimes"), dict)
            ):
                raise ValueError(f"expected an object with format {_FORMAT} and a runtimes object")
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning(
                "runtime index %s does not decode (%s); starting empty, the next registration rewrites it",
                self.path,
                exc,
            )
            return
        for key, raw_entry in data["runtimes"].items():
            try:
                entry = _entry_from_dict(raw_entry)
            except (InvalidRequestError, TypeError, ValueError) as exc:
                log.warning("runtime index %s: dropping entry %s: %s", self.path, key, exc)
                continue
            if entry.record.hash() != key:
                log.warning(
                    "runtime index %s: dropping entry %s: its record hashes to %s", self.path, key, entry.record.hash()
                )
                continue
            self._entries[key] = entry
        log.info("runtime index %s: loaded %d runtime(s)", self.path, len(self._entries))

    async def register(
        self, record: RuntimeRecord, *, config_name: str | None = None, config_version: str | None = None
    ) -> str:
        """Make ``record`` resolvable by its hash, durably, and return the hash.

        The file is rewritten and synced before the entry enters memory; if that fails
        (:class:`~warren.errors.HostError`) the entry is not added. Registering a record already
        present is a no-op (the first registration's provenance is kept).
        """
        runtime_hash = record.hash()
        async with self._lock:
            if not self._loaded:
                self.load()
            if runtime_hash in self._entries:  # the hash covers the whole record: nothing to update
                return runtime_hash
            entries = dict(self._entries)
            provenance = Provenance(self._clock(), config_name, config_version)
            entries[runtime_hash] = _Entry(record, provenance)
            self._write_seq += 1
            await self._persist(entries, self._write_seq, runtime_hash)
            self._entries = entries
        log.info("registered runtime %s (%s, config %s@%s)", runtime_hash, record.sandbox_class,
                 config_name, config_version)  # fmt: skip
        return runtime_hash

    def resolve(self, runtime_hash: str) -> RuntimeRecord:
        """The record registered under ``runtime_hash``; :class:`RuntimeMissError` (409) if none."""
        entry = self._entries.get(runtime_hash)
        if entry is None:
            raise RuntimeMissError(runtime_hash)
        return entry.record

    def provenance(self, runtime_hash: str) -> Provenance:
        """When and from which config ``runtime_hash`` was registered; :class:`RuntimeMissError` if never."""
        entry = self._entries.get(runtime_hash)
        if entry is None:
            raise RuntimeMissError(runtime_hash)
        return entry.provenance

    def hashes(self) -> tuple[str, ...]:
        """Every registered hash, sorted: all durably on disk, so safe to advertise."""
        return tuple(sorted(self._entries))

    def __contains__(self, runtime_hash: object) -> bool:
        return runtime_hash in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    async def _persist(self, entries: Mapping[str, _Entry], seq: int, runtime_hash: str) -> None:
        data = {"format": _FORMAT, "runtimes": {k: e.to_dict() for k, e in sorted(entries.items())}}
        payload = (json.dumps(data, sort_keys=True, indent=1) + "\n").encode("utf-8")
        loop = asyncio.get_running_loop()
        try:
            # Shielded: a cancelled register leaves the write to finish in its thread; the entry
            # stays out of memory either way (on disk but not advertised is the safe direction).
            await asyncio.shield(loop.run_in_executor(None, self._write, payload, seq))
        except OSError as exc:
            raise HostError(f"cannot persist runtime {runtime_hash} to the runtime index {self.path}: {exc}") from exc

    def _write(self, payload: bytes, seq: int) -> None:
        with self._write_lock:
            if seq < self._disk_seq:
                return  # a newer index is already on disk; this one (a cancelled register's) is stale
            _write_durably(self.path, payload)
            self._disk_seq = seq


async def register_configs(index: RuntimeIndex, configs: Iterable[RuntimeConfig]) -> dict[tuple[str, str], str]:
    """Validate the node's runtime configs and register each record; return (name, version) → hash.

    Call on start and on every config change, before handing the configs to the prewarmer, so every
    hash it enqueues (and the node advertises) is already durable.
    """
    configs = list(configs)
    validate_runtime_configs(configs)
    hashes: dict[tuple[str, str], str] = {}
    for config in configs:
        hashes[(config.name, config.version)] = await index.register(
            config.record, config_name=config.name, config_version=config.version
        )
    return hashes


def _entry_from_dict(raw: object) -> _Entry:
    if not isinstance(raw, dict):
        raise ValueError("entry is not an object")
    registered_at = raw.get("registered_at")
    name, version = raw.get("config_name"), raw.get("config_version")
    if not isinstance(registered_at, (int, float)) or isinstance(registered_at, bool):
        raise ValueError("entry has no numeric registered_at")
    if not (name is None or isinstance(name, str)) or not (version is None or isinstance(version, str)):
        raise ValueError("entry config_name/config_version must be strings or null")
    return _Entry(RuntimeRecord.from_dict(raw.get("record")), Provenance(float(registered_at), name, version))


def _write_durably(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload``: temp file in the same dir, fsync, rename, fsync the dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


__all__ = ["Provenance", "RuntimeIndex", "RuntimeMissError", "register_configs"]
