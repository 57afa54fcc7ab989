"""The one parser of integers written as text: query parameters, environment variables, config values.

JSON bodies carry real numbers and are checked where they are parsed (``api/models.py``); this is for
strings. The caller picks the exception class, so each layer raises its own error (``InvalidRequestError``
is a 400 in the API, ``FootprintConfigError`` stops a node at start), with one wording everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["parse_int", "parse_optional_int"]

_DECIMAL = re.compile(r"[+-]?[0-9]+")
"""ASCII digits only: ``int()`` would also take ``1_000`` and other scripts' digits."""


def parse_int(
    raw: str,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: Callable[[str], Exception] = ValueError,
) -> int:
    """``raw`` as a decimal integer (surrounding whitespace ignored) within ``minimum``..``maximum``.

    Anything else raises ``error(message)``, the message naming ``name`` and what it must be:
    ``parse_int("0", "limit", minimum=1, error=InvalidRequestError)`` raises
    ``InvalidRequestError("limit must be a positive integer, got 0")``.
    """
    text = raw.strip()
    if _DECIMAL.fullmatch(text) is None:
        raise error(f"{name} must be {_expected(minimum, maximum)}, got {raw!r}")
    value = int(text)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise error(f"{name} must be {_expected(minimum, maximum)}, got {value}")
    return value


def parse_optional_int(
    raw: str | None,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: Callable[[str], Exception] = ValueError,
) -> int | None:
    """:func:`parse_int`, but None when ``raw`` is None, empty or blank (an empty value means unset)."""
    if raw is None or not raw.strip():
        return None
    return parse_int(raw, name, minimum=minimum, maximum=maximum, error=error)


def _expected(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer between {minimum} and {maximum}"
    if minimum == 1:
        return "a positive integer"
    if minimum == 0:
        return "a non-negative integer"
    if minimum is not None:
        return f"an integer of at least {minimum}"
    if maximum is not None:
        return f"an integer of at most {maximum}"
    return "an integer"
