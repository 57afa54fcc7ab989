"""Run the benchmark as the child of a prompt reaper, as a node runs under tini or systemd.

``runsc`` leaves its sandbox processes to whoever reaps orphans, and ``runsc delete`` of a checkpointed
gVisor sandbox waits until that process is reaped. On hosts whose PID 1 reaps promptly (systemd, the
container image's tini, a Kubernetes node with ``hostPID``) that wait is nothing; this machine's PID 1
reaps about every 2 s, which would put an artefact of the machine into every gVisor resume that follows
a pause, and into the bare ``runsc delete`` floor beside it. So ``python -m bench`` re-runs itself under
this process: ``PR_SET_CHILD_SUBREAPER``, forward SIGINT/SIGTERM, reap every child as it exits, and exit
with the benchmark's status. Orphans of the benchmark *and* of the nodes it starts come here (the
nearest subreaper ancestor), so the bare verbs and warren are measured under the same reaper.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_CHILD_SUBREAPER = 36
ENV = "WARREN_BENCH_REAPED"


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"bench.subreaper: prctl failed (errno {ctypes.get_errno()}); running without it", file=sys.stderr)
        os.execvp(argv[0], argv)
    child = os.fork()
    if child == 0:
        os.execvp(argv[0], argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    status = 1
    while True:
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        except InterruptedError:
            continue
        if pid == child:
            status = os.waitstatus_to_exitcode(raw)
            status = 128 - status if status < 0 else status
            return status  # orphans still running go on to PID 1


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    sys.exit(main(args))
