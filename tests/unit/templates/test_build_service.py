"""``BuildService`` (the facade) with the executor, records, layers and the SQLite store real.

The runtime is ``FakeRuntime`` and the guest agent ``FakeAgent`` (runc needs root, namespaces and cgroups):
builds without filesystem steps need no sandbox, and a build whose sandbox cannot run its steps fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.errors import ConflictError, InvalidRequestError, NotFoundError
from warren.images import LayerStore
from warren.runtime.base import RuntimeKind
from warren.store import TemplateRecord, TemplateRepo
from warren.store.db import Database
from warren.templates.build import BuildService, Usage
from warren.templates.buildlog import BuildStatus
from warren.templates.steps import parse_build_request


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[BuildService, FakeRuntime, TemplateRepo, list[Usage]]]:
    agent = FakeAgent()
    await agent.start()
    base_layer = tmp_path / "layers" / "base"
    base_layer.mkdir(parents=True)
    templates = TemplateRepo(Database(tmp_path / "w.db"))
    await templates.put(TemplateRecord("tbase", "base", "runc", (str(base_layer),), {"B": "1"}, "/home/user",
                                       "user", None, None, 2, 512, 2048, 0.0))  # fmt: skip
    runtime = FakeRuntime(RuntimeKind.RUNC, agent)
    usage = [Usage()]
    service = BuildService(settings=Settings(state_dir=tmp_path), templates=templates, runtime=runtime,
                           image_store=LayerStore(tmp_path / "images"), usage=lambda: usage[0])  # fmt: skip
    yield service, runtime, templates, usage
    await service.aclose()
    await agent.close()


async def _build(service: BuildService, name: str, body: dict[str, object]) -> BuildStatus:
    build = await service.request(name)
    started = service.start(build.template_id, build.build_id, parse_build_request(body))
    assert started.task is not None
    await started.task
    return started.log.status


async def test_a_metadata_only_build_needs_no_sandbox(env: tuple[BuildService, FakeRuntime, TemplateRepo, list[Usage]]) -> None:  # noqa: E501
    service, runtime, templates, _ = env
    status = await _build(service, "app", {"fromTemplate": "base", "steps": [{"type": "ENV", "args": ["X", "2"]}]})
    assert status is BuildStatus.READY
    record = await templates.find("app")
    assert record is not None and record.env == {"B": "1", "X": "2"}
    assert runtime.stopped == [] and runtime.running == {}


async def test_a_failed_build_stops_its_sandbox_and_leaves_nothing(
    env: tuple[BuildService, FakeRuntime, TemplateRepo, list[Usage]],
) -> None:
    service, runtime, templates, _ = env
    status = await _build(service, "app", {"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["true"]}]})
    assert status is BuildStatus.ERROR
    assert await templates.find("app") is None
    assert runtime.running == {} and [s[:3] for s in runtime.stopped] == ["bld"]
    assert sorted(p.name for p in service.layers_dir.iterdir()) == ["base"]
    assert service.layers.pinned() == frozenset()


async def test_deletion_refuses_a_template_in_use(env: tuple[BuildService, FakeRuntime, TemplateRepo, list[Usage]]) -> None:  # noqa: E501
    service, _, templates, usage = env
    usage[0] = Usage(template_ids=frozenset({"tbase"}))
    with pytest.raises(ConflictError, match="used by a sandbox"):
        await service.delete("base")
    usage[0] = Usage()
    assert (await service.delete("base")).id == "tbase"
    assert await templates.find("base") is None
    with pytest.raises(NotFoundError):
        await service.delete("base")


async def test_requests_are_checked(env: tuple[BuildService, FakeRuntime, TemplateRepo, list[Usage]]) -> None:
    service, *_ = env
    with pytest.raises(InvalidRequestError, match="unknown runtime"):
        await service.request("app", runtime="kvm")
    with pytest.raises(InvalidRequestError, match="cpuCount must be an integer"):
        await service.request("app", cpu_count=True)
    first = await service.request("app")
    second = await service.request("app")  # a requested, unstarted build is superseded
    assert service.builds_of(first.template_id) == []
    assert [b.build_id for b in service.builds_of(second.template_id)] == [second.build_id]
