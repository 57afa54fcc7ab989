"""The initContainer scripts under dash: load-modules against a fake host, seed-assets on real trees."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from .shell import Result, needs_dash, run_script

pytestmark = needs_dash

KERNEL = "6.1.0-test-amd64"

FAKE_MODPROBE = """#!/bin/sh
# Loads "$1" into the fake /proc/modules if it is in $FAKE_AVAILABLE, like modprobe would.
m=$(printf '%s' "$1" | tr '-' '_')
for a in $FAKE_AVAILABLE; do
    if [ "$a" = "$m" ]; then echo "$m 16384 0 - Live 0x0" >> "$PROC_MODULES"; exit 0; fi
done
echo "modprobe: FATAL: Module $1 not found in directory /lib/modules/$KERNEL_RELEASE" >&2
exit 1
"""

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
"""


class FakeHost:
    def __init__(self, root: Path) -> None:
        self.root = root / "host"
        self.proc_modules = root / "proc-modules"
        self.sys_module = root / "sys-module"
        self.modprobe = root / "fake-modprobe"
        self.modules_dir = self.root / "lib" / "modules" / KERNEL
        self.modules_dir.mkdir(parents=True)
        self.sys_module.mkdir()
        self.proc_modules.write_text("nf_tables 360448 0 - Live 0x0\nnf_conntrack 192512 1 nf_tables, Live 0x0\n")
        (self.modules_dir / "modules.builtin").write_text(
            "kernel/fs/overlayfs/overlay.ko\nkernel/drivers/net/veth.ko\nkernel/net/netfilter/nf-nat.ko\n"
        )
        (self.sys_module / "tun").mkdir()
        self.modprobe.write_text(FAKE_MODPROBE)

    def env(self, modules: str | None, available: str = "", **extra: str) -> dict[str, str]:
        env = {
            "HOST_ROOT": str(self.root),
            "KERNEL_RELEASE": KERNEL,
            "PROC_MODULES": str(self.proc_modules),
            "SYS_MODULE": str(self.sys_module),
            "MODPROBE": f"sh {self.modprobe}",
            "FAKE_AVAILABLE": available,
        }
        if modules is not None:
            env["WARREN_MODULES"] = modules
        env.update(extra)
        return env


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def test_modules_loaded_built_in_or_loadable_all_count(host: FakeHost) -> None:
    result = run_script("load-modules.sh", host.env("overlay veth tun nf_tables nf_nat nft-masq", "nft_masq"))
    assert result.returncode == 0, result.output
    assert result.lines("overlay: built in")
    assert result.lines("veth: built in")
    assert result.lines("nf_nat: built in"), "hyphens in modules.builtin are normalised"
    assert result.lines("tun: built in (/sys/module)")
    assert result.lines("nf_tables: loaded")
    assert result.lines("nft_masq: loaded now")
    assert result.lines("host modules now loaded: ")[0].split(": ", 2)[2].split() == [
        "nf_conntrack",
        "nf_tables",
        "nft_masq",
    ]
    assert result.lines("all required modules present on kernel " + KERNEL)


def test_missing_module_fails_naming_it(host: FakeHost) -> None:
    result = run_script("load-modules.sh", host.env("overlay nft_chain_nat nft_masq", "nft_masq"))
    assert result.returncode == 1
    assert result.lines("nft_chain_nat: MISSING (modprobe: modprobe: FATAL: Module nft_chain_nat not found")
    errors = result.lines("error:")
    assert errors and f"kernel {KERNEL} lacks module(s): nft_chain_nat." in errors[0], result.output
    assert "nft_masq" not in errors[0]


def test_default_list_covers_what_sandboxes_need(host: FakeHost) -> None:
    everything = "overlay veth tun nf_tables nf_conntrack nf_nat nft_chain_nat nft_masq nft_ct nft_fib_inet loop"
    result = run_script("load-modules.sh", host.env(None, everything))
    assert result.returncode == 0, result.output
    for module in ("overlay", "veth", "tun", "nf_tables", "nft_chain_nat", "nft_masq", "nft_ct", "nft_fib_inet",
                   "loop"):
        assert result.lines(f"{module}: "), module


def test_builtin_list_under_usr_lib_modules_is_found(host: FakeHost) -> None:
    usr = host.root / "usr" / "lib" / "modules" / KERNEL
    usr.mkdir(parents=True)
    (host.modules_dir / "modules.builtin").rename(usr / "modules.builtin")
    host.modules_dir.rmdir()
    result = run_script("load-modules.sh", host.env("overlay"))
    assert result.returncode == 0, result.output
    assert result.lines("overlay: built in")


def test_missing_module_dir_warns_but_still_checks(host: FakeHost) -> None:
    result = run_script("load-modules.sh", host.env("nf_tables", KERNEL_RELEASE="9.9.9"))
    assert result.returncode == 0, result.output
    assert result.lines("warning: no module directory for kernel 9.9.9")


