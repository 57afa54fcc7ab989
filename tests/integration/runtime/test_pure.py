"""Pure parts of the runtime layer (no root, no processes): pool, spec, records, parsing."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from warren.errors import InvalidRequestError, UnavailableError
from warren.runtime.base import Resources, RuntimeKind
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.net.manager import SandboxNetwork, host_nameservers
from warren.runtime.net.nat import NatRules
from warren.runtime.net.pool import AddressPool
from warren.runtime.oci.guestfiles import ensure_rootfs_tmp, write_boot_id
from warren.runtime.oci.layout import SandboxPaths, SandboxRecord, validate_sandbox_id, write_etc_files
from warren.runtime.oci.spec import BOOT_ID, DEFAULT_CAPABILITIES, HARDENED_CAPABILITIES, ConfigInputs, build_config
from warren.runtime.probe import has_cap_sys_resource, is_static_elf
from warren.runtime.userns import UidRange


def test_pool_slots_and_round_robin() -> None:
    pool = AddressPool("10.77.0.0/16")
    assert pool.size == 16384
    a = pool.allocate()
    assert (a.index, a.host_ip, a.guest_ip) == (0, "10.77.0.1", "10.77.0.2")
    assert pool.slot(64).host_ip == "10.77.1.1"
    b = pool.allocate(busy=lambda i: i == 1)
    assert b.index == 2
    pool.release(a.index)
    assert pool.allocate().index == 3  # a just-released slot is not reused first
    assert pool.in_use == 2


def test_pool_exhaustion() -> None:
    pool = AddressPool("10.0.0.0/29")
    pool.allocate()
    pool.allocate()
    with pytest.raises(UnavailableError):
        pool.allocate()


def _inputs(tmp_path: Path, **kw: object) -> ConfigInputs:
    base: dict[str, object] = dict(
        hostname="sbx", rootfs=tmp_path / "rootfs", netns_path=Path("/run/netns/wrn-sbx"),
        agent_bundle=tmp_path / "agent", etc_files={"/etc/hosts": tmp_path / "hosts"},
        cgroups_path="/warren/sbx", resources=Resources(cpu_count=2, memory_mb=256, pids_max=100),
        args=["/.agent/bin/python3"], env={"A": "1"},
    )
    base.update(kw)
    return ConfigInputs(**base)  # type: ignore[arg-type]


def test_config(tmp_path: Path) -> None:
    config = build_config(_inputs(tmp_path))
    proc, linux = config["process"], config["linux"]
    assert proc["capabilities"]["bounding"] == list(HARDENED_CAPABILITIES)
    for cap in ("CAP_SYS_ADMIN", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETFCAP", "CAP_SYS_MODULE"):
        assert cap not in proc["capabilities"]["effective"]
    seccomp = linux["seccomp"]
    assert seccomp["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {n for rule in seccomp["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for n in rule["names"]}
    for refused in ("keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load",
                    "init_module", "finit_module", "clock_settime", "settimeofday", "unshare", "setns", "mount",
                    "io_uring_setup", "syslog"):
        assert refused not in allowed, refused
    assert {"type": "cgroup"} in linux["namespaces"]
    assert "/sys/devices/virtual/powercap" in linux["maskedPaths"]
    assert "uidMappings" not in linux and {"type": "user"} not in linux["namespaces"]
    assert proc["oomScoreAdj"] == -998
    assert "A=1" in proc["env"]
    assert config["hostname"] == "sbx"
    mem = linux["resources"]["memory"]
    assert mem["limit"] == mem["swap"] == 256 * 1024 * 1024
    assert linux["resources"]["cpu"] == {"quota": 200000, "period": 100000}
    assert linux["resources"]["pids"] == {"limit": 100}
    assert {"type": "network", "path": "/run/netns/wrn-sbx"} in linux["namespaces"]
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts["/.agent"]["options"] == ["rbind", "ro", "nosuid", "nodev"]
    assert "newinstance" in mounts["/dev/pts"]["options"]
    assert "/tmp" not in mounts  # the rootfs's own /tmp, on the sandbox's disk
    assert "hooks" not in config
    assert "ro" in mounts["/sys"]["options"]
    assert mounts["/etc/hosts"]["source"] == str(tmp_path / "hosts")
    assert "oomScoreAdj" not in build_config(_inputs(tmp_path, oom_score_adj=None))["process"]


def test_config_tmp_and_boot_id(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    runc = build_config(_inputs(tmp_path, boot_id=boot, mount_binary=Path("/usr/bin/mount")))
    (hook,) = runc["hooks"]["createContainer"]
    assert hook["path"] == "/usr/bin/mount"
    assert hook["args"][-2:] == [str(boot), f"{tmp_path / 'rootfs'}/proc/sys/kernel/random/boot_id"]
    assert "ro,nosuid,nodev,noexec" in hook["args"]
    assert not any(m["destination"] == BOOT_ID for m in runc["mounts"])
    runsc = build_config(_inputs(tmp_path, boot_id=boot, tmp_dir=tmp_path / "rootfs" / "tmp"))
    mounts = {m["destination"]: m for m in runsc["mounts"]}
    assert mounts[BOOT_ID]["source"] == str(boot) and "ro" in mounts[BOOT_ID]["options"]
    assert mounts["/tmp"]["type"] == "bind" and mounts["/tmp"]["source"] == str(tmp_path / "rootfs" / "tmp")
    assert "hooks" not in runsc
    tmpfs = {m["destination"]: m for m in build_config(_inputs(tmp_path, tmp_tmpfs=True))["mounts"]}
    assert tmpfs["/tmp"]["type"] == "tmpfs" and "mode=1777" in tmpfs["/tmp"]["options"]


def test_boot_id_file(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    first = write_boot_id(path, None, fresh=False)  # none yet: made
    assert path.read_text() == first + "\n" and len(first) == 36 and (path.stat().st_mode & 0o777) == 0o444
    assert write_boot_id(path, None, fresh=False) == first  # kept: the same boot goes on
    second = write_boot_id(path, None, fresh=True)
    assert second != first and path.read_text() == second + "\n"


def test_rootfs_tmp(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    made = ensure_rootfs_tmp(rootfs, None)
    assert made == rootfs / "tmp" and (made.stat().st_mode & 0o7777) == 0o1777
    made.chmod(0o755)
    assert ensure_rootfs_tmp(rootfs, None) == made and (made.stat().st_mode & 0o7777) == 0o755  # the image's
    made.rmdir()
    (rootfs / "tmp").symlink_to("/etc")  # the sandbox's own symlink: never followed on the host
    assert ensure_rootfs_tmp(rootfs, None) is None and (rootfs / "tmp").is_symlink()


def test_config_user_namespace(tmp_path: Path) -> None:
    config = build_config(_inputs(tmp_path, uid_range=UidRange(1 << 30)))
    linux = config["linux"]
    assert linux["namespaces"][0] == {"type": "user"}
    assert linux["uidMappings"] == linux["gidMappings"] == [{"containerID": 0, "hostID": 1 << 30, "size": 65536}]
    sys_mount = next(m for m in config["mounts"] if m["destination"] == "/sys")
    assert sys_mount["type"] == "bind" and "ro" in sys_mount["options"]


def test_config_unhardened(tmp_path: Path) -> None:
    """Only for measuring the hardening's cost (WARREN_HARDENING=0): Docker's caps, no filter."""
    config = build_config(_inputs(tmp_path, hardened=False))
    assert config["process"]["capabilities"]["bounding"] == list(DEFAULT_CAPABILITIES)
    assert "seccomp" not in config["linux"]


def test_record_round_trip(tmp_path: Path) -> None:
    net = SandboxNetwork("sbx", "wrn-sbx", "wv3", "10.77.0.13", "10.77.0.14", 30, 3, False)
    record = SandboxRecord("sbx", RuntimeKind.GVISOR, Resources(memory_mb=1024), net)
    record.save(tmp_path / "sandbox.json")
    assert SandboxRecord.from_json((tmp_path / "sandbox.json").read_text()) == record


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "-lead", "x" * 61, "with space", "dot.ted"])
def test_invalid_ids(bad: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_sandbox_id(bad)


def test_etc_files(tmp_path: Path) -> None:
    files = write_etc_files(tmp_path / "etc", "sbx", "10.77.0.2", ("10.255.255.53",))
    assert files["/etc/hostname"].read_text() == "sbx\n"
    assert "10.77.0.2\tsbx" in files["/etc/hosts"].read_text()
    assert files["/etc/resolv.conf"].read_text() == "nameserver 10.255.255.53\n"


def test_host_nameservers_skip_loopback(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("# c\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 10.1.2.3\nsearch x\n")
    assert host_nameservers(conf) == ["10.1.2.3"]
    assert host_nameservers(tmp_path / "missing") == []


def test_nft_script_only_touches_our_table() -> None:
    rules = NatRules("warren", ipaddress.IPv4Network("10.77.0.0/16"), "wv")
    script = rules._script(["10.255.255.53"], ["10.0.0.0/8"])
    for line in script.splitlines():
        assert " inet warren " in f" {line} ", line
    assert 'ip saddr 10.77.0.0/16 oifname != "wv*" masquerade' in script
    assert 'oifname "wv*" drop' in script


def test_cgroup_detection(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        "31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
        "32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n"
        "33 25 0:29 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
    )
    hier = CgroupHierarchies.detect(mountinfo)
    assert hier.v1["cpuacct"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert hier.v2 == Path("/sys/fs/cgroup/unified")
    assert "xattr" not in hier.v1
    assert len(hier.directories("warren/x")) == 4


def test_cgroup_v2_usage(tmp_path: Path) -> None:
    cg = tmp_path / "warren" / "x"
    cg.mkdir(parents=True)
    (cg / "memory.current").write_text("1000000\n")
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.stat").write_text("anon 600000\nfile 400000\ninactive_file 100000\n")
    (cg / "cpu.stat").write_text("usage_usec 1500\nuser_usec 1000\n")
    usage = CgroupHierarchies({}, tmp_path).usage("warren/x")
    assert usage is not None
    assert (usage.memory_usage, usage.memory_cache, usage.memory_limit, usage.cpu_usage_ns) == (
        900000, 400000, None, 1_500_000
    )
    assert CgroupHierarchies({}, tmp_path).usage("warren/missing") is None


def test_elf_and_capability_probes(tmp_path: Path) -> None:
    assert not is_static_elf(Path("/bin/sh")) or Path("/bin/sh").resolve().name == "busybox"
    (tmp_path / "notelf").write_text("#!/bin/sh\n")
    assert not is_static_elf(tmp_path / "notelf")
    status = tmp_path / "status"
    status.write_text("CapEff:\t000001ffffffffff\n")
    assert has_cap_sys_resource(status)
    status.write_text("CapEff:\t000001fffeffffff\n")
    assert not has_cap_sys_resource(status)


def test_paths_of_a_sandbox_made_before_per_sandbox_disks(tmp_path: Path) -> None:
    """A sandbox paused by an older node keeps upper/ and work/ directly in its dir; it must still resume."""
    new = SandboxPaths(tmp_path / "new")
    assert new.upper == tmp_path / "new" / "disk" / "upper"
    (tmp_path / "old" / "upper").mkdir(parents=True)
    old = SandboxPaths(tmp_path / "old")
    assert old.upper == tmp_path / "old" / "upper" and old.work == tmp_path / "old" / "work"
