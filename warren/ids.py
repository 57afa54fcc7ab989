"""The one maker of warren's ids: a prefix naming the kind, then random lowercase letters and digits.

Every id is :data:`ID_LENGTH` characters (E2B's sandbox ids have the same form: ``i`` and 19 more), so
an id fits every name derived from it (netns ``wrn-<id>``, cgroup and runtime container names).
The one-letter kinds are reserved as a form (:func:`looks_like_id`), so no template or snapshot name a
user gives can shadow an id, which lookups by id-or-name try first.
"""

from __future__ import annotations

import re
import secrets
import string

__all__ = [
    "ALPHABET",
    "ID_LENGTH",
    "SANDBOX",
    "SNAPSHOT",
    "TEMPLATE",
    "looks_like_id",
    "new_id",
    "new_sandbox_id",
    "new_snapshot_id",
    "new_template_id",
]

ID_LENGTH = 20
ALPHABET = string.ascii_lowercase + string.digits
"""36 symbols: 19 of them carry about 98 bits of randomness."""

SANDBOX = "i"
SNAPSHOT = "s"
TEMPLATE = "t"

_ID_FORM = re.compile(rf"[{SANDBOX}{SNAPSHOT}{TEMPLATE}][{ALPHABET}]{{{ID_LENGTH - 1}}}")


def new_id(prefix: str) -> str:
    """``prefix`` followed by random characters of :data:`ALPHABET`, :data:`ID_LENGTH` characters in all."""
    if not 0 < len(prefix) < ID_LENGTH:
        raise ValueError(f"an id prefix has 1 to {ID_LENGTH - 1} characters, not {len(prefix)}")
    return prefix + "".join(secrets.choice(ALPHABET) for _ in range(ID_LENGTH - len(prefix)))


def new_sandbox_id() -> str:
    return new_id(SANDBOX)


def new_snapshot_id() -> str:
    return new_id(SNAPSHOT)


def new_template_id() -> str:
    return new_id(TEMPLATE)


def looks_like_id(text: str) -> bool:
    """Whether ``text`` has the exact form of a sandbox, snapshot or template id."""
    return _ID_FORM.fullmatch(text) is not None
