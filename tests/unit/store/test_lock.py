"""The instance lock against real flocks held by real second processes; time is a fake clock.

Backoff values are powers of two so the fake clock's sums are exact and "exactly at the
deadline" can be asserted with ``==``.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from warren.errors import HostError, UnavailableError
from warren.store import lock as lock_mod
from warren.store.lock import InstanceLock, LockTimeoutError, acquire_instance_lock

REPO = Path(__file__).resolve().parents[3]

# A second warren-like process: takes the lock with warren's own code (so it writes its pid),
# says "locked", releases on "release", exits on EOF. Its lock dies with it.
_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from warren.store.lock import acquire_instance_lock
    lock = asyncio.run(acquire_instance_lock(Path(sys.argv[1]), budget_s=0))
    print("locked", flush=True)
    for line in sys.stdin:
        if line.strip() == "release":
            lock.release()
            print("released", flush=True)
    """
)


class Holder:
    """A real process holding the lock at ``path``."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self._read() == "locked"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()
        assert self._read() == "released"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class FakeTime:
    """A clock advanced only by ``sleep``; ``overshoot(n)`` says how late the n-th sleep wakes."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[int], None] = lambda n: None
        self.overshoot: Callable[[int], float] = lambda n: 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        assert delay > 0, "never sleeps for nothing"
        self.sleeps.append(delay)
        self.now += delay + self.overshoot(len(self.sleeps))
        self.on_sleep(len(self.sleeps))


def contents(path: Path) -> str:
    """Blocking read, fine in a test: the file is a few bytes on tmpfs."""
    return path.read_text()


def exists(path: Path) -> bool:
    return path.exists()


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "instance.lock"


@pytest.fixture
def holder(lock_path: Path) -> Iterator[Holder]:
    h = Holder(lock_path)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def attempt_times(monkeypatch: pytest.MonkeyPatch, fake: FakeTime) -> list[float]:
    """The fake clock's time at the start of every flock attempt."""
    times: list[float] = []
    real = lock_mod._try_flock

    def recording(fd: int, path: Path) -> bool:
        times.append(fake.clock())
        return real(fd, path)

    monkeypatch.setattr(lock_mod, "_try_flock", recording)
    return times


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


async def test_uncontended_lock_writes_our_pid_and_is_not_inherited(lock_path: Path) -> None:
    lock = await acquire_instance_lock(lock_path, budget_s=0)
    with lock:
        assert lock.held
        assert contents(lock_path) == f"{os.getpid()}\n"
        assert not os.get_inheritable(lock.fileno())  # runtime children must not pin it
    assert not lock.held


async def test_release_is_idempotent_and_frees_the_lock(lock_path: Path) -> None:
    lock = await acquire_instance_lock(lock_path, budget_s=0)
    lock.release()
    lock.release()
    with pytest.raises(ValueError, match="released"):
        lock.fileno()
    again = await acquire_instance_lock(lock_path, budget_s=0)
    again.release()
    assert contents(lock_path) == "", "release clears the pid but never unlinks the file"


async def test_second_open_in_the_same_process_contends(lock_path: Path, fake: FakeTime) -> None:
    """flock belongs to the open file description, so even this process cannot take it twice."""
    with await acquire_instance_lock(lock_path, budget_s=0):
        with pytest.raises(LockTimeoutError, match=str(os.getpid())):
            await acquire_instance_lock(lock_path, budget_s=1, clock=fake.clock, sleep=fake.sleep)


async def test_holder_released_mid_budget_then_acquire_succeeds(
    lock_path: Path, holder: Holder, fake: FakeTime, attempt_times: list[float]
) -> None:
    fake.on_sleep = lambda n: holder.release() if n == 3 else None
    lock = await acquire_instance_lock(
        lock_path, budget_s=10, clock=fake.clock, sleep=fake.sleep, initial_backoff_s=0.25, max_backoff_s=2
    )
    with lock:
        assert fake.sleeps == [0.25, 0.5, 1.0]
        assert attempt_times == [100.0, 100.25, 100.75, 101.75]
        assert contents(lock_path) == f"{os.getpid()}\n"


async def test_never_released_fails_after_budget_naming_path_holder_and_budget(
    lock_path: Path, holder: Holder, fake: FakeTime
) -> None:
    with pytest.raises(LockTimeoutError) as info:
        await acquire_instance_lock(lock_path, budget_s=30, clock=fake.clock, sleep=fake.sleep)
    err = info.value
    assert isinstance(err, UnavailableError)
    assert err.holder == str(holder.pid)
    assert fake.now == pytest.approx(130.0), "gave up at the deadline"
    message = str(err)
    assert str(lock_path) in message
    assert f"pid {holder.pid}" in message
    assert "30s" in message


