"""The guest imports nothing from warren, so the constants both sides rely on are defined twice."""

from __future__ import annotations

import warren.guest as guest
import warren.guest.main as guest_main
from warren.api.models import ENVD_VERSION
from warren.api.proxy.routing import ENVD_PORT
from warren.runtime.base import AGENT_PORT


def test_envd_version_matches() -> None:
    assert guest.ENVD_VERSION == ENVD_VERSION


def test_agent_port_matches() -> None:
    assert AGENT_PORT == ENVD_PORT == 49983
    assert "49983" in open(guest_main.__file__).read()
