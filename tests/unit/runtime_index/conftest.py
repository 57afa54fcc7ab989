from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import AssetServer


@pytest.fixture
def server() -> Iterator[AssetServer]:
    with AssetServer().running() as srv:
        yield srv
