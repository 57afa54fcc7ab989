"""Making ``code-interpreter-v1`` (and its gVisor variant) exist on a node: from the setup cache, else a build.

One job per template name at a time, owned here (cancelled by :meth:`Provisioner.aclose`):

* ``code-interpreter-v1``: the cached layer (:mod:`.cache`) stacked on the node's ``base``, or else a
  build by the node's template builder (:mod:`.recipe`), whose sealed layer then goes into the cache;
* ``code-interpreter-v1-gvisor``: a no-step build over ``code-interpreter-v1`` on gVisor, which the node
  seals as a memory snapshot with the kernel started (``BuildService.on_built``).

Progress lines go to the node log and to :attr:`Job.lines` (the ``/warren/templates/ensure`` stream).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from warren.errors import NotFoundError, UnavailableError, WarrenError
from warren.ids import new_template_id
from warren.store import Provenance, TemplateRecord, TemplateRepo
from warren.templates.build import BuildService
from warren.templates.buildlog import BuildStatus
from warren.templates.codeinterp import cache, recipe
from warren.templates.steps import BuildRequest

log = logging.getLogger("warren.code_interpreter")

NAMES = (recipe.NAME, recipe.GVISOR_NAME)
POLL_S = 0.5


@dataclass
class Job:
    """One template being made: its progress lines and the task making it."""

    name: str
    started: float
    lines: list[str] = field(default_factory=list)
    task: asyncio.Task[TemplateRecord] | None = None


class Provisioner:
    def __init__(
        self,
        *,
        builds: BuildService,
        templates: TemplateRepo,
        cache_dir: Path,
        state_dir: Path,
        on_imported: Callable[[TemplateRecord], Awaitable[None]] | None = None,
    ) -> None:
        self._builds = builds
        self._templates = templates
        self._cache_dir = cache_dir
        self._state_dir = state_dir
        self._on_imported = on_imported
        self._jobs: dict[str, Job] = {}
        """Invariant: a running job's task is here until it ends (cancelled and awaited by :meth:`aclose`)."""

    @staticmethod
    def handles(name: str) -> bool:
        return name in NAMES

    async def aclose(self) -> None:
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ the callers' view

    def job(self, name: str) -> Job:
        """The job making ``name``, started now unless one runs."""
        if name not in NAMES:
            raise NotFoundError(f"no built-in template named {name!r}; have {', '.join(NAMES)}")
        job = self._jobs.get(name)
        if job is None or job.task is None or job.task.done():
            job = Job(name, time.monotonic())
            job.task = asyncio.create_task(self._make(job), name=f"provision {name}")
            self._jobs[name] = job
            job.task.add_done_callback(self._ender(job))
        return job

    def _ender(self, job: Job) -> Callable[[asyncio.Task[TemplateRecord]], None]:
        def ended(_task: asyncio.Task[TemplateRecord]) -> None:
            if self._jobs.get(job.name) is job:
                del self._jobs[job.name]

        return ended

    async def ready(self, name: str, wait_s: float) -> None:
        """For a create naming ``name``: return once the template exists. A job still running after
        ``wait_s`` keeps running and the caller gets ``UnavailableError`` (503) saying so."""
        if await self._templates.find(name) is not None:
            return
        job = self.job(name)
        assert job.task is not None
        done, _ = await asyncio.wait({job.task}, timeout=wait_s)
        if not done:
            last = job.lines[-1] if job.lines else "starting"
            raise UnavailableError(
                f"template {name!r} is being built on this node (first use; {time.monotonic() - job.started:.0f}s "
                f"so far, last: {last}); retry in a minute, or build it ahead with "
                "`warren setup --with code-interpreter`"
            )
        job.task.result()

    async def follow(self, name: str) -> AsyncIterator[str]:
        """Progress lines of the job making ``name`` until it ends; raises its failure."""
        existing = await self._templates.find(name)
        if existing is not None:
            yield f"template {name} ({existing.id}) exists"
            return
        job = self.job(name)
        assert job.task is not None
        sent = 0
        while True:
            while sent < len(job.lines):
                yield job.lines[sent]
                sent += 1
            if job.task.done():
                break
            await asyncio.wait({job.task}, timeout=POLL_S)
        job.task.result()

    # ------------------------------------------------------------------ the jobs

    def _say(self, job: Job, line: str) -> None:
        job.lines.append(line)
        log.info("%s: %s", job.name, line)

    async def _make(self, job: Job) -> TemplateRecord:
        try:
            if job.name == recipe.GVISOR_NAME:
                if await self._templates.find(recipe.NAME) is None:
                    await self._make_main(job)
                return await self._build(job, recipe.variant_request(), runtime="gvisor")
            return await self._make_main(job)
        except WarrenError as exc:
            self._say(job, f"failed: {exc}")
            raise

    async def _make_main(self, job: Job) -> TemplateRecord:
        existing = await self._templates.find(recipe.NAME)
        if existing is not None:
            return existing
        base = await self._templates.find(recipe.BASE)
        if base is None:
            raise NotFoundError(f"template {recipe.BASE!r} is missing; {recipe.NAME} is built on it")
        cached = await asyncio.to_thread(cache.load, self._cache_dir)
        if cached is not None:
            self._say(job, f"importing the layer built {cached.built_at} from {cached.layer.parent}")
            return await self._import(job, base, cached)
        work = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=".ci-build-", dir=self._state_dir))
        try:
            plan = await asyncio.to_thread(recipe.plan, work, lambda line: self._say(job, line))
            self._say(job, f"building on {recipe.BASE} in a build sandbox; this takes a few minutes")
            started = time.monotonic()
            record = await self._build(job, plan.request, runtime=None, files=(plan.files_hash, plan.files_tar))
        finally:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, work, True))
        took = time.monotonic() - started
        layer = record.build.layer
        if layer is not None:
            meta = {
                "env": dict(record.env), "workdir": record.workdir, "user": record.user, "wheels": plan.wheels,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "build_s": round(took, 1),
            }  # fmt: skip
            try:
                where = await asyncio.to_thread(cache.store, self._cache_dir, Path(layer), meta)
                self._say(job, f"built in {took:.0f}s; cached in {where}")
            except WarrenError as exc:
                self._say(job, f"built in {took:.0f}s; not cached: {exc}")
        return record

    async def _build(
        self, job: Job, request: BuildRequest, *, runtime: str | None, files: tuple[str, Path] | None = None
    ) -> TemplateRecord:
        build = await self._builds.request(job.name, cpu_count=recipe.CPU_COUNT, memory_mb=recipe.MEMORY_MB,
                                           runtime=runtime)  # fmt: skip
        if files is not None:
            files_hash, tar = files

            async def chunks() -> AsyncIterator[bytes]:
                with tar.open("rb") as fh:
                    while chunk := await asyncio.to_thread(fh.read, 1 << 20):
                        yield chunk

            await self._builds.receive_upload(build.template_id, files_hash, chunks())
        self._builds.start(build.template_id, build.build_id, request)
        assert build.task is not None
        sent = 0
        while True:
            entries = build.log.entries
            while sent < len(entries):
                self._say(job, entries[sent].message)
                sent += 1
            if build.task.done():
                break
            await asyncio.wait({build.task}, timeout=POLL_S)
        for entry in build.log.entries[sent:]:
            self._say(job, entry.message)
        if build.log.status is not BuildStatus.READY:
            raise UnavailableError(f"building template {job.name} failed: {build.log.reason}")
        record = await self._templates.find(job.name)
        if record is None:
            raise UnavailableError(f"template {job.name} was built but is not in the store")
        return record

    async def _import(self, job: Job, base: TemplateRecord, cached: cache.CachedLayer) -> TemplateRecord:
        layer = await asyncio.to_thread(cache.import_layer, cached, self._state_dir)
        record = TemplateRecord(
            id=new_template_id(),
            name=recipe.NAME,
            runtime=base.runtime,
            layers=(*base.layers, str(layer)),
            env=dict(cached.env),
            workdir=cached.workdir,
            user=cached.user,
            start_cmd=recipe.START_CMD,
            ready_cmd=recipe.READY_CMD,
            cpu_count=recipe.CPU_COUNT,
            memory_mb=recipe.MEMORY_MB,
            disk_mb=base.disk_mb,
            created_at=time.time(),
            build=Provenance(source={"cache": str(cached.layer.parent), "template": base.id}, built_at=time.time()),
        )
        async with self._builds.layers.lock:
            if await self._templates.find(recipe.NAME) is not None:
                raise UnavailableError(f"template {recipe.NAME} appeared while importing it; retry")
            await self._templates.put(record)
        if self._on_imported is not None:
            await self._on_imported(record)
        self._say(job, f"template {record.name} ({record.id}) ready")
        return record


__all__ = ["NAMES", "Job", "Provisioner"]
