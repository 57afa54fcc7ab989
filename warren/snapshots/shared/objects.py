"""The seam under the shared snapshot store: a flat namespace of immutable-once-written objects.

An :class:`ObjectStore` is what a shared filesystem path (:class:`~.dirstore.DirObjectStore`) and an
S3 bucket (:class:`~.s3store.S3ObjectStore`) have in common, and nothing more: whole-object puts that
replace atomically (a reader sees the old object or the new one, never a mix), bounded gets, idempotent
deletes and a prefix listing. Tests plug in at this seam with a small wrapper (no monkeypatching).

Keys are ``/``-separated names that :func:`check_key` validates before any backend sees them, so a
key means the same object on every backend and can never name something outside the store.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from ...errors import HostError, InvalidRequestError

__all__ = [
    "LIST_LIMIT",
    "MAX_KEY_LENGTH",
    "ObjectStore",
    "ObjectTooLargeError",
    "Stopped",
    "check_key",
    "check_prefix",
    "run_in_thread",
]

T = TypeVar("T")

MAX_KEY_LENGTH = 1024
"""Longest key in characters: S3's own limit is 1024 bytes of UTF-8, and a directory store's names stay
well under ``PATH_MAX`` with it."""

LIST_LIMIT = 100_000
"""Most keys one :meth:`ObjectStore.list` returns; past it the listing fails rather than eat the node's
memory (a store with more objects under one prefix is not one warren wrote)."""


class ObjectTooLargeError(HostError):
    """An object is larger than the reader's bound (``max_bytes``): it is not read."""


class ObjectStore(Protocol):
    """Objects by key. Every method raises :class:`~warren.errors.InvalidRequestError` for a bad key,
    :class:`~warren.errors.UnavailableError` when the backend cannot be reached and
    :class:`~warren.errors.HostError` for other backend failures."""

    async def put_file(self, key: str, src: Path) -> None:
        """Store the regular file ``src`` as ``key``, replacing any object of that key atomically."""
        ...

    async def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` as ``key``, replacing any object of that key atomically."""
        ...

    async def get_file(self, key: str, dest: Path, *, max_bytes: int) -> None:
        """Write object ``key`` to the new file ``dest``. ``NotFoundError`` when there is no such object,
        :class:`ObjectTooLargeError` when it has more than ``max_bytes``; after a failure ``dest`` does
        not exist."""
        ...

    async def get_bytes(self, key: str, *, max_bytes: int) -> bytes | None:
        """Object ``key``, or None when there is none; :class:`ObjectTooLargeError` past ``max_bytes``."""
        ...

    async def delete(self, key: str) -> None:
        """Remove object ``key``; nothing to remove is not an error."""
        ...

    async def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix`` (a string prefix, as in S3: ``"a"`` matches ``"ab"``
        and ``"a/b"``), in no particular order; at most :data:`LIST_LIMIT`."""
        ...


def check_key(key: str) -> str:
    """``key`` when it is a valid object key, else :class:`~warren.errors.InvalidRequestError`.

    Valid: 1 to :data:`MAX_KEY_LENGTH` characters; ``/``-separated components that are not empty
    (so no leading, trailing or double ``/``) and do not start with ``.`` (no ``.``, ``..``, nor the
    directory store's ``.tmp``); no control characters (NUL, newline, ...) and no backslash.
    """
    if not isinstance(key, str) or not key:
        raise InvalidRequestError("an object key must be a non-empty string")
    _check_chars(key, "object key")
    for part in key.split("/"):
        if not part:
            raise InvalidRequestError(f"object key {key[:80]!r} has an empty component (a leading, last or double /)")
        if part.startswith("."):
            raise InvalidRequestError(f"object key {key[:80]!r} has a component starting with '.'")
    return key


def check_prefix(prefix: str) -> str:
    """``prefix`` when it is a valid listing prefix: empty, or what a valid key starts with (a trailing
    ``/`` and a partial last component are fine)."""
    if not isinstance(prefix, str):
        raise InvalidRequestError("a listing prefix must be a string")
    if not prefix:
        return prefix
    _check_chars(prefix, "listing prefix")
    parts = prefix.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if (not part and not last) or part.startswith("."):
            raise InvalidRequestError(f"listing prefix {prefix[:80]!r} cannot start a valid key")
    return prefix


async def run_in_thread(fn: Callable[[threading.Event], T]) -> T:
    """``fn(stop)`` in a worker thread, for the backends' blocking calls.

    ``asyncio.to_thread`` abandons its thread when the caller is cancelled, and a download that goes on
    writing after its caller cleaned up leaves files behind. Here a cancellation sets ``stop`` and waits
    for the thread to return before ``CancelledError`` propagates: ``fn`` checks ``stop`` between chunks
    and undoes its own partial work. (A second cancellation stops the waiting, not the thread.)
    """
    stop = threading.Event()
    done = asyncio.get_running_loop().run_in_executor(None, fn, stop)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait([done])
        if not done.cancelled():
            done.exception()  # retrieved: the cancellation is what the caller hears about
        raise


class Stopped(Exception):
    """Raised inside :func:`run_in_thread`'s worker when ``stop`` is set (the caller was cancelled)."""


def _check_chars(text: str, what: str) -> None:
    if len(text) > MAX_KEY_LENGTH:
        raise InvalidRequestError(f"{what} is longer than {MAX_KEY_LENGTH} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in text):
        raise InvalidRequestError(f"{what} {text[:80]!r} contains a control character or a backslash")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{what} {text[:80]!r} is not valid Unicode") from None
