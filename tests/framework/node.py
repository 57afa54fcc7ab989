"""A real warren node in a subprocess (``warren serve``), for end-to-end tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

DEFAULT_CACHE = Path(os.environ.get("WARREN_CACHE_DIR", "/var/cache/warren"))
DOMAIN_HOST = "warren.localhost"
"""Domain-mode nodes serve ``<port>-<id>.warren.localhost:<port>``. The SDK's resolver (pyqwest) maps every
``*.localhost`` name to loopback (RFC 6761), so the unmodified SDK needs no /etc/hosts entry; Python's own
resolver (glibc here) does not: tests that reach such names with httpx or websockets patch it
(``tests.framework.tls.loopback_localhost``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def searchable_ancestors(state_dir: Path) -> None:
    """Let other users search (never list) the dirs above a test state dir, as /var/lib is: sandbox roots
    are unprivileged uids that resolve their bundles under it (pytest makes its temp dirs 0700)."""
    for parent in state_dir.absolute().parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod((mode & 0o7777) | 0o001)


@dataclass
class Node:
    state_dir: Path
    port: int
    api_key: str
    runsc: Path | None = None
    cache_dir: Path = DEFAULT_CACHE
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=lambda: {"WARREN_WARM_POOL": "0"})
    """The warm pool is off by default: most tests count or leak-check sandboxes."""
    domain_ca: Path | None = None
    """Domain mode (``--domain warren.localhost:<port>``) when set: the node CA directory (``ca.pem``,
    ``ca-key.pem``) copied into the node's ``tls`` dir, so the node signs its leaf with a CA the test
    process already trusts (``SSL_CERT_FILE`` must be set before the SDK makes its first TLS client)."""
    log_path: Path = field(init=False)
    sdk_url: str | None = None
    """Where the SDK goes (``env()``): a gateway in front of this node, or None for the node itself."""

    def __post_init__(self) -> None:
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}-node.log"

    @property
    def url(self) -> str:
        return f"{'https' if self.domain_ca else 'http'}://127.0.0.1:{self.port}"

    @property
    def domain(self) -> str | None:
        return f"{DOMAIN_HOST}:{self.port}" if self.domain_ca else None

    def env(self) -> dict[str, str]:
        """What the E2B SDK needs to talk to this node: in domain mode no ``E2B_SANDBOX_URL``."""
        if self.domain is not None:
            return {"E2B_API_URL": f"https://api.{self.domain}", "E2B_DOMAIN": self.domain, "E2B_API_KEY": self.api_key}
        url = self.sdk_url or self.url
        return {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": self.api_key}

    def verify(self) -> ssl.SSLContext | bool:
        """How Python clients check this node's certificate (its CA in domain mode)."""
        if self.domain_ca is None:
            return True
        return ssl.create_default_context(cafile=str(self.domain_ca / "ca.pem"))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": self.api_key}, timeout=60, verify=self.verify())

    def start(self, timeout: float = 120.0) -> None:
        searchable_ancestors(self.state_dir)
        argv = [
            sys.executable, "-m", "warren.cli.main", "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--state-dir", str(self.state_dir),
            "--cache-dir", str(self.cache_dir),
        ]  # fmt: skip
        if self.runsc is not None:
            argv += ["--runsc", str(self.runsc)]
        if self.domain_ca is not None and self.domain is not None:
            argv += ["--domain", self.domain]
            tls = self.state_dir / "tls"
            tls.mkdir(parents=True, exist_ok=True, mode=0o700)
            for name in ("ca.pem", "ca-key.pem"):
                if not (tls / name).exists():
                    shutil.copy(self.domain_ca / name, tls / name)
        env = {**os.environ, "WARREN_API_KEY": self.api_key, "PYTHONUNBUFFERED": "1", **self.extra_env}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"warren serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1, verify=self.verify()).status_code == 200:
                    return
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"warren serve did not come up in {timeout}s:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill_all_sandboxes(self) -> None:
        with self.client() as c:
            for sbx in c.get("/v2/sandboxes").json():
                c.delete(f"/sandboxes/{sbx['sandboxID']}")

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"


@contextlib.contextmanager
def running_node(
    state_dir: Path,
    runsc: Path | None = None,
    extra_env: dict[str, str] | None = None,
    domain_ca: Path | None = None,
) -> Iterator[Node]:
    """A started node; the warm pool is off unless ``extra_env`` says otherwise (tests count sandboxes).
    ``domain_ca``: in domain mode, with that node CA (see :attr:`Node.domain_ca`)."""
    env = {"WARREN_WARM_POOL": "0", **(extra_env or {})}
    node = Node(
        state_dir=state_dir, port=free_port(), api_key="wrn_test_" + os.urandom(8).hex(), runsc=runsc, extra_env=env,
        domain_ca=domain_ca,
    )  # fmt: skip
    node.start()
    try:
        yield node
    finally:
        with contextlib.suppress(Exception):
            node.kill_all_sandboxes()
        node.stop()
