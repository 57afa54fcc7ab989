"""An S3-compatible server for tests: moto's server in a child process on a free loopback port.

It stands in for S3 or MinIO (any S3-compatible server): the shared snapshot store's S3 backend talks to
it over real HTTP with boto3, exactly as it would to AWS or a MinIO deployment, so multipart uploads,
list pagination, missing keys and connection errors all go through the real client code. moto keeps
everything in memory: stopping it loses every object.

    with running_s3(workdir) as s3:          # or the ``s3_server`` session fixture
        bucket = s3.make_bucket()            # a fresh bucket per test
        store = S3ObjectStore(bucket, endpoint_url=s3.endpoint)

Credentials are fake (moto accepts any); :func:`s3_env` puts them into the environment with
``AWS_CONFIG_FILE``/``AWS_SHARED_CREDENTIALS_FILE`` pointing nowhere, so a developer's own AWS
configuration can never be picked up by a test.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.framework.node import free_port

__all__ = ["S3Server", "running_s3", "s3_env", "s3_server"]

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "warren-test",
    "AWS_SECRET_ACCESS_KEY": "warren-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    workdir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        log = (self.workdir / "moto.log").open("ab")
        env = {**os.environ, **FAKE_CREDENTIALS}
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}; see {self.workdir}/moto.log")
            with contextlib.suppress(OSError, urllib.error.URLError):
                # Any HTTP answer (moto answers / with a bucket listing) means it is serving.
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with opener.open(self.endpoint + "/", timeout=1):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"moto server did not answer on port {self.port} in {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def make_bucket(self) -> str:
        """A new, empty bucket with a random name."""
        import boto3

        name = "warren-test-" + secrets.token_hex(6)
        client = boto3.session.Session(
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
        ).client("s3", endpoint_url=self.endpoint)
        client.create_bucket(Bucket=name)
        client.close()
        return name


@contextlib.contextmanager
def running_s3(workdir: Path) -> Iterator[S3Server]:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        pytest.skip("moto[server] is not installed in the venv (dev dependency moto[s3], flask, flask-cors)")
    server = S3Server(workdir, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One moto server (standing in for S3/MinIO) for the session; tests take a fresh bucket each."""
    with running_s3(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials in the environment (the standard chain reads them); no AWS config files."""
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
