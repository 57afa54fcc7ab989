"""``Runtime.probe()`` is a dataclass; ``/health`` shows the same JSON the mapping used to be."""

from __future__ import annotations

from warren.runtime.base import RuntimeProbe


def test_probe_json_round_trips_a_backend_mapping() -> None:
    found = {"available": True, "reason": "", "kind": "runc", "version": "1.2.0", "disk_quota": {"enforced": True}}
    probe = RuntimeProbe.of_mapping(found)
    assert probe.available and probe.reason == "" and probe.details["version"] == "1.2.0"
    assert probe.to_json() == found


def test_probe_without_reason_has_none_in_json() -> None:
    assert RuntimeProbe.of_mapping({"available": False, "kind": "gvisor"}).to_json() == {
        "available": False,
        "kind": "gvisor",
    }
