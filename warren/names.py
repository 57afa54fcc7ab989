"""The one rule for names users give templates and snapshots (E2B's ``name`` or ``name:tag``).

A name is 1-128 characters: a base of ``[A-Za-z0-9][A-Za-z0-9._-]*``, optionally ``:`` and a tag of
``[A-Za-z0-9_][A-Za-z0-9._-]*``. Reserved, so that no user name can shadow what warren names itself:
``template:<anything>`` (the gVisor template snapshots) and the exact form of warren's ids
(``i``/``s``/``t`` and 19 lowercase letters or digits), which lookups by id-or-name try first.
"""

from __future__ import annotations

import re
import uuid

from .errors import InvalidRequestError
from .ids import looks_like_id

MAX_NAME = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?::[A-Za-z0-9_][A-Za-z0-9._-]*)?")
_RESERVED_BASES = frozenset({"template"})
DEFAULT_TAG = "default"
"""E2B's tag of a build that names none; ``name`` alone means ``name:default``."""
_TAG = re.compile(r"[a-z0-9._-]+")


def validate_name(name: object, what: str = "template") -> str:
    """``name`` if it is a valid, unreserved template or snapshot name; else ``InvalidRequestError`` (400)."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or _NAME.fullmatch(name) is None:
        raise InvalidRequestError(
            f"invalid {what} name {name!r}: use name or name:tag, 1-{MAX_NAME} of [A-Za-z0-9._-] with at most "
            "one ':', each part starting with a letter or digit"
        )
    base, sep, _ = name.partition(":")
    if sep and base.lower() in _RESERVED_BASES:
        raise InvalidRequestError(f"invalid {what} name {name!r}: names of the form '{base}:...' are reserved")
    if looks_like_id(name):
        raise InvalidRequestError(f"invalid {what} name {name!r}: it has the form of a warren id")
    return name


def validate_tag(tag: object) -> str:
    """A build tag as E2B keeps it: trimmed, lower-cased, ``[a-z0-9._-]+`` and not a UUID; else 400."""
    cleaned = tag.strip().lower() if isinstance(tag, str) else ""
    if _TAG.fullmatch(cleaned) is None:
        raise InvalidRequestError(f"invalid tag {tag!r}: use 1 or more of [a-z0-9._-]")
    try:
        uuid.UUID(cleaned)
    except ValueError:
        return cleaned
    raise InvalidRequestError(f"invalid tag {tag!r}: a tag cannot be a UUID")


def validate_tags(tags: object) -> list[str]:
    """A list of tags, each checked by :func:`validate_tag`, without repeats (first occurrence kept)."""
    if not isinstance(tags, list):
        raise InvalidRequestError("tags must be a list of strings")
    out: list[str] = []
    for tag in tags:
        cleaned = validate_tag(tag)
        if cleaned not in out:
            out.append(cleaned)
    return out


def split_reference(ref: str) -> tuple[str, str | None]:
    """``name`` or ``name:tag`` -> (name, tag or None); the tag checked by :func:`validate_tag`."""
    base, sep, tag = ref.strip().partition(":")
    return base, (validate_tag(tag) if sep else None)
