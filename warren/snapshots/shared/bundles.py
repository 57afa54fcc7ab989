"""Snapshot dirs in a shared object store, as verified bundles: one tar archive plus a manifest.

    bundles = SharedSnapshots(open_object_store("s3://bucket/warren"), scratch=state_dir / "tmp" / "shared")
    manifest = await bundles.push("sandboxes/<id>", snapshot_dir, {"runtime_hash": ...})   # node A
    manifest = await bundles.pull("sandboxes/<id>", empty_dir)                            # node B

In the store, bundle ``k`` is:

    k/data-<16 hex>.tar     the archive (GNU tar, ``archive.py``), a new name on every push
    k/manifest.json         written after its data: names the data object, its sha256 and size

The order is the whole protocol. A push uploads its archive under a fresh name, then writes the
manifest (one atomic put), then deletes the data objects the key had before. So a reader never sees a
manifest whose data is not complete, a key without a manifest does not exist (a push that crashed
leaves only invisible data, which the key's next push removes), and parking the same sandbox again is
safe for a reader that is pulling it: the reader verifies what it downloads against the manifest it
read, and when its data object was deleted meanwhile it reads the new manifest and starts over.
Concurrent pushes of one key are not supported: a key has one writer (the node that owns the sandbox).

A pull verifies everything before unpacking: manifest checksum and names, the data's size (never
downloading more than the manifest says) and sha256. Then GNU tar unpacks into the caller's empty
directory; on any failure the directory is emptied again and the scratch file removed.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from ... import trees
from ...errors import InvalidRequestError, NotFoundError, WarrenError
from . import archive
from .manifest import MANIFEST, MAX_MANIFEST_BYTES, BundleError, BundleManifest, check_bundle_key, data_object_re
from .objects import ObjectStore, ObjectTooLargeError, check_prefix

__all__ = ["BundleError", "BundleManifest", "SharedSnapshots"]

log = logging.getLogger(__name__)

PULL_ATTEMPTS = 3
"""A pull whose data object vanished (the key was pushed again) re-reads the manifest this often."""
LIST_CONCURRENCY = 16
"""Manifests :meth:`SharedSnapshots.list` reads at once."""


class SharedSnapshots:
    """Bundles over an :class:`~.objects.ObjectStore` (see the module docstring).

    ``scratch`` is a local directory (made if missing) for the archives being packed or downloaded:
    every push and pull removes its own file whatever happens; files named ``bundle-*.tar`` left in it
    by a crash can be removed whenever no push or pull runs (at node start).
    """

    def __init__(self, objects: ObjectStore, scratch: Path) -> None:
        self.objects = objects
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True, mode=0o700)

    def __repr__(self) -> str:
        return f"SharedSnapshots({self.objects!r})"

    async def push(self, key: str, src: Path, meta: dict[str, Any]) -> BundleManifest:
        """Pack directory ``src`` and publish it as bundle ``key``, replacing the key's previous bundle."""
        check_bundle_key(key)
        data_object = f"{key}/data-{secrets.token_hex(8)}.tar"
        try:  # the manifest must be JSON and fit: find out before packing gigabytes
            probe = BundleManifest(key, data_object, "0" * 64, 0, time.time(), meta).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"bundle meta is not JSON: {exc}") from exc
        if len(probe) > MAX_MANIFEST_BYTES // 2:
            raise InvalidRequestError("bundle meta is too large")
        if not await asyncio.to_thread(lambda: src.is_dir() and not src.is_symlink()):
            raise InvalidRequestError(f"{src} is not a directory")
        previous = await self._data_objects(key)
        tmp = self._scratch_file("push")
        published = False
        try:
            digest, size = await archive.pack(src, tmp)
            await self.objects.put_file(data_object, tmp)
            manifest = BundleManifest(key, data_object, digest, size, time.time(), meta)
            published = True  # from here on the manifest may be out there: its data stays
            await self.objects.put_bytes(f"{key}/{MANIFEST}", manifest.encode())
        except BaseException:
            if not published:
                await asyncio.shield(self._forget(data_object))
            raise
        finally:
            await asyncio.shield(asyncio.to_thread(_unlink, tmp))
        for old in previous:
            await self._forget(old)
        return manifest

    async def pull(self, key: str, dest: Path) -> BundleManifest:
        """Download, verify and unpack bundle ``key`` into the empty directory ``dest``.

        ``NotFoundError`` when the key has no manifest; :class:`BundleError` for anything that does not
        verify or unpack (``dest`` is then empty again); ``UnavailableError`` when the store cannot be
        reached.
        """
        check_bundle_key(key)
        before = await asyncio.to_thread(_empty_dir_stat, dest)
        gone: BundleManifest | None = None
        for _ in range(PULL_ATTEMPTS):
            manifest = await self.manifest(key)
            if manifest is None:
                raise NotFoundError(f"no bundle {key!r} in the shared store")
            if manifest == gone:
                raise BundleError(f"bundle {key!r}: its data object {manifest.data_object} is missing")
            tmp = self._scratch_file("pull")
            try:
                try:
                    await self.objects.get_file(manifest.data_object, tmp, max_bytes=manifest.size)
                except NotFoundError:
                    gone = manifest  # pushed again meanwhile (or broken): read the manifest again
                    continue
                except ObjectTooLargeError as exc:
                    raise BundleError(f"bundle {key!r}: the data object is larger than its manifest says") from exc
                digest, size = await asyncio.to_thread(archive.hash_file, tmp)
                if size != manifest.size:
                    raise BundleError(f"bundle {key!r}: size mismatch ({size} bytes, manifest: {manifest.size})")
                if digest != manifest.sha256:
                    raise BundleError(f"bundle {key!r}: checksum mismatch (sha256 {digest}, the manifest says "
                                      f"{manifest.sha256})")  # fmt: skip
                await archive.unpack(tmp, dest)
                return manifest
            except BaseException:
                await asyncio.shield(asyncio.to_thread(_reset_dir, dest, before))
                raise
            finally:
                await asyncio.shield(asyncio.to_thread(_unlink, tmp))
        raise BundleError(f"bundle {key!r} changed {PULL_ATTEMPTS} times while it was being read")

    async def manifest(self, key: str) -> BundleManifest | None:
        """The verified manifest of bundle ``key``; None when there is none; :class:`BundleError` when it
        does not verify (or belongs to another key)."""
        check_bundle_key(key)
        try:
            raw = await self.objects.get_bytes(f"{key}/{MANIFEST}", max_bytes=MAX_MANIFEST_BYTES)
        except ObjectTooLargeError as exc:
            raise BundleError(f"bundle {key!r}: the manifest is too large") from exc
        if raw is None:
            return None
        manifest = BundleManifest.decode(raw)
        if manifest.key != key:
            raise BundleError(f"bundle {key!r}: the manifest is that of {manifest.key!r}")
        return manifest

    async def delete(self, key: str) -> None:
        """Remove bundle ``key``: the manifest first (the bundle is gone at once), then its data.
        Nothing to remove is not an error; bundles under ``key/`` are other bundles and stay."""
        check_bundle_key(key)
        await self.objects.delete(f"{key}/{MANIFEST}")
        for name in await self._data_objects(key):
            await self.objects.delete(name)

    async def list(self, prefix: str) -> builtins.list[BundleManifest]:
        """The complete bundles whose keys start with ``prefix`` (a string prefix), by key. A key with data
        but no manifest is not one; a manifest that does not verify is logged and skipped."""
        check_prefix(prefix)
        suffix = "/" + MANIFEST
        keys = sorted(k[: -len(suffix)] for k in await self.objects.list(prefix) if k.endswith(suffix))
        gate = asyncio.Semaphore(LIST_CONCURRENCY)

        async def read(key: str) -> BundleManifest | None:
            async with gate:
                try:
                    return await self.manifest(key)
                except (BundleError, InvalidRequestError) as exc:
                    log.warning("shared store: skipping bundle %r: %s", key, exc)
                    return None

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(read(key), name=f"shared-manifest-{key}") for key in keys]
        return [m for t in tasks if (m := t.result()) is not None]

    # helpers

    async def _data_objects(self, key: str) -> builtins.list[str]:
        pattern = data_object_re(key)
        return [name for name in await self.objects.list(key + "/") if pattern.fullmatch(name)]

    async def _forget(self, name: str) -> None:
        """Delete a data object nobody needs; a failure is logged (the key's next push retries it)."""
        try:
            await self.objects.delete(name)
        except WarrenError as exc:
            log.warning("shared store: could not delete %r: %s", name, exc)

    def _scratch_file(self, what: str) -> Path:
        return self.scratch / f"bundle-{what}-{secrets.token_hex(8)}.tar"


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _empty_dir_stat(dest: Path) -> os.stat_result:
    """``dest``'s stat when it is an empty directory (not a symlink), else :class:`BundleError`."""
    try:
        st = os.lstat(dest)
        if not os.path.isdir(dest) or os.path.islink(dest) or os.listdir(dest):
            raise BundleError(f"cannot unpack into {dest}: not an empty directory")
    except OSError as exc:
        raise BundleError(f"cannot unpack into {dest}: {exc}") from exc
    return st


def _reset_dir(dest: Path, before: os.stat_result) -> None:
    """Empty ``dest`` again and give it back the owner and mode tar may have set from the archive."""
    trees.clear_dir(dest)
    os.chown(dest, before.st_uid, before.st_gid, follow_symlinks=False)
    os.chmod(dest, before.st_mode & 0o7777)

