"""Escape probes, run as root INSIDE a sandbox (python3 of the template, stdlib only).

Each probe tries one thing a contained root must not be able to do and prints one JSON object
``{probe: "blocked: <why>" | "ALLOWED: <what happened>"}``. The test on the host reads it.
"""

import ctypes
import errno
import fcntl
import json
import os
import socket
import stat
import struct

libc = ctypes.CDLL(None, use_errno=True)
NR = {  # x86_64
    "add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "userfaultfd": 323, "io_uring_setup": 425,
    "kexec_load": 246, "syslog": 103, "clock_settime": 227, "settimeofday": 164, "unshare": 272,
    "setns": 308, "open_tree": 428, "fsopen": 430,
}
results = {}


def syscall(name, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(NR[name], *args)
    return rc, ctypes.get_errno()


def expect_fail(name, rc, err, what=""):
    if rc < 0 or rc is None:
        results[name] = f"blocked: {errno.errorcode.get(err, err)}"
    else:
        results[name] = f"ALLOWED: {what or 'rc=' + str(rc)}"


def probe(name):
    def wrap(fn):
        try:
            fn()
        except OSError as exc:
            results.setdefault(name, f"blocked: {errno.errorcode.get(exc.errno, exc.errno)} {exc.strerror}")
        except Exception as exc:  # a probe that breaks counts as blocked only if it says why
            results.setdefault(name, f"blocked: {type(exc).__name__}: {exc}")
        return fn
    return wrap


@probe("mknod_block_device")
def _():
    path = "/root/blk"
    os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(8, 0))
    fd = os.open(path, os.O_RDONLY)
    data = os.read(fd, 512)
    results["mknod_block_device"] = f"ALLOWED: read {len(data)} bytes of host disk"


@probe("mknod_char_mem")
def _():
    os.mknod("/root/mem", stat.S_IFCHR | 0o600, os.makedev(1, 1))
    fd = os.open("/root/mem", os.O_RDONLY)
    results["mknod_char_mem"] = f"ALLOWED: opened /dev/mem as fd {fd}"


for fstype, source, data in (("proc", b"proc", None), ("sysfs", b"sysfs", None), ("tmpfs", b"tmpfs", None),
                             ("overlay", b"overlay", b"lowerdir=/usr,upperdir=/root/u,workdir=/root/w")):
    os.makedirs("/root/mnt", exist_ok=True)
    os.makedirs("/root/u", exist_ok=True)
    os.makedirs("/root/w", exist_ok=True)
    rc = libc.mount(source, b"/root/mnt", fstype.encode(), 0, data)
    expect_fail(f"mount_{fstype}", rc, ctypes.get_errno())
    if rc == 0:
        libc.umount2(b"/root/mnt", 2)


@probe("unshare_user")
def _():
    rc, err = syscall("unshare", 0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET
    expect_fail("unshare_user", rc, err, "new user+net namespace")
    if rc == 0:
        # Inside our own new namespaces: gVisor implements them in its sentry; nothing may reach the host.
        results["unshare_user_then_nft"] = nft_newtable()


def nft_newtable():
    """An nftables batch creating table inet wrnprobe; the kernel's answer (0 = created)."""
    def msg(mtype, flags, seq, family, res_id, attrs=b""):
        body = struct.pack("BBH", family, 0, socket.htons(res_id)) + attrs
        return struct.pack("=LHHLL", 16 + len(body), mtype, flags, seq, 0) + body
    name = b"wrnprobe\0"
    attr = struct.pack("=HH", 4 + len(name), 1) + name + b"\0" * ((4 - len(name) % 4) % 4)
    batch = (msg(0x10, 1, 1, 0, 10) + msg((10 << 8) | 0, 1 | 0x400 | 4, 2, 1, 0, attr) + msg(0x11, 1, 3, 0, 10))
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12) as s:  # NETLINK_NETFILTER
        s.settimeout(2)
        s.send(batch)
        reply = s.recv(65536)
    off = 0
    while off + 16 <= len(reply):
        length, mtype = struct.unpack_from("=LH", reply, off)
        if mtype == 2:  # NLMSG_ERROR
            (code,) = struct.unpack_from("=i", reply, off + 16)
            if code != 0:
                return f"blocked: {errno.errorcode.get(-code, code)}"
        off += max(length, 16)
    return "ALLOWED: table created"


@probe("nft_newtable")
def _():
    results["nft_newtable"] = nft_newtable()


@probe("ip_link_down")
def _():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"eth0", 0)
        fcntl.ioctl(s, 0x8914, req)  # SIOCSIFFLAGS: eth0 down
    results["ip_link_down"] = "ALLOWED: eth0 set down"


for name, args in (
    ("add_key", (b"user", b"wrn", b"x", 1, -3)), ("request_key", (b"user", b"wrn", None, -3)),
    ("keyctl", (0, -3, 0)), ("bpf", (0, None, 0)), ("perf_event_open", (None, 0, -1, -1, 0)),
    ("init_module", (None, 0, b"")), ("finit_module", (0, b"", 0)), ("delete_module", (b"overlay", 0)),
    ("userfaultfd", (0,)), ("io_uring_setup", (1, None)), ("kexec_load", (0, 0, None, 0)),
    ("syslog", (3, None, 0)), ("clock_settime", (0, None)), ("settimeofday", (None, None)),
    ("open_tree", (-100, b"/", 1)), ("fsopen", (b"tmpfs", 0)),
):
    buf = ctypes.create_string_buffer(128)
    real = [buf if a is None else a for a in args]
    rc, err = syscall(name, *real)
    if name == "keyctl" and rc >= 0:
        results[name] = "ALLOWED: keyctl answered"
    else:
        expect_fail(name, rc, err)


for path, text in (("/proc/sys/vm/drop_caches", "3"), ("/proc/sys/kernel/hostname", "evil"),
                   ("/proc/sysrq-trigger", "h"), ("/sys/kernel/mm/transparent_hugepage/enabled", "never"),
                   ("/sys/kernel/uevent_helper", "/evil")):
    try:
        with open(path, "w") as f:
            f.write(text)
        results[f"write {path}"] = "ALLOWED: written"
    except OSError as exc:
        results[f"write {path}"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"

for path in ("/dev/kmsg", "/proc/kmsg"):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            data = b""
        results[f"read {path}"] = f"ALLOWED: {len(data)} bytes" if data else "blocked: empty"
    except OSError as exc:
        results[f"read {path}"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"

try:
    keys = open("/proc/keys").read()
    results["/proc/keys"] = f"ALLOWED: {keys[:80]!r}" if keys.strip() else "blocked: empty"
except OSError as exc:
    results["/proc/keys"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"

try:
    pc = os.listdir("/sys/devices/virtual/powercap")
    results["powercap"] = f"ALLOWED: {pc}" if pc else "blocked: empty"
except OSError as exc:
    results["powercap"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"

try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    results["lower_oom_score"] = "ALLOWED: " + open("/proc/self/oom_score_adj").read().strip()
except OSError as exc:
    results["lower_oom_score"] = f"blocked: {errno.errorcode.get(exc.errno, exc.errno)}"

print(json.dumps(results))