async def test_no_attempt_after_deadline_and_last_sleep_lands_on_it(
    lock_path: Path, holder: Holder, fake: FakeTime, attempt_times: list[float]
) -> None:
    deadline = fake.now + 1.0
    with pytest.raises(LockTimeoutError) as info:
        await acquire_instance_lock(
            lock_path, budget_s=1.0, clock=fake.clock, sleep=fake.sleep, initial_backoff_s=0.0625, max_backoff_s=0.25
        )
    # backoff 1/16, 1/8, 1/4, then capped at 1/4; the sixth sleep would end at 101.1875, so it is
    # cut to 1/16 and the final attempt starts exactly at the deadline.
    assert fake.sleeps == [0.0625, 0.125, 0.25, 0.25, 0.25, 0.0625]
    assert attempt_times == [100.0, 100.0625, 100.1875, 100.4375, 100.6875, 100.9375, 101.0]
    assert all(t <= deadline for t in attempt_times)
    assert attempt_times[-1] == deadline
    assert info.value.attempts == len(attempt_times)


async def test_stalled_wakeup_past_deadline_makes_no_further_attempt(
    lock_path: Path, holder: Holder, fake: FakeTime, attempt_times: list[float]
) -> None:
    """A non-final sleep that returns far too late (a blocked loop) ends the retries."""
    fake.overshoot = lambda n: 50.0 if n == 2 else 0.0
    with pytest.raises(LockTimeoutError):
        await acquire_instance_lock(lock_path, budget_s=5, clock=fake.clock, sleep=fake.sleep, initial_backoff_s=1)
    assert attempt_times == [100.0, 101.0]
    assert len(fake.sleeps) == 2


async def test_deadline_aimed_attempt_survives_a_late_timer(
    lock_path: Path, holder: Holder, fake: FakeTime, attempt_times: list[float]
) -> None:
    """Real timers fire a little after their due time; the final attempt must not be lost to that."""
    fake.overshoot = lambda n: 0.001 if n == 2 else 0.0  # the second sleep is the cut one
    fake.on_sleep = lambda n: holder.release() if n == 2 else None
    lock = await acquire_instance_lock(lock_path, budget_s=1.5, clock=fake.clock, sleep=fake.sleep, initial_backoff_s=1)
    lock.release()
    assert fake.sleeps == [1.0, 0.5]
    assert len(attempt_times) == 3


@pytest.mark.parametrize("contended", [True, False])
async def test_zero_budget_makes_exactly_one_attempt(
    lock_path: Path, fake: FakeTime, attempt_times: list[float], contended: bool
) -> None:
    h = Holder(lock_path) if contended else None
    try:
        if contended:
            with pytest.raises(LockTimeoutError):
                await acquire_instance_lock(lock_path, budget_s=0, clock=fake.clock, sleep=fake.sleep)
        else:
            (await acquire_instance_lock(lock_path, budget_s=0, clock=fake.clock, sleep=fake.sleep)).release()
    finally:
        if h is not None:
            h.close()
    assert attempt_times == [100.0]
    assert fake.sleeps == []


async def test_zero_budget_with_the_real_clock_still_tries_once(lock_path: Path) -> None:
    (await acquire_instance_lock(lock_path, budget_s=0)).release()


async def test_killed_holder_frees_the_lock(lock_path: Path, holder: Holder) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.proc.wait(timeout=10)
    lock = await acquire_instance_lock(lock_path, budget_s=0)
    lock.release()


async def test_unknown_holder_when_the_file_names_no_pid(lock_path: Path, fake: FakeTime) -> None:
    os.makedirs(lock_path.parent)
    other = os.open(lock_path, os.O_RDWR | os.O_CREAT)  # a holder that never wrote its pid
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(LockTimeoutError, match="held by pid unknown"):
            await acquire_instance_lock(lock_path, budget_s=0, clock=fake.clock, sleep=fake.sleep)
    finally:
        os.close(other)


async def test_contender_does_not_wipe_the_holders_pid(lock_path: Path, holder: Holder, fake: FakeTime) -> None:
    with pytest.raises(LockTimeoutError):
        await acquire_instance_lock(lock_path, budget_s=0, clock=fake.clock, sleep=fake.sleep)
    assert contents(lock_path) == f"{holder.pid}\n"


async def test_unopenable_path_is_a_host_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(HostError, match="cannot open instance lock"):
        await acquire_instance_lock(tmp_path / "file" / "instance.lock", budget_s=0)


async def test_bad_backoff_arguments_are_rejected(lock_path: Path) -> None:
    with pytest.raises(ValueError):
        await acquire_instance_lock(lock_path, budget_s=-1)
    with pytest.raises(ValueError):
        await acquire_instance_lock(lock_path, initial_backoff_s=2, max_backoff_s=1)
    assert not exists(lock_path), "rejected before touching the disk"


def test_instance_lock_repr_and_context_manager(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "l", os.O_RDWR | os.O_CREAT)
    lock = InstanceLock(tmp_path / "l", fd)
    assert "held=True" in repr(lock)
    with lock:
        pass
    assert "held=False" in repr(lock)


async def test_cancelled_while_waiting_leaks_no_descriptor(lock_path: Path, holder: Holder) -> None:
    before = len(os.listdir("/proc/self/fd"))
    task = asyncio.create_task(acquire_instance_lock(lock_path, budget_s=60, initial_backoff_s=30, max_backoff_s=30))
    await asyncio.sleep(0)  # one step: the first attempt fails and the task starts its 30 s sleep
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(os.listdir("/proc/self/fd")) == before
