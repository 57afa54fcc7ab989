"""The gateway's list cursor: one position in the nodes' common order, as a token every node takes."""

from __future__ import annotations

import pytest

from warren.api.models import rfc3339
from warren.cluster.gateway.listing import _decode, _encode, _seconds
from warren.errors import InvalidRequestError
from warren.orchestrator.table import _decode_token, encode_list_token


def test_listed_start_times_parse_back_to_the_microsecond() -> None:
    ts = 1_796_000_000.123456
    assert abs(_seconds(rfc3339(ts)) - ts) < 1e-6
    assert _seconds("2026-12-01T16:04:35Z") == _seconds("2026-12-01T16:04:35.000000Z")


def test_a_gateway_cursor_round_trips() -> None:
    position = (rfc3339(1_796_000_000.5), "iabc")
    assert _decode(_encode(position)) == position


@pytest.mark.parametrize("token", ["garbage", "", _encode(("not a time", "x"))[:-2], "W10="])
def test_a_bad_cursor_is_a_400(token: str) -> None:
    with pytest.raises(InvalidRequestError, match="nextToken"):
        _decode(token)


def test_the_node_token_sent_ascending_sorts_just_before_the_position() -> None:
    started = 1_796_000_000.123456789
    listed = rfc3339(started)
    token = encode_list_token(_seconds(listed) - 2e-6, "iabc")
    after = _decode_token(token)
    assert after < (started, "iabc")  # the node answers from the position on; the gateway drops the rest
    assert started - after[0] < 5e-6


def test_the_node_token_sent_descending_sorts_just_after_the_position() -> None:
    started = 1_796_000_000.123456789
    token = encode_list_token(_seconds(rfc3339(started)) + 2e-6, "iabc")
    after = _decode_token(token)
    assert after > (started, "iabc")
    assert after[0] - started < 5e-6
