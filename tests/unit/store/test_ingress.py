"""A private sandbox's ingress policy (``allowPublicTraffic: false`` and its traffic token) is stored
with it and reads back the same from a reopened database: it survives a node restart."""

from __future__ import annotations

from pathlib import Path

from warren.store import Database, IngressPolicy, SandboxRecord, SandboxRepo


def _record(sandbox_id: str, ingress: IngressPolicy) -> SandboxRecord:
    return SandboxRecord(
        id=sandbox_id, template_id="t", alias=None, runtime="runc", state="paused", metadata={}, env_vars={},
        started_at=1.0, end_at=2.0, cpu_count=1, memory_mb=128, disk_mb=512, access_token="a", address=None,
        allow_internet=True, ingress=ingress,
    )  # fmt: skip


async def test_ingress_round_trips_through_a_reopened_database(tmp_path: Path) -> None:
    path = tmp_path / "warren.db"
    private = IngressPolicy(public=False, traffic_token="tok")
    db = Database(path)
    try:
        await SandboxRepo(db).put(_record("private", private))
        await SandboxRepo(db).put(_record("public", IngressPolicy()))
    finally:
        db.close()
    db = Database(path)
    try:
        records = {r.id: r for r in await SandboxRepo(db).all()}
    finally:
        db.close()
    assert records["private"].ingress == private
    assert records["public"].ingress == IngressPolicy(public=True, traffic_token=None)
