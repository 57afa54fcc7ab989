"""The node's runtimes as the orchestrator sees them: which are usable, which binary a sandbox runs
on (its recorded runtime hash), and the spec a record turns into."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..errors import InvalidRequestError, UnavailableError
from ..runtime.base import Resources, Runtime, RuntimeKind, RuntimeProbe, SandboxSpec
from ..runtime.registry import RuntimeRegistry, StagedRuntime
from ..store import SandboxRecord

AGENT_START_DEADLINE_S = {RuntimeKind.RUNC: 30.0, RuntimeKind.GVISOR: 60.0}
"""How long a started or resumed sandbox's agent has to answer /health."""


class RuntimeSet:
    def __init__(self, runtimes: Mapping[RuntimeKind, Runtime], registry: RuntimeRegistry | None = None) -> None:
        self._runtimes = runtimes
        self._registry = registry

    @property
    def all(self) -> Mapping[RuntimeKind, Runtime]:
        return self._runtimes

    def of(self, kind: RuntimeKind) -> Runtime:
        """The configured runtime of this kind, usable or not (for stop, state, locate)."""
        return self._runtimes[kind]

    def available(self, kind: RuntimeKind) -> Runtime:
        """The runtime of this kind if its probe passed; ``UnavailableError`` (503) otherwise."""
        runtime = self._runtimes.get(kind)
        probe = runtime.probe() if runtime else RuntimeProbe(False, "not configured")
        if runtime is None or not probe.available:
            raise UnavailableError(f"runtime {kind.value} is not available on this node: {probe.reason}")
        return runtime

    @staticmethod
    def kind(name: str) -> RuntimeKind:
        try:
            return RuntimeKind(name)
        except ValueError:
            raise InvalidRequestError(
                f"unknown runtime {name!r}; expected one of {[k.value for k in RuntimeKind]}"
            ) from None

    async def stage(self, runtime_hash: str | None, kind: RuntimeKind) -> StagedRuntime | None:
        """The runtime to run on: the recorded hash (409 if the index misses it), else the default."""
        if self._registry is None:
            return None
        if runtime_hash is None:
            runtime_hash = self._registry.default_hash(kind.value)
            if runtime_hash is None:
                return None
        return await self._registry.stage(runtime_hash)

    @staticmethod
    def spec(record: SandboxRecord, staged: StagedRuntime | None = None) -> SandboxSpec:
        return SandboxSpec(
            runtime_binary=staged.binary if staged else None,
            sandbox_id=record.id,
            runtime=RuntimeKind(record.runtime),
            layers=tuple(Path(p) for p in record.image.layers),
            resources=Resources(cpu_count=record.cpu_count, memory_mb=record.memory_mb, disk_mb=record.disk_mb),
            allow_internet=record.allow_internet,
            egress=record.egress,
        )
