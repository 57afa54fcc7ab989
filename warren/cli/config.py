"""Where the client commands find the server and its API key.

Precedence, highest first: ``--url``/``--api-key`` flags; ``WARREN_URL``/``WARREN_API_KEY``;
``E2B_API_URL``/``E2B_API_KEY``; the config file ``$XDG_CONFIG_HOME/warren/config`` (default
``~/.config/warren/config``, TOML or plain ``key = value`` lines with keys ``url`` and
``api_key``); for the key only, the local node's ``/var/lib/warren/api-key`` when readable.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:3000"
DEFAULT_STATE_DIR = Path("/var/lib/warren")
DEFAULT_CACHE_DIR = Path("/var/cache/warren")
API_KEY_FILE = "api-key"
"""The file in a node's state dir that holds its API key."""


@dataclass(frozen=True)
class ClientConfig:
    """The server a client command talks to."""

    url: str
    api_key: str | None


def config_path(env: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/warren/config``, or ``~/.config/warren/config``."""
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "warren" / "config"


def parse_config(text: str) -> dict[str, str]:
    """Parse the config file: TOML, or (if that fails) ``key = value`` lines with ``#`` comments."""
    try:
        return {k: str(v) for k, v in tomllib.loads(text).items() if isinstance(v, str | int)}
    except tomllib.TOMLDecodeError:
        pass
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip().strip("'\"")
    return values


def load_client_config(
    *,
    url: str | None = None,
    api_key: str | None = None,
    env: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
) -> ClientConfig:
    """Resolve the server URL and API key (see the module docstring for the order)."""
    environ = os.environ if env is None else env
    file_values = _read_config_file(config_path(environ))
    resolved_url = (
        url or environ.get("WARREN_URL") or environ.get("E2B_API_URL") or file_values.get("url") or DEFAULT_URL
    )
    resolved_key = (
        api_key
        or environ.get("WARREN_API_KEY")
        or environ.get("E2B_API_KEY")
        or file_values.get("api_key")
        or _read_key_file((state_dir or DEFAULT_STATE_DIR) / API_KEY_FILE)
    )
    return ClientConfig(url=resolved_url.rstrip("/"), api_key=resolved_key or None)


def _read_config_file(path: Path) -> dict[str, str]:
    try:
        return parse_config(path.read_text())
    except OSError:
        return {}


def _read_key_file(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
