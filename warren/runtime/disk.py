"""Per-sandbox disk size: a size-capped ext4 filesystem per sandbox, in a sparse image, loop-mounted.

::

    state_dir/
      disk-templates/ext4-v1-<size>M.img   one freshly formatted image per size, made once
      probe/disk/                          the start-up probe's test disk (removed after it)
      sandboxes/<id>/
        disk.img      the sandbox's disk: a sparse copy of the template image of its size
        disk/         where it is mounted; holds the overlay's upper/ and work/

Writes past the size get ENOSPC inside the sandbox (the overlay passes the upper filesystem's error
through); the host filesystem and other sandboxes are not touched. Project quotas would be cheaper, but
they need the quota feature on the host filesystem (ext4 needs ``CONFIG_QFMT_V2``, xfs
``CONFIG_XFS_QUOTA``) and btrfs qgroups answer EDQUOT, not ENOSPC. A loop device plus ext4 works on any
host filesystem that holds sparse files.

Cost (measured on a 2-core VM, ``make bench`` section ``disk`` has the numbers of a run): a sparse
copy of the 2 GiB template image is ~0.7 ms (about 1 MiB of metadata) where ``mkfs.ext4`` with lazy
init per sandbox was ~11 ms (a process); copy + ``LOOP_CONFIGURE`` + ``mount`` ~5-9 ms, the unmount
~3 ms. With or without a journal the mount costs the same, so the journal stays (a disk survives a
host crash without fsck). Warm-pool claims do not pay it: a pooled sandbox's disk is made when the pool
fills.

The loop device is configured with ``LO_FLAGS_AUTOCLEAR`` (so unmounting the filesystem, lazily too,
also by the orphan reaper's generic unmount, detaches it: a loop device never outlives its mount) and
direct I/O (no second copy of the data in the host page cache). The mount uses ``discard`` (files
deleted inside free host space), ``noinit_itable`` (no background zeroing of inode tables) and
``nosuid,nodev``: through the sandbox's overlay, setuid binaries and device nodes behave as before
(the overlay's own mount decides), but through ``disk/upper`` on the host they do nothing.

Images are sparse, so the sizes of all disks may add up to more than the host filesystem holds; a
sandbox that writes into a full host may get I/O errors rather than ENOSPC. Keep headroom (or keep
``WARREN_SANDBOX_DISK_MB`` x the sandbox cap below the free space).

When loop devices or ``mkfs.ext4`` are unavailable, or the node turns quotas off, ``disk/`` is a plain
directory on the host filesystem and the size is not enforced; :meth:`SandboxDisks.status` says so.

Every method blocks (syscalls, a copy, maybe mkfs): call them in a worker thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import secrets
import shutil
import stat
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from warren.errors import RuntimeFailure
from warren.runtime.rootfs import is_mountpoint as _is_mountpoint
from warren.trees import fsync_dir, remove_tree

__all__ = ["DISK_DIR", "DISK_IMAGE", "MIN_DISK_MB", "SandboxDisks", "loop_devices_backed_by"]

_log = logging.getLogger(__name__)

DISK_DIR = "disk"
DISK_IMAGE = "disk.img"
TEMPLATE_VERSION = "ext4-v1"
"""Part of every template image's name: change it when the mkfs options change."""
MIN_DISK_MB = 16
"""ext4 with a journal needs a few MiB of metadata; smaller sizes are rounded up to this."""
MAX_DISK_MB = 16 * 1024 * 1024

