"""Cluster fixtures: one real redis-server on loopback per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.framework.redis import RedisServer, running_redis
from tests.framework.s3 import s3_server  # noqa: F401  (a fixture: moto's server, standing in for S3/MinIO)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server
