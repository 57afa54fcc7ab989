"""Fixtures that run the guest agent as a real subprocess on 127.0.0.1 and talk to it.

The agent runs the way the sandbox launcher runs it (``python -S -E -B -u`` with the repo on
``sys.path``), so a non-stdlib import would fail here too. Its passwd/group files are temporary:
``root`` and ``user`` (uid/gid 65534, i.e. nobody/nogroup, home in a world-readable temp dir, member
of an extra group 4242).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
LAUNCHER = "import sys; sys.path.insert(0, sys.argv.pop(1)); from warren.guest.main import main; main()"
USER_UID = 65534
EXTRA_GID = 4242
START_TIMEOUT_S = 20.0

if os.geteuid() != 0:  # processes run as other users: the agent must be root
    pytest.skip("the guest agent tests need root", allow_module_level=True)


@dataclass
class AgentProc:
    """A running agent: its URL, the test user's home, and the scratch dir it may use."""

    url: str
    port: int
    home: Path
    root: Path
    proc: subprocess.Popen[bytes]
    log: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")


def _write_accounts(root: Path, home: Path) -> tuple[Path, Path]:
    passwd = root / "passwd"
    group = root / "group"
    passwd.write_text(
        f"# test accounts\nroot:x:0:0:root:/root:/bin/bash\nuser:x:{USER_UID}:{USER_UID}:user:{home}:/bin/bash\n"
    )
    group.write_text(f"root:x:0:\nnogroup:x:{USER_UID}:\nextra:x:{EXTRA_GID}:user\n")
    return passwd, group


def start_agent(extra_env: dict[str, str] | None = None) -> AgentProc:
    root = Path(tempfile.mkdtemp(prefix="warren-guest-"))
    root.chmod(0o755)
    home = root / "home" / "user"
    home.mkdir(parents=True)
    (root / "home").chmod(0o755)
    os.chown(home, USER_UID, USER_UID)
    passwd, group = _write_accounts(root, home)
    log = root / "agent.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARREN_", "PYTHON"))}
    env.update(extra_env or {})
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-S", "-E", "-B", "-u", "-c", LAUNCHER, str(REPO),
                "--host", "127.0.0.1", "--port", "0",
                "--passwd", str(passwd), "--group", str(group), "--log-level", "info",
            ],
            stdout=out,
            stderr=out,
            env=env,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    port = 0
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        for line in text.splitlines():
            if line.startswith("warren-guest listening on "):
                port = int(line.split()[3].rsplit(":", 1)[1])
        if port:
            break
        if proc.poll() is not None:
            raise AssertionError(f"agent exited: {text}")
        time.sleep(0.02)
    else:
        proc.kill()
        raise AssertionError(f"agent did not start: {log.read_text()}")
    return AgentProc(f"http://127.0.0.1:{port}", port, home, root, proc, log, dict(extra_env or {}))


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentProc]:
    """An agent shared by a test module (tests must not set a token or defaults on it)."""
    a = start_agent()
    yield a
    a.stop()
    shutil.rmtree(a.root, ignore_errors=True)


@pytest.fixture
def fresh_agent() -> Iterator[Callable[..., AgentProc]]:
    """A factory of agents private to one test (for /init, tokens, defaults)."""
    started: list[AgentProc] = []

    def make(extra_env: dict[str, str] | None = None) -> AgentProc:
        a = start_agent(extra_env)
        started.append(a)
        return a

    yield make
    for a in started:
        a.stop()
        shutil.rmtree(a.root, ignore_errors=True)
