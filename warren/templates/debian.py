"""The ``base`` built-in template: a minimal Debian bookworm with bash, coreutils, procps, python3.

Built with ``debootstrap --variant=minbase`` from the host's own Debian mirror (so a host behind an
apt proxy or a local mirror works offline from the rest of the internet), in 30-60 s.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from warren.errors import HostError
from warren.templates._fs import run

SUITE = "bookworm"
"""The base template's release, fixed: it does not follow the host's (which may be newer)."""

DEFAULT_MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("bash", "coreutils", "procps", "python3", "ca-certificates", "sudo")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
"""Copied into the rootfs so TLS through the host's intercepting proxy (PyPI) verifies."""

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))

DEBOOTSTRAP_TIMEOUT_S = 1800
"""A slow mirror can take minutes; past half an hour something is stuck, not slow."""

_USABLE_SCHEMES = ("http", "https", "file")


def build_base_rootfs(dest: Path, *, mirror: str | None = None) -> None:
    """Debootstrap the base rootfs into ``dest`` (which must not exist or be empty). Needs root.

    After debootstrap: the host's CA bundle replaces the rootfs's, ``user`` (uid/gid 1000, home
    ``/home/user``, shell ``/bin/bash``, ``sudo`` without a password as in E2B's base image) is
    added, and apt's caches and lists are removed.
    """
    if os.geteuid() != 0:
        raise HostError("building the base template needs root (debootstrap, chroot)")
    source = mirror or host_debian_mirror()
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        SUITE,
        str(dest),
        source,
    ]
    try:
        run(argv, timeout=DEBOOTSTRAP_TIMEOUT_S, env=_tool_env())
    except HostError as exc:
        raise HostError(f"{exc}\n{_debootstrap_log_tail(dest)}".rstrip()) from exc
    _finish_base_rootfs(dest)


def _finish_base_rootfs(dest: Path) -> None:
    try:
        if HOST_CA_BUNDLE.is_file():
            target = dest / "etc/ssl/certs/ca-certificates.crt"
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink():
                target.unlink()
            shutil.copyfile(HOST_CA_BUNDLE, target)
            os.chmod(target, 0o644)
        (dest / "etc/hostname").write_text("sandbox\n")
    except OSError as exc:
        raise HostError(f"cannot finish the base rootfs in {dest}: {exc}") from exc
    run(
        [
            "chroot",
            dest,
            "useradd",
            "--create-home",
            "--uid",
            "1000",
            "--user-group",
            "--shell",
            "/bin/bash",
            "--comment",
            "user",
            "user",
        ],
        timeout=60,
        env=_tool_env(),
    )
    sudoers = dest / "etc/sudoers.d/user"
    try:
        sudoers.write_text("user ALL=(ALL:ALL) NOPASSWD: ALL\n")
        os.chmod(sudoers, 0o440)
    except OSError as exc:
        raise HostError(f"cannot write {sudoers}: {exc}") from exc
    clean_apt(dest)


def clean_apt(dest: Path) -> None:
    """Drop downloaded .debs, apt's binary caches and package lists (``apt-get update`` restores them)."""
    patterns = (
        ("var/cache/apt/archives", "*.deb"),
        ("var/cache/apt", "*.bin"),
        ("var/lib/apt/lists", "*_*"),
    )
    try:
        for rel, pattern in patterns:
            for path in (dest / rel).glob(pattern):
                if path.is_file() or path.is_symlink():
                    path.unlink()
    except OSError as exc:
        raise HostError(f"cannot clean apt caches in {dest}: {exc}") from exc


def host_debian_mirror(sources: Iterable[Path] = APT_SOURCES) -> str:
    """The first Debian archive (not security, not third-party) the host's apt uses, else the default."""
    for uri in _deb_uris(sources):
        if is_debian_archive(uri):
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def is_debian_archive(uri: str) -> bool:
    """True for a main Debian archive URI such as ``http://deb.debian.org/debian``."""
    parts = urlsplit(uri)
    if parts.scheme not in _USABLE_SCHEMES:
        return False
    segments = [s for s in parts.path.split("/") if s]
    return "debian" in segments and not any("security" in s for s in segments)


def _deb_uris(sources: Iterable[Path]) -> Iterator[str]:
    for source in sources:
        if source.is_dir():
            files = sorted(p for p in source.iterdir() if p.suffix in (".list", ".sources"))
        else:
            files = [source]
        for path in files:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if path.suffix == ".sources":
                yield from parse_deb822_uris(text)
            else:
                yield from parse_one_line_uris(text)


def parse_one_line_uris(text: str) -> Iterator[str]:
    """URIs of the ``deb`` lines of a one-line-style ``sources.list``."""
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if words:
            yield words[0]


def parse_deb822_uris(text: str) -> Iterator[str]:
    """URIs of the enabled ``Types: deb`` stanzas of a deb822 ``.sources`` file."""
    for stanza in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for raw in stanza.splitlines():
            if raw.startswith("#"):
                continue
            if raw[:1] in (" ", "\t") and key:
                fields[key] += " " + raw.strip()
            elif ":" in raw:
                key, _, value = raw.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        yield from fields.get("uris", "").split()


def _tool_env() -> dict[str, str]:
    """The environment for debootstrap and chroot: sbin on PATH (not a given under sudo or cron)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return env


def _debootstrap_log_tail(dest: Path, lines: int = 20) -> str:
    try:
        log = (dest / "debootstrap/debootstrap.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(log.splitlines()[-lines:])