MKFS_ARGS = (
    "-q", "-F", "-t", "ext4", "-T", "default", "-b", "4096", "-i", "8192", "-m", "0",
    "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
)  # fmt: skip
"""4 KiB blocks at any size, one inode per 8 KiB (package trees are many small files), nothing reserved
for root (the sandbox's root is its only user), no zeroing: the image stays sparse."""
MOUNT_DATA = b"noinit_itable,discard"
MKFS_TIMEOUT = 60.0
DETACH_WAIT_S = 5.0
"""How long :meth:`SandboxDisks.release` waits for the kernel to detach a loop device (it takes ~ms)."""

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_LO_FLAGS_DIRECT_IO = 16
_LOOP_CONFIG = struct.Struct("=II" + "QQQQQIIII64s64s32sQQ" + "8Q")
"""struct loop_config {u32 fd; u32 block_size; struct loop_info64 info; u64 reserved[8]} (linux/loop.h)."""
_LO_FLAGS_OFFSET = 8 + 5 * 8 + 3 * 4
_CONFIGURE_ATTEMPTS = 32
"""LOOP_CTL_GET_FREE may hand the same device to two threads; the loser gets EBUSY and asks again."""

_MS_NOSUID = 2
_MS_NODEV = 4
_MNT_DETACH = 2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def loop_devices_backed_by(path: Path, *, exact: bool = False, sys_block: Path = Path("/sys/block")) -> list[str]:
    """``loopN: backing file`` for every loop device bound to a file under ``path`` (``exact``: to the file
    ``path``). The kernel appends `` (deleted)`` to the name of a removed backing file."""
    name = str(path).rstrip("/")
    out = []
    for dev in sorted(sys_block.glob("loop*")):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing.removesuffix(" (deleted)") == name if exact else backing.startswith(name + "/"):
            out.append(f"{dev.name}: {backing}")
    return out


