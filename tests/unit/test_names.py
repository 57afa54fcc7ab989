"""The one rule for template and snapshot names (pure)."""

from __future__ import annotations

import pytest

from warren.errors import InvalidRequestError
from warren.names import split_reference, validate_name, validate_tags


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


@pytest.mark.parametrize(
    ("ref", "parts"),
    [("app", ("app", None)), ("app:v1", ("app", "v1")), ("app:V1.0", ("app", "v1.0")),
     ("app:default", ("app", "default")), ("app: x ", ("app", "x"))],
)
def test_split_reference(ref: str, parts: tuple[str, str | None]) -> None:
    assert split_reference(ref) == parts


@pytest.mark.parametrize("ref", ["app:", "app:a b", "app:a/b", "app:a:b", "app:3f2c8b6e-5d3a-4f7e-9b1a-2c4d6e8f0a1b"])
def test_split_reference_bad_tag(ref: str) -> None:
    with pytest.raises(InvalidRequestError, match="tag"):
        split_reference(ref)


def test_validate_tags_lowercases_and_deduplicates() -> None:
    assert validate_tags(["Prod", "stable", "prod", " x_y-z.1 "]) == ["prod", "stable", "x_y-z.1"]


@pytest.mark.parametrize(
    "tags", [["bad tag"], ["é"], ["3F2C8B6E-5D3A-4F7E-9B1A-2C4D6E8F0A1B"], [""], ["a:b"], "abc", [3]]
)
def test_validate_tags_refuses(tags: object) -> None:
    with pytest.raises(InvalidRequestError, match="tag"):
        validate_tags(tags)
