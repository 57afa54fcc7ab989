"""RuntimeRecord hashing/serialization and the runtime config validator."""

from __future__ import annotations

import hashlib
import json

import pytest

from warren.errors import InvalidRequestError
from warren.runtime.records import (
    Asset,
    InvalidRuntimeRecord,
    RuntimeConfig,
    RuntimeRecord,
    validate_runtime_configs,
)

from .helpers import record, sha

H1, H2 = sha(b"1"), sha(b"2")


def test_canonical_json_is_sorted_compact_utf8() -> None:
    rec = RuntimeRecord("gvisor", {"runsc": Asset("s3://b/ü/runsc", H1)}, {"platform": "ptrace"})
    assert rec.canonical_json() == (
        '{"assets":{"runsc":{"sha256":"' + H1 + '","url":"s3://b/ü/runsc"}},'
        '"options":{"platform":"ptrace"},"sandbox_class":"gvisor"}'
    ).encode("utf-8")
    assert RuntimeRecord.from_json(rec.canonical_json()) == rec
    assert RuntimeRecord.from_json(json.dumps(rec.to_dict(), indent=4)) == rec


def test_hash_is_sha256_of_canonical_json_whatever_the_insertion_order() -> None:
    a = RuntimeRecord("microvm", {"kernel": Asset("file:///k", H1), "vmm": Asset("file:///v", H2)})
    b = RuntimeRecord("microvm", {"vmm": Asset("file:///v", H2), "kernel": Asset("file:///k", H1)})
    assert a.hash() == b.hash() == hashlib.sha256(a.canonical_json()).hexdigest()
    moved = RuntimeRecord("microvm", {"vmm": Asset("https://mirror/v", H2), "kernel": Asset("file:///k", H1)})
    assert moved.hash() != a.hash()  # the URL is part of the record, so part of the hash
    assert len(a.hash()) == 64


@pytest.mark.parametrize(
    "other",
    [
        RuntimeRecord("runc", {"runsc": Asset("file:///x", H1)}),
        RuntimeRecord("gvisor", {"runsc": Asset("file:///x", H2)}),
        RuntimeRecord("gvisor", {"runsc2": Asset("file:///x", H1)}),
        RuntimeRecord("gvisor", {"runsc": Asset("file:///x", H1)}, {"platform": "kvm"}),
    ],
)
def test_hash_covers_class_digests_names_and_options(other: RuntimeRecord) -> None:
    base = RuntimeRecord("gvisor", {"runsc": Asset("file:///x", H1)}, {"platform": "ptrace"})
    assert base.hash() != other.hash()


def test_record_is_immutable_and_hashable() -> None:
    src = {"runsc": Asset("file:///x", H1)}
    rec = RuntimeRecord("gvisor", src)
    src["other"] = Asset("file:///y", H2)
    assert list(rec.assets) == ["runsc"]
    with pytest.raises(TypeError):
        rec.assets["x"] = Asset("file:///y", H2)  # type: ignore[index]
    assert {rec, RuntimeRecord("gvisor", {"runsc": Asset("file:///x", H1)})} == {rec}


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        "[]",
        '{"assets": {}}',
        '{"sandbox_class": "docker", "assets": {}}',
        '{"sandbox_class": "gvisor", "assets": {"runsc": {"url": "file:///x", "sha256": "ABC"}}}',
        '{"sandbox_class": "gvisor", "assets": {"runsc": {"url": "", "sha256": "' + H1 + '"}}}',
        '{"sandbox_class": "gvisor", "assets": {"../x": {"url": "file:///x", "sha256": "' + H1 + '"}}}',
        '{"sandbox_class": "gvisor", "assets": {}, "options": {"platform": 1}}',
        '{"sandbox_class": "gvisor", "assets": {}, "pause_image": "x"}',
    ],
)
def test_malformed_records_are_refused(data: str) -> None:
    with pytest.raises(InvalidRuntimeRecord) as info:
        RuntimeRecord.from_json(data)
    assert isinstance(info.value, InvalidRequestError)


def _config(name: str, tag: str, cls: str, default: bool, version: str = "1") -> RuntimeConfig:
    return RuntimeConfig(name, version, record(tag, sandbox_class=cls), default)


def test_validator_returns_the_default_of_each_class() -> None:
    configs = [
        _config("gv", "a", "gvisor", False, "1"),
        _config("gv", "b", "gvisor", True, "2"),
        _config("rc", "c", "runc", True),
    ]
    defaults = validate_runtime_configs(configs)
    assert {k: (v.name, v.version) for k, v in defaults.items()} == {"gvisor": ("gv", "2"), "runc": ("rc", "1")}


def test_validator_refuses_two_defaults_none_and_duplicates_with_clear_errors() -> None:
    with pytest.raises(InvalidRuntimeRecord, match=r"class 'gvisor' has 2 default runtimes \(a@1, b@1\)"):
        validate_runtime_configs([_config("a", "a", "gvisor", True), _config("b", "b", "gvisor", True)])
    with pytest.raises(InvalidRuntimeRecord, match="class 'runc' has no default runtime"):
        validate_runtime_configs([_config("a", "a", "gvisor", True), _config("r", "r", "runc", False)])
    with pytest.raises(InvalidRuntimeRecord, match="a@1 is declared more than once"):
        validate_runtime_configs([_config("a", "a", "gvisor", True), _config("a", "b", "gvisor", False)])


def test_runtime_config_from_dict() -> None:
    config = RuntimeConfig.from_dict(
        {
            "name": "gvisor-default",
            "version": "20260622",
            "default": True,
            "sandbox_class": "gvisor",
            "assets": {"runsc": {"url": "https://x/runsc", "sha256": H1}},
            "options": {"platform": "ptrace"},
        }
    )
    assert config.default and config.record.options == {"platform": "ptrace"}
    with pytest.raises(InvalidRuntimeRecord, match="'bad' version '1'"):
        RuntimeConfig.from_dict({"name": "bad", "version": "1", "sandbox_class": "nope", "assets": {}})
