"""Private traffic: a sandbox created with ``allowPublicTraffic: false`` takes requests on its ports
other than envd's only with its token in ``e2b-traffic-access-token``; E2B's 403 JSON otherwise.

The check runs before the sandbox is looked up for routing, so refused traffic never wakes a paused
sandbox. A paused one answers what E2B's resume path answers: the credentials cannot resume it.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from .routing import ENVD_PORT, Target

TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
TokenLookup = Callable[[str], "str | None"]
"""Sandbox id -> the traffic token its traffic must carry (None: public, or not on this node)."""


@dataclass(frozen=True)
class Refusal:
    status: int
    sandbox_id: str
    message: str

    def body(self) -> dict[str, object]:
        return {"sandboxId": self.sandbox_id, "message": self.message, "code": self.status}


def refusal(
    target: Target, headers: list[tuple[bytes, bytes]], required: str | None, *, paused: bool
) -> Refusal | None:
    """Why a request to ``target`` is refused, or None when it may pass (envd's port always may:
    envd checks its own access token)."""
    if required is None or target.port == ENVD_PORT:
        return None
    given = next((v for k, v in headers if k.lower() == TRAFFIC_TOKEN_HEADER.encode()), None)
    if given is not None and hmac.compare_digest(given, required.encode()):
        return None
    if paused:
        message = "This sandbox can't be resumed with the credentials provided. Check your access token and try again."
    elif not given:
        message = f"Sandbox is secured with traffic access token. Token header '{TRAFFIC_TOKEN_HEADER}' is missing"
    else:
        message = f"Sandbox is secured with traffic access token. Provided token in header '{TRAFFIC_TOKEN_HEADER}'"
        message += " is invalid"
    return Refusal(403, target.sandbox_id, message)
