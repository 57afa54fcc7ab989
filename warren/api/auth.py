"""The control plane's API key: generated into the state dir on first start, or given by settings."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

API_KEY_FILE = "api-key"
API_KEY_PREFIX = "wrn_"


def load_or_create_api_key(state_dir: Path, override: str | None) -> tuple[str, bool]:
    """Return (key, created). The file is written once with mode 0600."""
    if override:
        return override, False
    path = state_dir / API_KEY_FILE
    try:
        return path.read_text().strip(), False
    except FileNotFoundError:
        pass
    key = API_KEY_PREFIX + secrets.token_hex(20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
        f.flush()
        os.fsync(f.fileno())
    return key, True


def key_matches(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
