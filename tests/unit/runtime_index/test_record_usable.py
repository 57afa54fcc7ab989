"""Runtime records from outside (API, config files) must carry their class's assets at fetchable URLs (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warren.errors import InvalidRequestError
from warren.runtime.records import Asset, InvalidRuntimeRecord, RuntimeRecord, check_usable
from warren.runtime.registry import load_configs

H = "a" * 64


@pytest.mark.parametrize(
    "record",
    [
        RuntimeRecord("runc", {"runc": Asset("file:///usr/sbin/runc", H)}),
        RuntimeRecord("runc", {"runc": Asset("file://localhost/usr/sbin/runc", H)}),
        RuntimeRecord("gvisor", {"runsc": Asset("https://mirror.example/gvisor/runsc", H)}),
        RuntimeRecord("gvisor", {"runsc": Asset("HTTP://10.0.0.1:8080/runsc", H)}),
        RuntimeRecord("gvisor", {"runsc": Asset("s3://bucket/gvisor/runsc", H)}),
        RuntimeRecord("microvm", {"kernel": Asset("file:///k", H), "vmm": Asset("s3://b/vmm", H)}),
    ],
)
def test_usable(record: RuntimeRecord) -> None:
    assert check_usable(record) is record


@pytest.mark.parametrize(
    ("record", "match"),
    [
        (RuntimeRecord("runc", {}), "needs the asset.*runc.*none"),
        (RuntimeRecord("gvisor", {}), "runsc"),
        (RuntimeRecord("microvm", {}), "none"),
        (RuntimeRecord("runc", {"runsc": Asset("file:///x", H)}), "needs the asset.*runc.*it has runsc"),
        (RuntimeRecord("gvisor", {"runsc": Asset("ftp://mirror/runsc", H)}), "ftp"),
        (RuntimeRecord("gvisor", {"runsc": Asset("gs://bucket/runsc", H)}), "gs"),
        (RuntimeRecord("gvisor", {"runsc": Asset("runsc", H)}), "relative"),
        (RuntimeRecord("gvisor", {"runsc": Asset("./bin/runsc", H)}), "relative"),
        (RuntimeRecord("gvisor", {"runsc": Asset("file:bin/runsc", H)}), "absolute"),
        (RuntimeRecord("gvisor", {"runsc": Asset("file://otherhost/runsc", H)}), "absolute local"),
        (RuntimeRecord("gvisor", {"runsc": Asset("http:///runsc", H)}), "host"),
        (RuntimeRecord("gvisor", {"runsc": Asset("s3://bucket", H)}), "bucket and a key"),
        (RuntimeRecord("gvisor", {"runsc": Asset("s3:///key", H)}), "bucket and a key"),
    ],
)
def test_unusable(record: RuntimeRecord, match: str) -> None:
    with pytest.raises(InvalidRuntimeRecord, match=match):
        check_usable(record)


def test_config_files_are_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "runtimes.json"
    entry = {"name": "gv", "version": "1", "default": True, "sandbox_class": "gvisor"}
    path.write_text(json.dumps({"runtimes": [{**entry, "assets": {"runsc": {"url": "ftp://m/runsc", "sha256": H}}}]}))
    with pytest.raises(InvalidRequestError, match=r"gv@1.*ftp"):
        load_configs(path)
    path.write_text(json.dumps({"runtimes": [{**entry, "assets": {"runsc": {"url": "file:///r", "sha256": H}}}]}))
    assert [c.name for c in load_configs(path)] == ["gv"]
