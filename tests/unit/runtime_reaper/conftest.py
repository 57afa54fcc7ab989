"""Fixtures for the pid-identity tests: a fake /proc tree, and real short-lived processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

IGNORE_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
    "time.sleep(120)\n"
)


class FakeProc:
    """A /proc look-alike: ``<root>/<pid>/stat`` and ``<root>/<pid>/cgroup``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, *, start_time: int, cgroups: list[str], state: str = "S",
            comm: str = "sleep") -> None:
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        # Fields 3.. after "(comm)": state is field 3, starttime field 22.
        rest = [state] + ["0"] * 18 + [str(start_time)] + ["0"] * 30
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
        (d / "cgroup").write_text("".join(f"{i}:ctl{i}:{c}\n" for i, c in enumerate(cgroups)))

    def mirror(self, pid: int, cgroups: list[str]) -> None:
        """A fake entry for a real process: its real stat (start time), a made-up cgroup file."""
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "stat").write_text(Path(f"/proc/{pid}/stat").read_text())
        self.set_cgroups(pid, cgroups)

    def set_cgroups(self, pid: int, cgroups: list[str]) -> None:
        (self.root / str(pid) / "cgroup").write_text("".join(f"{i}:ctl{i}:{c}\n" for i, c in enumerate(cgroups)))

    def set_start_time(self, pid: int, start_time: int) -> None:
        path = self.root / str(pid) / "stat"
        head, _, tail = path.read_text().rpartition(")")
        fields = tail.split()
        fields[19] = str(start_time)
        path.write_text(f"{head}) {' '.join(fields)}\n")

    def remove(self, pid: int) -> None:
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def fake_proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start real processes (``sleep`` or one that ignores SIGTERM); all are killed and reaped after."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*, ignore_term: bool = False) -> subprocess.Popen[bytes]:
        if ignore_term:
            proc = subprocess.Popen([sys.executable, "-c", IGNORE_TERM], stdout=subprocess.PIPE)
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        else:
            proc = subprocess.Popen(["sleep", "120"])
            time.sleep(0.05)  # let it exec
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
