"""The startup probe: runc is usable; the stock runsc hits B1 here; the patched copy does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.framework.leaks import assert_no_leaks
from tests.framework.runtime import host_snapshot, need_root
from warren.runtime.probe import probe_runc, probe_runsc
from warren.runtime.rootfs import mounts_under
from warren.runtime.userns import probe_idmapped_mounts

pytestmark = [pytest.mark.root]


async def test_runc_probe(runc_binary: Path) -> None:
    result = await probe_runc(runc_binary)
    assert result["available"] is True
    assert result["version"].startswith("1.")


async def test_probe_of_a_missing_binary(tmp_path: Path) -> None:
    result = await probe_runc(tmp_path / "runc")
    assert result["available"] is False
    assert "cannot execute" in result["reason"]
    result = await probe_runsc(tmp_path / "runsc", work_dir=tmp_path / "w")
    assert result["available"] is False


@pytest.mark.runsc
async def test_stock_runsc_reports_b1(system_runsc: Path, tmp_path: Path, agent_bundle: Path) -> None:
    need_root()
    before = host_snapshot(tmp_path)
    result = await probe_runsc(system_runsc, work_dir=tmp_path / "probe", netns_prefix="wrt-",
                               agent_bundle=agent_bundle)
    assert_no_leaks(before)
    if result["available"]:
        pytest.skip(f"runsc {result['version']} on this kernel has no B1")
    assert result["bug"] == "B1"
    assert result["reason"] == (
        f"runsc {result['version']} cannot start networked sandboxes on kernel >= 6.7 (gvisor#10704); "
        "install runsc 2024-08 or later"
    )
    assert not list((tmp_path / "probe").iterdir())


@pytest.mark.runsc
async def test_patched_runsc_is_available(patched_runsc: Path, tmp_path: Path, agent_bundle: Path) -> None:
    need_root()
    before = host_snapshot(tmp_path)
    result = await probe_runsc(patched_runsc, work_dir=tmp_path / "probe", netns_prefix="wrt-",
                               agent_bundle=agent_bundle)
    assert result["available"] is True, result["reason"]
    assert result["platform"] == "ptrace"
    assert_no_leaks(before)


def test_idmapped_probe_leaves_no_scratch(tmp_path: Path) -> None:
    """The idmapped-overlay probe removes its scratch tree (files owned by the mapped uid included) and
    leaves nothing mounted, whether the kernel supports idmapped overlays or not."""
    need_root()
    scratch = tmp_path / "idmap"
    reason = probe_idmapped_mounts(scratch)
    assert isinstance(reason, str)
    assert not scratch.exists()
    assert not mounts_under(tmp_path)