@pytest.mark.parametrize("host_has_modprobe", [True, False])
def test_default_modprobe_uses_the_host_kernels_modules(
    host: FakeHost, tmp_path: Path, host_has_modprobe: bool
) -> None:
    """The host's modprobe via chroot when it has one; else ours, pointed at the host's tree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("chroot", "modprobe"):
        (bin_dir / tool).write_text(RECORDER)
        (bin_dir / tool).chmod(0o755)
    if host_has_modprobe:
        (host.root / "sbin").mkdir()
        (host.root / "sbin" / "modprobe").write_text("")
        (host.root / "sbin" / "modprobe").chmod(0o755)
    env = host.env("nft_ct", MODPROBE="", CALLS=str(calls), PATH=f"{bin_dir}:{os.environ['PATH']}")
    result = run_script("load-modules.sh", env)
    assert result.returncode == 1, "the recorder loads nothing"
    expected = f"chroot {host.root} modprobe nft_ct" if host_has_modprobe else f"modprobe -d {host.root} nft_ct"
    assert calls.read_text().splitlines() == [expected]


# --- seed-assets -----------------------------------------------------------------------------


def make_assets(src: Path) -> None:
    files = {
        "agent-abc/bin/python": "python",
        "agent-abc/lib/libpython.so": "lib",
        "templates/.lock": "",
        "templates/busybox/template.json": '{"name": "busybox"}',
        "templates/busybox/rootfs/bin/busybox": "bb",
        "templates/base/template.json": '{"name": "base"}',
        "templates/base/rootfs/etc/os-release": "debian",
    }
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (src / "agent-abc/bin/python").chmod(0o755)
    (src / "templates/busybox/rootfs/bin/sh").symlink_to("busybox")


def tree(root: Path) -> dict[str, str]:
    """Every entry under root: file content, symlink target, or "dir", with the mode."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            out[rel] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = f"dir {mode:o}"
        else:
            out[rel] = f"{path.read_text()} {mode:o}"
    return out


def seed(src: Path, dst: Path, **extra: str) -> Result:
    return run_script("seed-assets.sh", {"ASSETS_SRC": str(src), "ASSETS_DST": str(dst), **extra})


def test_seeds_an_empty_node_with_everything(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "state" / "assets"
    make_assets(src)
    result = seed(src, dst)
    assert result.returncode == 0, result.output
    assert tree(dst) == tree(src)
    assert result.lines(f"seeded {dst}/agent-abc")
    assert result.lines(f"seeded {dst}/templates")
    assert result.lines("done:")


def test_never_overwrites_and_fills_in_only_what_is_missing(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_assets(src)
    (dst / "templates" / "busybox").mkdir(parents=True)
    (dst / "templates" / "busybox" / "template.json").write_text("rebuilt on the node")
    (dst / "node-only").write_text("keep me")
    result = seed(src, dst)
    assert result.returncode == 0, result.output
    assert (dst / "templates/busybox/template.json").read_text() == "rebuilt on the node"
    assert (dst / "templates/busybox/rootfs/bin/busybox").read_text() == "bb", "merged into the existing dir"
    assert (dst / "templates/base/rootfs/etc/os-release").read_text() == "debian"
    assert (dst / "node-only").read_text() == "keep me"
    assert result.lines(f"kept {dst}/templates/busybox/template.json")
    assert result.lines(f"seeded {dst}/templates/base")


def test_second_run_changes_nothing(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_assets(src)
    assert seed(src, dst).returncode == 0
    before = tree(dst)
    again = seed(src, dst)
    assert again.returncode == 0
    assert tree(dst) == before
    assert not again.lines("seeded")


def test_leftovers_of_a_killed_copy_are_replaced(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_assets(src)
    stale = dst / "templates" / ".warren-seed-tmp.base"
    (stale / "rootfs").mkdir(parents=True)
    (stale / "rootfs" / "half").write_text("half-copied")
    result = seed(src, dst)
    assert result.returncode == 0, result.output
    assert not stale.exists()
    assert tree(dst / "templates" / "base") == tree(src / "templates" / "base")


def test_failed_copy_fails_the_pod_and_leaves_no_partial_entry(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_assets(src)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cp").write_text('#!/bin/sh\nmkdir -p "$3"; echo "cp: disk full" >&2; exit 1\n')
    (bin_dir / "cp").chmod(0o755)
    result = seed(src, dst, PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert result.returncode == 1
    assert result.lines("error: cannot copy")
    assert result.lines("error: seeding")
    assert list(dst.iterdir()) == []


def test_image_without_assets_is_not_an_error(tmp_path: Path) -> None:
    result = seed(tmp_path / "absent", tmp_path / "dst")
    assert result.returncode == 0
    assert result.lines("nothing to seed")
