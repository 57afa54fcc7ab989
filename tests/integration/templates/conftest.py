"""Template integration tests build real root filesystems; most need root (chown, chroot)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (chown to uid 1000, chroot)")
