"""Template builds: the E2B template API's engine, and image pulls as templates.

A build (``POST /v3/templates`` then ``POST /v2/templates/{id}/builds/{buildID}``) starts from a
template's layers or a pulled image, runs its steps **in a real sandbox through the guest agent** and
seals the sandbox's filesystem changes as one new read-only layer (:mod:`warren.templates.executor`).
:class:`BuildService` is the facade the API and the node use: it keeps the builds this node knows,
runs ``build_concurrency`` of them at once (the rest wait), and deletes templates.

Layers are garbage-collected when nothing uses them: no template, no sandbox (running, paused or
mounted), no snapshot and no build in progress (:mod:`warren.templates.layers`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path

from warren.config import Settings
from warren.errors import ConflictError, NotFoundError, WarrenError
from warren.images import LayerStore, ProgressEvent
from warren.names import DEFAULT_TAG, split_reference, validate_tags
from warren.runtime.base import Runtime
from warren.store import TemplateRecord, TemplateRepo
from warren.templates.buildlog import BuildLog, BuildStatus
from warren.templates.executor import Executor
from warren.templates.layers import Layers, Usage, mounted_lower_dirs
from warren.templates.model import (
    BASE_STEP,
    DEFAULT_CPU,
    DEFAULT_MEMORY_MB,
    FINALIZE_STEP,
    LAYER_PREFIX,
    SANDBOX_PREFIX,
    Build,
    BuildFailed,
)
from warren.templates.pulls import Puller, describe_pull_error
from warren.templates.records import (
    check_resources,
    check_runtime,
    new_template_id,
    pulled_record,
    validate_name,
)
from warren.templates.steps import BuildRequest
from warren.templates.tags import TemplateTags
from warren.templates.uploads import UploadStore, check_hash

log = logging.getLogger(__name__)

KEEP_FINISHED_S = 3600.0
KEEP_FINISHED_MAX = 200

BuildRuntime = Runtime
"""What builds need from a backend: the ``Runtime`` protocol (start, pause, export_filesystem, stop)."""


class BuildService:
    """Template builds, image pulls, template deletion and layer garbage collection of one node."""

    def __init__(
        self,
        *,
        settings: Settings,
        templates: TemplateRepo,
        runtime: Runtime | None,
        image_store: LayerStore,
        usage: Callable[[], Usage] = Usage,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._templates = templates
        self._runtime = runtime
        self._usage = usage
        self._clock = clock
        self.image_store = image_store
        self.uploads = UploadStore(settings.state_dir / "uploads")
        self.layers = Layers(layers_dir=settings.state_dir / "layers", templates=templates, image_store=image_store,
                             uploads=self.uploads, usage=usage, uploads_in_use=self._uploads_in_use)  # fmt: skip
        self.puller = Puller(settings, image_store, self.layers)
        self._executor = Executor(templates=templates, runtime=runtime, layers=self.layers, puller=self.puller,
                                  uploads=self.uploads, default_runtime=settings.default_runtime,
                                  step_timeout_s=settings.build_step_timeout_s, clock=clock)  # fmt: skip
        self._builds: dict[str, Build] = {}
        self._slots = asyncio.Semaphore(max(1, settings.build_concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        """Invariant: every started build's task until it ends (cancelled and awaited by :meth:`aclose`)."""
        self.on_built: Callable[[TemplateRecord], Awaitable[None]] | None = None
        """Called with each new template record (the node seals gVisor templates as memory snapshots)."""
        self.on_deleted: Callable[[TemplateRecord], Awaitable[None]] | None = None
        """Called with each deleted template (the node drops its sealed snapshot and warm pool)."""
        self.tags = TemplateTags(templates, gc=self.gc, clock=clock, on_current=self._current_changed)

    async def _current_changed(self, record: TemplateRecord) -> None:
        """A tag move made another build the template's current record: as after a build of it."""
        if self.on_built is not None:
            await self.on_built(record)

    @property
    def layers_dir(self) -> Path:
        return self.layers.dir

    # ------------------------------------------------------------------ lifecycle

    async def recover(self) -> None:
        """At node start: drop half-sealed layers, collect garbage.

        Build sandboxes a crash left are not in the store, so the node's orphan reaper
        (:mod:`warren.runtime.reaper`, run before this) has removed them with everything they held.
        """
        await self.layers.drop_half_sealed(self._settings.state_dir)
        await self.gc()

    async def aclose(self) -> None:
        """Cancel running builds; each removes its sandbox and layer on the way out."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def gc(self, candidates: Iterable[str] = ()) -> list[str]:
        """Remove layers nothing uses (:meth:`warren.templates.layers.Layers.gc`)."""
        return await self.layers.gc(candidates)

    def _uploads_in_use(self) -> set[str]:
        return {h for b in self._builds.values() for h in b.files}

    # ------------------------------------------------------------------ the E2B template API

    async def request(
        self,
        name: str,
        *,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        tags: Sequence[str] = (),
        runtime: str | None = None,
    ) -> Build:
        """``POST /v3/templates``: reserve a build of template ``name`` (new, or a new build of it).

        ``name:tag`` is ``name`` with ``tag`` added to ``tags`` (E2B); no tags at all means ``default``."""
        validate_name(name)  # the whole reference first: reserved forms (template:...) are refused as they are
        name, tag = split_reference(name)
        tags = validate_tags([*tags, tag] if tag is not None and tag != DEFAULT_TAG else list(tags))
        validate_name(name)
        check_runtime(runtime)
        check_resources(self._settings, cpu_count, memory_mb)
        self._prune()
        for other in list(self._builds.values()):
            if other.name == name and not other.log.status.finished:
                if other.task is not None:
                    raise ConflictError(f"template '{name}' is being built already (build {other.build_id})")
                del self._builds[other.build_id]  # requested but never started: superseded
        existing = await self._templates.find(name)
        template_id = existing.id if existing is not None and existing.name == name else new_template_id()
        build = Build(
            template_id=template_id,
            build_id=str(uuid.uuid4()),
            name=name,
            cpu_count=cpu_count or (existing.cpu_count if existing else DEFAULT_CPU),
            memory_mb=memory_mb or (existing.memory_mb if existing else DEFAULT_MEMORY_MB),
            tags=tuple(tags),
            runtime=runtime,
            created_at=self._clock(),
            log=BuildLog(clock=self._clock),
        )
        self._builds[build.build_id] = build
        return build

    async def _known_template(self, template_id: str) -> None:
        if any(b.template_id == template_id for b in self._builds.values()):
            return
        if await self._templates.find(template_id) is None:
            raise NotFoundError(f"template {template_id} not found")

    async def files_present(self, template_id: str, files_hash: str) -> bool:
        """``GET /templates/{id}/files/{hash}``: whether that upload is stored (uploads are shared)."""
        check_hash(files_hash)
        await self._known_template(template_id)
        return self.uploads.has(files_hash)

    async def receive_upload(self, template_id: str, files_hash: str, chunks: AsyncIterator[bytes]) -> int:
        check_hash(files_hash)
        await self._known_template(template_id)
        return await self.uploads.receive(files_hash, chunks, max_bytes=self._settings.max_upload_bytes)

    def start(self, template_id: str, build_id: str, req: BuildRequest) -> Build:
        """``POST /v2/templates/{id}/builds/{buildID}``: run the build in the background."""
        build = self._builds.get(build_id)
        if build is None or build.template_id != template_id:
            raise NotFoundError(f"build {build_id} of template {template_id} not found")
        if build.task is not None:
            raise ConflictError(f"build {build_id} was started already")
        build.files = {s.files_hash for s in req.steps if s.files_hash}
        task = asyncio.create_task(self._run(build, req), name=f"build {build.name}")
        build.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return build

    async def status(self, template_id: str, build_id: str) -> BuildLog:
        build = self._builds.get(build_id)
        if build is not None and build.template_id == template_id:
            return build.log
        record = await self._templates.find(template_id)
        kept = {r.build.build_id for r in await self._templates.tags.builds() if r.id == template_id}
        if record is not None and (record.build.build_id == build_id or build_id in kept):
            done = BuildLog(clock=self._clock)
            done.status = BuildStatus.READY
            return done
        raise NotFoundError(f"build {build_id} of template {template_id} not found")

    def builds_of(self, template_id: str) -> list[Build]:
        return sorted((b for b in self._builds.values() if b.template_id == template_id), key=lambda b: b.created_at)

    def limits(self) -> dict[str, dict[str, int]]:
        """Pulls and builds running and waiting, with their limits (``/health``)."""
        building = [b for b in self._builds.values() if b.running]
        running = sum(1 for b in building if b.log.status is BuildStatus.BUILDING)
        return {
            "pulls": self.puller.limits(),
            "builds": {"running": running, "waiting": len(building) - running,
                       "max": max(1, self._settings.build_concurrency)},
        }  # fmt: skip

    def _prune(self) -> None:
        now = self._clock()
        finished = sorted(
            (b for b in self._builds.values() if b.finished_at is not None), key=lambda b: b.finished_at or 0.0
        )
        excess = len(finished) - KEEP_FINISHED_MAX
        for i, b in enumerate(finished):
            if i < excess or now - (b.finished_at or now) > KEEP_FINISHED_S:
                self._builds.pop(b.build_id, None)

    async def _run(self, build: Build, req: BuildRequest) -> None:
        logbook = build.log
        try:
            if self._slots.locked():
                logbook.add("Waiting for another build to finish")
            async with self._slots:
                logbook.status = BuildStatus.BUILDING
                started = time.monotonic()
                built = await self._executor.execute(build, req)
                garbage = [p for r in built.dropped for p in r.layers]
                if built.current and built.previous is not None:
                    garbage += built.previous.layers
                if garbage:
                    await self.gc(candidates=garbage)
                if built.current and self.on_built is not None:
                    await self.on_built(built.record)
            record = built.record
            logbook.succeed(f"Template {record.name} ({record.id}) built in {time.monotonic() - started:.1f}s")
        except asyncio.CancelledError:
            logbook.fail("the build was cancelled (the node is shutting down)")
            raise
        except BuildFailed as exc:
            logbook.fail(str(exc), step=exc.step)
        except WarrenError as exc:
            logbook.fail(f"build failed: {exc}")
        except Exception as exc:
            log.exception("build %s of %s failed", build.build_id, build.name)
            logbook.fail(f"build failed with an internal error: {exc!r}")
        finally:
            build.finished_at = self._clock()

    # ------------------------------------------------------------------ pulls and deletion

    async def pull_template(
        self,
        image: str,
        name: str,
        *,
        runtime: str | None = None,
        progress: Callable[[ProgressEvent], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> TemplateRecord:
        """Pull ``image`` and make it template ``name`` (409 if the name is taken)."""
        validate_name(name)
        check_runtime(runtime)
        if await self._templates.find(name) is not None or any(
            b.name == name and not b.log.status.finished for b in self._builds.values()
        ):
            raise ConflictError(f"template '{name}' exists already; delete it first or choose another name")
        pinned: list[str] = []
        try:
            pulled = await self.puller.pull(image, None, say or (lambda _: None), pinned, progress)
            record = pulled_record(pulled, name, runtime or self._settings.default_runtime, self._clock())
            async with self.layers.lock:
                if await self._templates.find(name) is not None:
                    raise ConflictError(f"template '{name}' exists already")
                await self._templates.put(record)
            return record
        finally:
            self.layers.unpin(pinned)

    async def delete(self, id_or_name: str) -> TemplateRecord:
        """Delete a template and the layers only it used; ``ConflictError`` while a sandbox or build uses it."""
        record = await self._templates.find(id_or_name)
        if record is None:
            raise NotFoundError(f"template '{id_or_name}' not found")
        if record.id in self._usage().template_ids:
            raise ConflictError(f"template '{record.name}' is used by a sandbox; kill its sandboxes first")
        for build in self._builds.values():
            if build.running and record.id in (build.base_template_id, build.template_id):
                raise ConflictError(f"template '{record.name}' is used by build {build.build_id}")
        tagged = [r for r in await self._templates.tags.builds() if r.id == record.id]
        async with self.layers.lock:
            await self._templates.delete(record.id)
        if self.on_deleted is not None:
            await self.on_deleted(record)
        await self.gc(candidates=[*record.layers, *(p for r in tagged for p in r.layers)])
        return record


__all__ = [
    "BASE_STEP",
    "FINALIZE_STEP",
    "LAYER_PREFIX",
    "SANDBOX_PREFIX",
    "Build",
    "BuildFailed",
    "BuildRuntime",
    "BuildService",
    "Usage",
    "check_resources",
    "describe_pull_error",
    "mounted_lower_dirs",
    "new_template_id",
    "validate_name",
]
