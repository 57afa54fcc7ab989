"""The seccomp filter of every runc sandbox: a default-deny allowlist, at least as strict as the default
profiles container engines ship.

Refused (EPERM, the default action): the keyring (``add_key``, ``keyctl``, ``request_key``), ``bpf``,
``perf_event_open``, ``userfaultfd``, ``io_uring_*``, kexec, module loading, clock and time setting,
mount and the new mount API, ``unshare``/``setns`` and ``clone`` with namespace flags (``clone3`` answers
ENOSYS so that libc falls back to ``clone``, whose flags a filter can read), ``syslog``, swap, reboot,
``ptrace``-style access to other processes' memory beyond ``ptrace`` itself, and everything not listed.
runc resolves names with libseccomp and skips the ones the architecture does not have.
"""

from __future__ import annotations

import errno
import platform
from typing import Any

__all__ = ["ALLOWED_SYSCALLS", "CLONE_NAMESPACE_FLAGS", "seccomp_profile"]

ALLOWED_SYSCALLS = """
accept accept4 access alarm arch_prctl bind brk cachestat capget capset chdir chmod chown chown32 chroot
clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep clock_nanosleep_time64 close
close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old
epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat
faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32
fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64
fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64 futex_wait
futex_waitv futex_wake futimesat get_mempolicy get_robust_list get_thread_area getcpu getcwd getdents
getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer getpeername
getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid getresuid32 getrlimit
getrusage getsid getsockname getsockopt gettid gettimeofday getuid getuid32 getxattr inotify_add_watch
inotify_init inotify_init1 inotify_rm_watch io_cancel io_destroy io_getevents io_pgetevents
io_pgetevents_time64 io_setup io_submit ioctl ioprio_get ioprio_set ipc kill landlock_add_rule
landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen listxattr
llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise map_shadow_stack mbind membarrier
memfd_create mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 modify_ldt mprotect
mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64
mq_unlink mremap mseal msgctl msgget msgrcv msgsnd msync munlock munlockall munmap nanosleep newfstatat
_newselect open openat openat2 pause personality pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc
pkey_free pkey_mprotect poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease
pselect6 pselect6_time64 ptrace pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv
recvfrom recvmmsg recvmmsg_time64 recvmsg remap_file_pages removexattr rename renameat renameat2
restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn
rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_get_priority_max
sched_get_priority_min sched_getaffinity sched_getattr sched_getparam sched_getscheduler
sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr sched_setparam
sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop semtimedop_time64 send
sendfile sendfile64 sendmmsg sendmsg sendto set_mempolicy set_robust_list set_thread_area set_tid_address
setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer setpgid
setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32
setrlimit setsid setsockopt setuid setuid32 setxattr shmat shmctl shmdt shmget shutdown sigaltstack
signalfd signalfd4 sigprocmask sigreturn socket socketcall socketpair splice stat stat64 statfs statfs64
statx symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete
timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate truncate64
ugetrlimit umask uname unlink unlinkat utime utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid
waitpid write writev
""".split()
"""Allowed without conditions: what a dev sandbox (shells, compilers, package managers, Python, Node,
sudo, strace) uses. ``mknod`` stays allowed for fifos and sockets: without CAP_MKNOD, and in a user
namespace, the kernel refuses device nodes anyway."""

CLONE_NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: ``clone`` with any is refused."""

_NATIVE_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}
"""The filter covers the host's native ABI only: a syscall through another one (int 0x80 on x86_64, the
32-bit compat entry points with their own history of bugs) kills the process. It is also what keeps the
filter cheap: runc builds it at every start, and each extra architecture costs about 5-10 ms there
(bench/hardening.py: 5 architectures 86 ms per ``runc run`` vs 52 ms for one)."""


def _arches() -> list[str]:
    machine = platform.machine()
    return [_NATIVE_ARCH[machine]] if machine in _NATIVE_ARCH else []


def seccomp_profile() -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object."""
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": _arches(),
        "syscalls": [
            {"names": ALLOWED_SYSCALLS, "action": "SCMP_ACT_ALLOW"},
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
            # libc tries clone3 first and falls back to clone on ENOSYS; clone3's flags live in memory a
            # filter cannot read, so it is refused with ENOSYS rather than EPERM.
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        ],
    }