class SandboxDisks:
    """Creates, mounts and releases sandbox disks under ``state_dir``; see the module docstring.

    ``enabled=False`` turns enforcement off (``disk/`` is a plain directory); ``size_mb`` overrides
    every sandbox's ``Resources.disk_mb`` (the node setting ``WARREN_SANDBOX_DISK_MB``).
    """

    def __init__(self, state_dir: Path, *, enabled: bool = True, size_mb: int | None = None) -> None:
        self.state_dir = state_dir.absolute()
        self.templates = self.state_dir / "disk-templates"
        self.enabled = enabled
        self.size_mb = size_mb
        self._status: dict[str, Any] | None = None
        self._probe_lock = threading.Lock()
        self._template_lock = threading.Lock()

    # ------------------------------------------------------------------ probe

    @property
    def enforced(self) -> bool:
        """Whether disks are size-capped filesystems (after :meth:`probe`; False before)."""
        return bool(self._status and self._status["enforced"])

    def status(self) -> dict[str, Any]:
        """``{"enforced", "mechanism", "reason", "size_override_mb"}`` for ``/health``."""
        if self._status is None:
            return {"enforced": False, "mechanism": None, "reason": "not probed yet", "size_override_mb": self.size_mb}
        return dict(self._status)

    def probe(self) -> dict[str, Any]:
        """Try the whole mechanism once on a small disk (the result is cached; later calls return it)."""
        with self._probe_lock:
            if self._status is None:
                reason = self._probe_reason() if self.enabled else "turned off by the node settings (WARREN_DISK_QUOTA)"
                self._status = {
                    "enforced": reason is None,
                    "mechanism": "ext4 image on a loop device per sandbox" if reason is None else None,
                    "reason": reason,
                    "size_override_mb": self.size_mb,
                }
                if reason is not None and self.enabled:
                    _log.warning("sandbox disk sizes are NOT enforced: %s", reason)
            return dict(self._status)

    def _probe_reason(self) -> str | None:
        """None when a disk can be made, mounted, written and released here; else why not."""
        for tmp in self.templates.glob(".tmp-*") if self.templates.is_dir() else ():
            with contextlib.suppress(OSError):
                tmp.unlink()  # a template image half made by a process that died
        if shutil.which("mkfs.ext4") is None:
            return "mkfs.ext4 is not installed (e2fsprogs)"
        if not Path("/dev/loop-control").exists():
            return "no /dev/loop-control (loop devices are not available)"
        root = self.state_dir / "probe" / "disk"
        try:
            self.release(root)  # left mounted by a process that died while probing
            if root.exists():
                self._remove_probe(root)
            root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            root.mkdir(mode=0o700)
            self._create_enforced(root, MIN_DISK_MB)
            (root / DISK_DIR / "probe").write_bytes(b"ok")
            self.release(root)
            self._remove_probe(root)
        except (OSError, RuntimeFailure) as exc:
            with contextlib.suppress(OSError, RuntimeFailure):
                self.release(root)
                self._remove_probe(root)
            return f"a test disk could not be made: {exc}"
        return None

    @staticmethod
    def _remove_probe(root: Path) -> None:
        if _is_mountpoint(root / DISK_DIR):
            raise RuntimeFailure(f"{root / DISK_DIR} is still mounted")
        remove_tree(root)

    # ------------------------------------------------------------------ per sandbox

    def create(self, root: Path, size_mb: int) -> None:
        """Make ``root/disk`` for a new sandbox: a mounted filesystem of ``size_mb`` MiB (or the node's
        override) when enforced, else a plain directory. ``root`` must exist; on failure anything made
        here is removed again and ``RuntimeFailure`` is raised."""
        if not self.enforced:
            (root / DISK_DIR).mkdir()
            return
        self._create_enforced(root, self.size_mb or size_mb)

    def _create_enforced(self, root: Path, size_mb: int) -> None:
        size_mb = min(max(int(size_mb), MIN_DISK_MB), MAX_DISK_MB)
        template = self._template(size_mb)
        image = root / DISK_IMAGE
        try:
            _sparse_copy(template, image)
            (root / DISK_DIR).mkdir()
            self.attach(root)
        except BaseException:
            with contextlib.suppress(OSError):
                (root / DISK_DIR).rmdir()
            with contextlib.suppress(OSError):
                image.unlink()
            raise

    def attach(self, root: Path) -> None:
        """Mount ``root/disk.img`` at ``root/disk`` unless it is mounted already (a restart after a host
        reboot). No image (quotas off when it was made): nothing to do."""
        image, target = root / DISK_IMAGE, root / DISK_DIR
        if not image.is_file() or _is_mountpoint(target):
            return
        target.mkdir(exist_ok=True)
        image_fd = os.open(image, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            dev_fd, dev = _configure_loop(image_fd)
        finally:
            os.close(image_fd)
        try:  # the device detaches itself at its last close: ours if mount fails, the mount's otherwise
            flags = ctypes.c_ulong(_MS_NOSUID | _MS_NODEV)
            if _libc().mount(os.fsencode(dev), os.fsencode(target), b"ext4", flags, MOUNT_DATA) != 0:
                err = ctypes.get_errno()
                raise RuntimeFailure(f"mounting the sandbox disk {image} at {target} failed: {os.strerror(err)}")
        finally:
            os.close(dev_fd)

    def is_attached(self, root: Path) -> bool:
        return _is_mountpoint(root / DISK_DIR)

    def release(self, root: Path) -> None:
        """Unmount ``root/disk`` (lazily if busy) and wait until its loop device has detached itself (the
        kernel does that just after the unmount). The image stays until the sandbox dir is removed. Not
        mounted is fine."""
        target = os.fsencode(root / DISK_DIR)
        if _libc().umount2(target, 0) == 0:
            self._wait_detached(root / DISK_IMAGE)
            return
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return
        if err == errno.EBUSY and _libc().umount2(target, _MNT_DETACH) == 0:
            return  # detaches when its last user goes
        err = ctypes.get_errno() or err
        raise RuntimeFailure(f"unmounting the sandbox disk {root / DISK_DIR} failed: {os.strerror(err)}")

    @staticmethod
    def _wait_detached(image: Path) -> None:
        deadline = time.monotonic() + DETACH_WAIT_S
        while loop_devices_backed_by(image, exact=True):
            if time.monotonic() >= deadline:
                _log.warning("the loop device of %s is still bound %.0fs after its unmount", image, DETACH_WAIT_S)
                return
            time.sleep(0.005)

    def usage(self, root: Path) -> tuple[int, int] | None:
        """(bytes used in the filesystem, the disk's size) of a mounted disk; None when it is not one. The
        filesystem itself keeps ~7% of the size (journal, inode tables), so ``df`` inside shows less."""
        target = root / DISK_DIR
        if not _is_mountpoint(target):
            return None
        st = os.statvfs(target)
        return (st.f_blocks - st.f_bfree) * st.f_frsize, os.stat(root / DISK_IMAGE).st_size

    # ------------------------------------------------------------------ template images

    def _template(self, size_mb: int) -> Path:
        """The formatted image of ``size_mb`` MiB, made once (mkfs into a temp file, then a rename)."""
        path = self.templates / f"{TEMPLATE_VERSION}-{size_mb}M.img"
        if path.is_file():
            return path
        with self._template_lock:
            if path.is_file():
                return path
            self.templates.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.templates / f".tmp-{secrets.token_hex(6)}-{path.name}"
            try:
                with open(tmp, "wb", opener=lambda p, f: os.open(p, f, 0o600)) as fh:
                    fh.truncate(size_mb * 1024 * 1024)
                subprocess.run(["mkfs.ext4", *MKFS_ARGS, str(tmp)], check=True, capture_output=True,
                               timeout=MKFS_TIMEOUT)  # fmt: skip
                _fsync(tmp)  # every sandbox of this size starts from it: it must survive a host crash whole
                os.replace(tmp, path)
                fsync_dir(self.templates)
            except subprocess.CalledProcessError as exc:
                raise RuntimeFailure(f"mkfs.ext4 of a {size_mb} MiB sandbox disk failed: "
                                     f"{exc.stderr.decode(errors='replace').strip()[-300:]}") from exc  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                raise RuntimeFailure(f"mkfs.ext4 of a {size_mb} MiB disk took over {MKFS_TIMEOUT:.0f}s") from exc
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            return path


def _sparse_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to the new file ``dst``, only its data extents (holes stay holes)."""
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            size = os.fstat(fin).st_size
            os.ftruncate(fout, size)
            offset = 0
            while offset < size:
                try:
                    start = os.lseek(fin, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:
                        break  # only a hole is left
                    raise
                end = os.lseek(fin, start, os.SEEK_HOLE)
                pos = start
                while pos < end:
                    n = os.copy_file_range(fin, fout, end - pos, pos, pos)
                    if n == 0:
                        raise RuntimeFailure(f"{src} shrank while being copied")
                    pos += n
                offset = end
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_loop(number: int) -> int:
    """Open ``/dev/loopN``; make the node first when ``/dev`` is not a devtmpfs (a container's)."""
    dev = f"/dev/loop{number}"
    try:
        return os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        major, minor = (int(x) for x in Path(f"/sys/block/loop{number}/dev").read_text().split(":"))
        with contextlib.suppress(FileExistsError):
            os.mknod(dev, stat.S_IFBLK | 0o600, os.makedev(major, minor))
        return os.open(dev, os.O_RDWR | os.O_CLOEXEC)


def _configure_loop(image_fd: int) -> tuple[int, str]:
    """A free loop device bound to ``image_fd`` (autoclear, direct I/O); returns (its open fd, its path)."""
    config = bytearray(_LOOP_CONFIG.size)
    struct.pack_into("=II", config, 0, image_fd, 4096)
    struct.pack_into("=I", config, _LO_FLAGS_OFFSET, _LO_FLAGS_AUTOCLEAR | _LO_FLAGS_DIRECT_IO)
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(_CONFIGURE_ATTEMPTS):
            number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            dev = f"/dev/loop{number}"
            fd = _open_loop(number)
            try:
                fcntl.ioctl(fd, _LOOP_CONFIGURE, bytes(config))
            except OSError as exc:
                os.close(fd)
                if exc.errno == errno.EBUSY:
                    continue  # another thread or process took it first
                raise RuntimeFailure(f"configuring {dev} for a sandbox disk failed: {exc.strerror}") from exc
            return fd, dev
    finally:
        os.close(ctl)
    raise RuntimeFailure(f"no free loop device after {_CONFIGURE_ATTEMPTS} attempts")
