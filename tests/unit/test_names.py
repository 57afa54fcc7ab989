"""The one rule for template and snapshot names (pure)."""

from __future__ import annotations

import pytest

from warren.errors import InvalidRequestError
from warren.names import validate_name


@pytest.mark.parametrize("name", ["app", "my-env:v1.0", "a.b_c", "X9", "base:latest", "n:_tag", "x" * 128, "template"])
def test_valid(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "-x", "a b", "a/b", "ns/name:tag", "x" * 129, "é", "x:y:z", ":tag", "name:", "name:-t", ".x", "a\nb"],
)
def test_malformed(name: str) -> None:
    with pytest.raises(InvalidRequestError, match="name:tag"):
        validate_name(name)


@pytest.mark.parametrize("name", ["template:tabcdefghij012345678", "template:x", "Template:X"])
def test_template_prefix_is_reserved(name: str) -> None:
    with pytest.raises(InvalidRequestError, match="reserved"):
        validate_name(name, "snapshot")


@pytest.mark.parametrize("name", ["iabcdefghij012345678", "sabcdefghij012345678", "t0123456789abcdefghi"])
def test_id_forms_are_reserved(name: str) -> None:
    with pytest.raises(InvalidRequestError, match="warren id"):
        validate_name(name)


@pytest.mark.parametrize("name", [None, 3, ["a"]])
def test_non_strings(name: object) -> None:
    with pytest.raises(InvalidRequestError, match="snapshot"):
        validate_name(name, "snapshot")
