"""Registry authentication: ``WWW-Authenticate`` challenges, Basic auth and the Bearer token flow.

A registry answers 401 with a challenge. ``Basic realm=...`` wants the credentials on every request;
``Bearer realm=<token-url>,service=...,scope=...`` wants a token from ``<token-url>`` (Docker Hub's is
``https://auth.docker.io/token``), asked for anonymously or with Basic credentials, and then sent as
``Authorization: Bearer <token>``. Tokens are cached per (host, scope) until shortly before they expire.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from warren.images.config import Credentials, RegistryConfig
from warren.images.errors import RegistryAuthError, RegistryError

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM = re.compile(rf'\s*({_TOKEN})\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]*)\s*,?')
_SCHEME = re.compile(rf"\s*,?\s*({_TOKEN})(?:\s+|$)")
DEFAULT_TOKEN_LIFETIME_S = 60
"""What the token spec says to assume when a token response has no ``expires_in``."""
TOKEN_SLACK_S = 10


@dataclass(frozen=True)
class Challenge:
    """One ``WWW-Authenticate`` challenge: the scheme (lowercase) and its parameters."""

    scheme: str
    params: dict[str, str]


def parse_challenges(headers: list[str]) -> list[Challenge]:
    """Every challenge in the given ``WWW-Authenticate`` header values (RFC 7235, leniently)."""
    out: list[Challenge] = []
    for header in headers:
        pos = 0
        while pos < len(header):
            m = _SCHEME.match(header, pos)
            if not m or "=" in header[m.start(1) : m.end(1) + 1]:
                break
            scheme, pos = m.group(1).lower(), m.end()
            params: dict[str, str] = {}
            while (p := _PARAM.match(header, pos)) is not None and p.end() > pos:
                value = p.group(2)
                if value.startswith('"'):
                    value = re.sub(r"\\(.)", r"\1", value[1:-1])
                params[p.group(1).lower()] = value
                pos = p.end()
            out.append(Challenge(scheme, params))
    return out


def basic_header(creds: Credentials) -> str:
    raw = f"{creds.username}:{creds.password}".encode()
    return "Basic " + base64.b64encode(raw).decode()


class Authenticator:
    """Answers a registry's 401 challenges and caches the resulting ``Authorization`` values.

    One instance per pull (it lives as long as its ``httpx.AsyncClient``).
    """

    def __init__(self, client: httpx.AsyncClient, config: RegistryConfig) -> None:
        self._client = client
        self._config = config
        self._cache: dict[tuple[str, str], tuple[str, float]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def header(self, host: str, scope: str) -> str | None:
        """The cached ``Authorization`` value for ``host``/``scope``, if any and not about to expire."""
        for key in ((host, scope), (host, "")):
            hit = self._cache.get(key)
            if hit is not None and hit[1] > time.monotonic():
                return hit[0]
        return None

    async def authenticate(self, host: str, scope: str, response: httpx.Response, used: str | None) -> str:
        """A fresh ``Authorization`` value answering ``response``'s 401 challenge.

        ``used`` is what the refused request carried: if another task has refreshed the cache
        since, its value is returned instead of asking again. Raises ``RegistryAuthError`` when the
        registry wants credentials we do not have or refuses ours.
        """
        challenges = parse_challenges(response.headers.get_list("www-authenticate"))
        bearer = next((c for c in challenges if c.scheme == "bearer"), None)
        basic = next((c for c in challenges if c.scheme == "basic"), None)
        key = (host, scope if bearer is not None else "")
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            current = self.header(host, scope)
            if current is not None and current != used:
                return current
            creds = self._config.credentials_for(host)
            if bearer is not None:
                value, lifetime = await self._token(host, scope, bearer, creds)
            elif basic is not None:
                if creds is None:
                    raise RegistryAuthError(_no_creds_message(host, scope))
                if used is not None and used.startswith("Basic "):
                    raise RegistryAuthError(f"registry {host} refused the credentials of user {creds.username!r} (401)")
                value, lifetime = basic_header(creds), float("inf")
            else:
                raise RegistryAuthError(
                    f"registry {host} answered 401 without a usable challenge "
                    f"({response.headers.get('www-authenticate')!r})"
                )
            self._cache[key] = (value, time.monotonic() + lifetime)
            return value

    async def _token(self, host: str, scope: str, challenge: Challenge, creds: Credentials | None) -> tuple[str, float]:
        realm = challenge.params.get("realm")
        if not realm or urlsplit(realm).scheme not in ("http", "https"):
            raise RegistryError(f"registry {host} sent a Bearer challenge without a usable realm: {realm!r}")
        realm_host = urlsplit(realm).netloc
        if urlsplit(realm).scheme == "http" and not self._config.is_insecure(realm_host):
            raise RegistryError(f"registry {host} wants a token from plain-http {realm}; refusing")
        query = {"scope": challenge.params.get("scope") or scope}
        if service := challenge.params.get("service"):
            query["service"] = service
        headers = {"Authorization": basic_header(creds)} if creds is not None else {}
        try:
            resp = await self._client.get(realm, params=query, headers=headers)
        except httpx.TransportError as exc:
            raise RegistryError(f"cannot reach the token service of {host} at {realm}: {exc!r}") from exc
        if resp.status_code in (401, 403):
            who = f"the credentials of user {creds.username!r}" if creds else "anonymous access"
            raise RegistryAuthError(f"token service {realm} of registry {host} refused {who} ({resp.status_code})")
        if resp.status_code != 200:
            raise RegistryError(f"token service {realm} of registry {host} answered {resp.status_code}")
        try:
            doc = resp.json()
            token = doc.get("token") or doc.get("access_token")
            lifetime = float(doc.get("expires_in") or DEFAULT_TOKEN_LIFETIME_S)
        except (ValueError, AttributeError, TypeError) as exc:
            raise RegistryError(f"token service {realm} of registry {host} sent an unreadable answer") from exc
        if not isinstance(token, str) or not token:
            raise RegistryError(f"token service {realm} of registry {host} sent no token")
        return f"Bearer {token}", max(lifetime - TOKEN_SLACK_S, 1.0)

    def refused(self, host: str, scope: str, status: int, detail: str) -> RegistryAuthError:
        """The error for a request still refused (401/403) after authenticating."""
        creds = self._config.credentials_for(host)
        if creds is None:
            return RegistryAuthError(_no_creds_message(host, scope, status) + (f": {detail}" if detail else ""))
        return RegistryAuthError(
            f"registry {host} refused user {creds.username!r} for {scope} ({status})"
            + (f": {detail}" if detail else "")
        )


def _no_creds_message(host: str, scope: str, status: int = 401) -> str:
    return (
        f"registry {host} denied {scope} without credentials ({status}): the repository does not exist or needs a "
        f"login (add credentials for {host} to the docker config.json or warren's registry config)"
    )


__all__ = ["Authenticator", "Challenge", "basic_header", "parse_challenges"]
