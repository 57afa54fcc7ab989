"""warren.ints: the one parser of integers written as text, its bounds and its messages."""

from __future__ import annotations

import pytest

from warren.errors import InvalidRequestError
from warren.ints import parse_int, parse_optional_int


@pytest.mark.parametrize(("raw", "value"), [("0", 0), ("42", 42), (" 7 ", 7), ("-3", -3), ("+5", 5)])
def test_integers(raw: str, value: int) -> None:
    assert parse_int(raw, "n") == value


@pytest.mark.parametrize("raw", ["", " ", "eight", "2.5", "0x10", "1e3", "1_000", "٣", "--1"])
def test_not_integers_name_the_value(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^n must be an integer, got '.*'$"):
        parse_int(raw, "n")


@pytest.mark.parametrize(
    ("minimum", "maximum", "raw", "message"),
    [
        (1, 1000, "0", "limit must be an integer between 1 and 1000, got 0"),
        (1, 1000, "1001", "limit must be an integer between 1 and 1000, got 1001"),
        (1, None, "-1", "limit must be a positive integer, got -1"),
        (0, None, "-1", "limit must be a non-negative integer, got -1"),
        (5, None, "4", "limit must be an integer of at least 5, got 4"),
        (None, 9, "10", "limit must be an integer of at most 9, got 10"),
        (1, None, "x", "limit must be a positive integer, got 'x'"),
    ],
)
def test_bounds(minimum: int | None, maximum: int | None, raw: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_int(raw, "limit", minimum=minimum, maximum=maximum)
    assert str(info.value) == message


def test_bounds_are_inclusive() -> None:
    assert parse_int("1", "n", minimum=1, maximum=1) == 1


def test_the_caller_picks_the_error() -> None:
    with pytest.raises(InvalidRequestError, match="limit must be a positive integer"):
        parse_int("0", "limit", minimum=1, error=InvalidRequestError)


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_optional_blank_is_unset(raw: str | None) -> None:
    assert parse_optional_int(raw, "n", minimum=1) is None


def test_optional_checks_what_is_set() -> None:
    assert parse_optional_int(" 3", "n", minimum=1) == 3
    with pytest.raises(InvalidRequestError, match="n must be a positive integer, got 0"):
        parse_optional_int("0", "n", minimum=1, error=InvalidRequestError)
