"""warren.ids: the one id maker, and the reserved id form that names.py refuses."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from warren.ids import (
    ALPHABET,
    ID_LENGTH,
    looks_like_id,
    new_id,
    new_sandbox_id,
    new_snapshot_id,
    new_template_id,
)


@pytest.mark.parametrize(("make", "prefix"), [(new_sandbox_id, "i"), (new_snapshot_id, "s"), (new_template_id, "t")])
def test_kinds_have_their_prefix_and_the_reserved_form(make: Callable[[], str], prefix: str) -> None:
    made = make()
    assert made.startswith(prefix) and len(made) == ID_LENGTH == 20
    assert set(made[1:]) <= set(ALPHABET)
    assert looks_like_id(made)


def test_longer_prefixes_keep_the_length_but_not_the_reserved_form() -> None:
    made = new_id("bld")
    assert made.startswith("bld") and len(made) == ID_LENGTH
    assert not looks_like_id(made)


def test_ids_differ() -> None:
    assert len({new_sandbox_id() for _ in range(100)}) == 100


@pytest.mark.parametrize("prefix", ["", "x" * ID_LENGTH])
def test_a_prefix_must_leave_room_for_randomness(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        new_id(prefix)


@pytest.mark.parametrize("text", ["i" + "a" * 18, "i" + "a" * 20, "x" + "a" * 19, "i" + "A" * 19, "i" + "-" * 19])
def test_other_forms_are_not_ids(text: str) -> None:
    assert not looks_like_id(text)
