"""Template builds: the E2B template API's engine, and image pulls as templates.

A build (``POST /v3/templates`` then ``POST /v2/templates/{id}/builds/{buildID}``) starts from a
template's layers or a pulled image, runs its steps **in a real sandbox through the guest agent**
(RUN is ``process.Process/Start``, COPY uploads the context tar over ``/files`` and unpacks it with
the agent bundle's Python), then seals the sandbox's upper directory as one new read-only layer:

1. a build sandbox ``bld…`` (runc, never listed by the manager) over the parent layers;
2. the steps, each logged under its SDK step number; a failure ends the build;
3. ``pause(FILESYSTEM)`` ends every process and unmounts the overlay; the upper dir (which already
   uses overlay whiteouts and opaque xattrs, so it works as a lower layer as it is) is renamed to
   ``state_dir/layers/build-<key>-<rand>/`` (copied with ``trees.copy_tree`` across filesystems);
4. the sandbox is stopped, the template record written (layers = parents + the new one).

Caching: every step prefix has a key (``steps.chain_keys``: the parent layers, the metadata, each
step with its COPY file hash). A template records the keys its layers stand for, so a later build
whose steps start the same way reuses those layers and runs only the rest (``force`` and per-step
``force`` limit how much may come from the cache). A failed build leaves nothing: no template
record, no layer, no build sandbox (pulled image layers stay in the image store until the next gc).

Layers are garbage-collected when nothing uses them: no template, no sandbox (running, paused or
mounted), no snapshot and no build in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import os
import secrets
import string
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from warren import names
from warren.config import Settings
from warren.errors import ConflictError, HostError, InvalidRequestError, NotFoundError, WarrenError
from warren.images import (
    Credentials,
    DigestMismatchError,
    LayerStore,
    LayerTooLargeError,
    ProgressEvent,
    PulledImage,
    RegistryAuthError,
    RegistryConfig,
    RegistryError,
    UnsafeLayerError,
    UnsupportedImageError,
    parse_reference,
    pull,
)
from warren.runtime.base import AGENT_MOUNT, PauseMode, Resources, RuntimeKind, RuntimeProbe, SandboxHandle, SandboxSpec
from warren.runtime.oci.layout import SandboxPaths
from warren.store import TemplateRecord, TemplateRepo
from warren.templates import guest_helper
from warren.templates._fs import fsync_dir, remove_tree
from warren.templates.agent_client import AgentClient, AgentError
from warren.templates.buildlog import BuildLog, BuildStatus
from warren.templates.steps import (
    DEFAULT_USER,
    FS_STEPS,
    ROOT,
    BuildRequest,
    Metadata,
    Step,
    StepType,
    account_name,
    apply_step,
    base_key,
    cache_search,
    chain_keys,
    copy_is_glob,
    copy_source_base,
    env_from_image,
    files_hash_of_tar,
    fold,
    resolve_path,
    seal_point,
)
from warren.templates.uploads import UploadStore, check_hash
from warren.trees import QUARANTINE, TreeLimitExceeded, copy_tree, move_aside

log = logging.getLogger(__name__)

LAYER_PREFIX = "build-"
SANDBOX_PREFIX = "bld"
BASE_STEP = "base"
FINALIZE_STEP = "finalize"
SCRATCH = guest_helper.SCRATCH
HELPER_ARGV = (f"{AGENT_MOUNT}/bin/python3", "-S", "-E", "-B", "-c")
HELPER_TIMEOUT_S = 600.0
AGENT_START_DEADLINE_S = 30.0
BUILD_MIN_MEMORY_MB = 1024
"""Build sandboxes get at least this much memory: package managers need more than a small template."""
DEFAULT_CPU = 2
DEFAULT_MEMORY_MB = 512
DEFAULT_DISK_MB = 2048
KEEP_FINISHED_S = 3600.0
KEEP_FINISHED_MAX = 200
BUILTIN_IMAGES = {"docker.io/e2bdev/base:latest": "base"}
"""The SDK's default base image (``Template()`` without ``from_*``) is the built-in ``base`` template:
both are Debian with Python, and a node need not reach Docker Hub to build from it."""
_ID_ALPHABET = string.ascii_lowercase + string.digits
_COPY_CHUNK = 1 << 20


def new_template_id() -> str:
    return "t" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(19))


def validate_name(name: str) -> str:
    """A template name (``warren.names``: the one rule for template and snapshot names)."""
    return names.validate_name(name, "template")


class BuildFailed(WarrenError):
    """A build step (or its base) failed; ``step`` is the SDK's step name (``base``, ``"3"``, ``finalize``)."""

    def __init__(self, message: str, step: str | None = None) -> None:
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class Usage:
    """What must not be deleted: templates sandboxes were created from, and layers anything still uses."""

    template_ids: frozenset[str] = frozenset()
    layers: frozenset[str] = frozenset()


class BuildRuntime(Protocol):
    """What builds need from a backend: the ``Runtime`` calls plus where a sandbox's upper dir lives."""

    kind: RuntimeKind

    def probe(self) -> RuntimeProbe: ...

    async def start(self, spec: SandboxSpec) -> SandboxHandle: ...

    async def stop(self, sandbox_id: str) -> None: ...

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None: ...

    def sandbox_paths(self, sandbox_id: str) -> SandboxPaths: ...

    async def neutral_upper(self, sandbox_id: str) -> Path:
        """The stopped sandbox's upper dir, re-owned as its user namespace saw it (0-based ids)."""
        ...


@dataclass
class Build:
    """One requested build, from ``POST /v3/templates`` until some time after it finished."""

    template_id: str
    build_id: str
    name: str
    cpu_count: int
    memory_mb: int
    tags: tuple[str, ...]
    runtime: str | None
    created_at: float
    log: BuildLog
    finished_at: float | None = None
    task: asyncio.Task[None] | None = None
    base_template_id: str | None = None
    files: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Base:
    parents: tuple[str, ...]
    meta: Metadata
    provision: bool
    source: dict[str, Any]
    runtime: str


class BuildService:
    """Template builds, image pulls, template deletion and layer garbage collection of one node."""

    def __init__(
        self,
        *,
        settings: Settings,
        templates: TemplateRepo,
        runtime: BuildRuntime | None,
        image_store: LayerStore,
        usage: Callable[[], Usage] = Usage,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._templates = templates
        self._runtime = runtime
        self.image_store = image_store
        self._usage = usage
        self._clock = clock
        self.uploads = UploadStore(settings.state_dir / "uploads")
        self.layers_dir = settings.state_dir / "layers"
        self._builds: dict[str, Build] = {}
        self._slots = asyncio.Semaphore(max(1, settings.build_concurrency))
        self._pulls = asyncio.Semaphore(max(1, settings.pull_concurrency))
        self._pull_counts = Counter[str]()
        """``running`` and ``waiting`` pulls (``pull_concurrency`` run at once, the rest queue)."""
        self._pins: Counter[str] = Counter()
        self._gc_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._helper_source = Path(guest_helper.__file__).read_text()
        self.on_built: Callable[[TemplateRecord], Awaitable[None]] | None = None
        """Called with each new template record (the node seals gVisor templates as memory snapshots)."""
        self.on_deleted: Callable[[TemplateRecord], Awaitable[None]] | None = None
        """Called with each deleted template (the node drops its sealed snapshot and warm pool)."""

    # ------------------------------------------------------------------ lifecycle

    async def recover(self) -> None:
        """At node start: stop build sandboxes a crash left, drop half-sealed layers, collect garbage."""
        runtime = self._runtime
        sandboxes = self._settings.state_dir / "sandboxes"
        if runtime is not None and sandboxes.is_dir():
            for entry in sorted(sandboxes.iterdir()):
                if entry.name.startswith(SANDBOX_PREFIX):
                    log.info("removing build sandbox %s left by a previous run", entry.name)
                    with contextlib.suppress(WarrenError):
                        await runtime.stop(entry.name)
        if self.layers_dir.is_dir():
            for entry in sorted(self.layers_dir.iterdir()):
                if entry.name.startswith(".tmp-" + LAYER_PREFIX):
                    try:
                        await asyncio.to_thread(remove_tree, entry)
                    except HostError as exc:
                        await asyncio.to_thread(move_aside, entry, self._settings.state_dir / QUARANTINE,
                                                f"a half-sealed build layer that cannot be removed ({exc})")
        await self.gc()

    async def aclose(self) -> None:
        """Cancel running builds; each removes its sandbox and layer on the way out."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

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
        """``POST /v3/templates``: reserve a build of template ``name`` (new, or a new build of it)."""
        validate_name(name)
        if runtime is not None and runtime not in {k.value for k in RuntimeKind}:
            raise InvalidRequestError(f"unknown runtime {runtime!r}; expected one of {[k.value for k in RuntimeKind]}")
        for value, what in ((cpu_count, "cpuCount"), (memory_mb, "memoryMB")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidRequestError(f"{what} must be an integer")
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
        if record is not None and record.build.get("build_id") == build_id:
            done = BuildLog(clock=self._clock)
            done.status = BuildStatus.READY
            return done
        raise NotFoundError(f"build {build_id} of template {template_id} not found")

    def builds_of(self, template_id: str) -> list[Build]:
        return sorted((b for b in self._builds.values() if b.template_id == template_id), key=lambda b: b.created_at)

    def _prune(self) -> None:
        now = self._clock()
        finished = sorted(
            (b for b in self._builds.values() if b.finished_at is not None), key=lambda b: b.finished_at or 0.0
        )
        excess = len(finished) - KEEP_FINISHED_MAX
        for i, b in enumerate(finished):
            if i < excess or now - (b.finished_at or now) > KEEP_FINISHED_S:
                self._builds.pop(b.build_id, None)

    # ------------------------------------------------------------------ running a build

    async def _run(self, build: Build, req: BuildRequest) -> None:
        logbook = build.log
        try:
            if self._slots.locked():
                logbook.add("Waiting for another build to finish")
            async with self._slots:
                logbook.status = BuildStatus.BUILDING
                started = time.monotonic()
                record = await self._execute(build, req)
            logbook.succeed(
                f"Template {record.name} ({record.id}) built in {time.monotonic() - started:.1f}s"
            )
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

    async def _execute(self, build: Build, req: BuildRequest) -> TemplateRecord:
        logbook = build.log
        logbook.add(f"Building template {build.name} (build {build.build_id})")
        pinned: list[str] = []
        try:
            base = await self._resolve_base(build, req, pinned)
            keys = chain_keys(base_key(base.parents, base.meta, provision=base.provision,
                                       source=json.dumps(base.source, sort_keys=True)), req.steps)  # fmt: skip
            hit = None
            if not req.force:
                cache = await self._cache_index()
                hit = cache_search(keys, req.first_forced, cache.get)
            start, lower = hit if hit is not None else (0, base.parents)
            self._pin(lower, pinned)
            entries: list[dict[str, Any]] = []
            if hit is not None:
                entries.append({"key": keys[start], "layers": list(lower)})
                for step in req.steps[:start]:
                    logbook.add(f"CACHED [{step.name}/{len(req.steps)}] {step.describe()}", step=step.name)
            meta = fold(base.meta, req.steps[:start])
            todo = req.steps[start:]
            provision = base.provision and hit is None
            layers = tuple(lower)
            new_layer: Path | None = None
            shell = None
            if provision or any(s.type in FS_STEPS for s in todo):
                seal_at = max(seal_point(req.steps), start)
                new_layer, shell = await self._build_layer(
                    build, req, lower, meta, todo, provision, keys[seal_at], pinned
                )
                layers = (*lower, str(new_layer))
                entries.append({"key": keys[seal_at], "layers": list(layers)})
            elif todo:
                for step in todo:
                    logbook.add(f"[{step.name}/{len(req.steps)}] {step.describe()}", step=step.name)
            final = fold(base.meta, req.steps)
            try:
                return await self._commit(build, req, base, layers, final, entries, new_layer, shell)
            except BaseException:
                if new_layer is not None:
                    await asyncio.shield(asyncio.to_thread(remove_tree, new_layer))
                raise
        finally:
            self._unpin(pinned)

    async def _resolve_base(self, build: Build, req: BuildRequest, pinned: list[str]) -> _Base:
        logbook = build.log
        ref = req.from_image
        template_name = req.from_template
        if ref is not None:
            try:
                normalized = str(parse_reference(ref))
            except WarrenError as exc:
                raise BuildFailed(f"invalid image reference {ref!r}: {exc}", BASE_STEP) from exc
            builtin = BUILTIN_IMAGES.get(normalized)
            if builtin is not None and await self._templates.find(builtin) is not None:
                logbook.add(f"Using the built-in template '{builtin}' for {ref}", step=BASE_STEP)
                template_name, ref = builtin, None
        if template_name is not None:
            parent = await self._templates.find(template_name)
            if parent is None:
                raise BuildFailed(f"base template '{template_name}' not found", BASE_STEP)
            if parent.id == build.template_id:
                logbook.add(f"Building on the current version of '{parent.name}'", step=BASE_STEP)
            build.base_template_id = parent.id
            self._pin(parent.layers, pinned)
            logbook.add(f"FROM template {parent.name} ({parent.id})", step=BASE_STEP)
            meta = Metadata(env=dict(parent.env), workdir=parent.workdir, user=parent.user or DEFAULT_USER)
            return _Base(tuple(parent.layers), meta, False, {"template": parent.id, "name": parent.name},
                         build.runtime or parent.runtime)  # fmt: skip
        assert ref is not None
        logbook.add(f"FROM image {ref}", step=BASE_STEP)
        image = await self._pull(ref, req.registry_auth, lambda m: logbook.add(m, step=BASE_STEP), pinned)
        meta = Metadata(env=env_from_image(image.env), workdir=f"/home/{DEFAULT_USER}", user=DEFAULT_USER)
        source = {"image": image.reference, "digest": image.digest, "config": image.config_digest}
        return _Base(tuple(str(p) for p in image.layers), meta, True, source,
                     build.runtime or self._settings.default_runtime)  # fmt: skip

    async def _build_layer(
        self,
        build: Build,
        req: BuildRequest,
        lower: Sequence[str],
        meta: Metadata,
        todo: Sequence[Step],
        provision: bool,
        key: str,
        pinned: list[str],
    ) -> tuple[Path, str]:
        """Run ``todo`` in a build sandbox over ``lower`` and seal its upper dir; (layer, shell)."""
        runtime = self._runtime
        probe = runtime.probe() if runtime is not None else RuntimeProbe(False, "runc is not configured")
        if runtime is None or not probe.available:
            raise BuildFailed(f"cannot build: runc is not available on this node ({probe.reason})", BASE_STEP)
        logbook = build.log
        sandbox_id = SANDBOX_PREFIX + "".join(secrets.choice(_ID_ALPHABET) for _ in range(17))
        spec = SandboxSpec(
            sandbox_id=sandbox_id,
            runtime=RuntimeKind.RUNC,
            layers=tuple(Path(p) for p in lower),
            resources=Resources(cpu_count=build.cpu_count, memory_mb=max(build.memory_mb, BUILD_MIN_MEMORY_MB),
                                disk_mb=DEFAULT_DISK_MB),
            allow_internet=True,
        )  # fmt: skip
        started = time.monotonic()
        try:
            try:
                handle = await runtime.start(spec)
            except WarrenError as exc:
                raise BuildFailed(f"cannot start the build sandbox: {exc}", BASE_STEP) from exc
            async with AgentClient(handle.address, handle.agent_port) as agent:
                try:
                    await agent.wait_healthy(time.monotonic() + AGENT_START_DEADLINE_S)
                    await agent.init(access_token=secrets.token_urlsafe(24), default_user=ROOT)
                except WarrenError as exc:
                    raise BuildFailed(f"the build sandbox did not come up: {exc}", BASE_STEP) from exc
                logbook.add(f"Build sandbox {sandbox_id} ready in {time.monotonic() - started:.2f}s", step=BASE_STEP)
                info = await self._helper(agent, "prepare", {}, BASE_STEP)
                shell = "/bin/bash" if info.get("bash") else "/bin/sh"
                if provision:
                    made = await self._helper(agent, "ensure_user", {"name": DEFAULT_USER}, BASE_STEP)
                    if made.get("created"):
                        logbook.add(f"Created the default user '{DEFAULT_USER}'", step=BASE_STEP)
                for step in todo:
                    logbook.add(f"[{step.name}/{len(req.steps)}] {step.describe()}", step=step.name)
                    await self._run_step(build, agent, step, meta, shell)
                    meta = apply_step(meta, step)
                await self._helper(agent, "cleanup", {}, FINALIZE_STEP)
            try:
                await runtime.pause(sandbox_id, PauseMode.FILESYSTEM)
                async with self._gc_lock:  # a gc must not see the new layer before it is pinned
                    layer = await self._seal_cancellable(await runtime.neutral_upper(sandbox_id), key)
                    self._pin([str(layer)], pinned)
            except WarrenError as exc:
                raise BuildFailed(f"sealing the build layer failed: {exc}", FINALIZE_STEP) from exc
            logbook.add(f"Sealed layer {layer.name} ({time.monotonic() - started:.1f}s in the sandbox)",
                        step=FINALIZE_STEP)  # fmt: skip
            return layer, shell
        finally:
            await asyncio.shield(self._stop_sandbox(runtime, sandbox_id))

    async def _stop_sandbox(self, runtime: BuildRuntime, sandbox_id: str) -> None:
        try:
            await runtime.stop(sandbox_id)
        except WarrenError:
            log.exception("could not remove build sandbox %s (removed at the next start)", sandbox_id)

    async def _seal_cancellable(self, upper: Path, key: str) -> Path:
        """:meth:`_seal` in a worker thread; a cancelled build stops its copy at the next entry (the copy
        removes what it made; a layer sealed anyway is unused and goes at the next gc)."""
        cancel = threading.Event()
        work = asyncio.ensure_future(asyncio.to_thread(self._seal, upper, key, cancel))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            cancel.set()
            with contextlib.suppress(BaseException):
                await work
            raise

    def _seal(self, upper: Path, key: str, cancel: threading.Event | None = None) -> Path:
        """Move (or copy) the stopped sandbox's upper dir into the layer directory."""
        self.layers_dir.mkdir(parents=True, exist_ok=True)
        name = f"{LAYER_PREFIX}{key[:16]}-{secrets.token_hex(4)}"
        final = self.layers_dir / name
        try:
            os.rename(upper, final)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise HostError(f"cannot move the build layer into {final}: {exc}") from exc
            tmp = self.layers_dir / f".tmp-{name}"
            try:
                copy_tree(upper, tmp, cancel=cancel)  # removes its partial copy itself on failure
                os.rename(tmp, final)
            except (OSError, TreeLimitExceeded) as exc:
                remove_tree(tmp)
                raise HostError(f"cannot copy the build layer into {tmp}: {exc}") from exc
            except BaseException:
                remove_tree(tmp)
                raise
        os.chmod(final, 0o755)
        fsync_dir(self.layers_dir)
        return final

    async def _run_step(self, build: Build, agent: AgentClient, step: Step, meta: Metadata, shell: str) -> None:
        logbook = build.log
        if step.type is StepType.RUN:
            cmd = step.args[0]
            user = step.args[1] if len(step.args) > 1 and step.args[1] else meta.user
            argv = [shell, "-l", "-c", cmd] if shell == "/bin/bash" else [shell, "-c", cmd]
            lines = _LineLogger(lambda text, stream: logbook.add(text, step=step.name,
                                                                 level="error" if stream == "stderr" else "info"))
            try:
                result = await agent.run(argv, user=user, cwd=meta.workdir, envs=meta.env,
                                         timeout_s=self._settings.build_step_timeout_s, on_output=lines.feed)
            except AgentError as exc:
                raise BuildFailed(f"step {step.name} ({step.describe()}) could not run: {exc}", step.name) from exc
            finally:
                lines.flush()
            if result.timed_out:
                raise BuildFailed(f"step {step.name} ({step.describe()}) was killed after "
                                  f"{self._settings.build_step_timeout_s:.0f}s", step.name)
            if result.exit_code != 0:
                detail = f" ({result.error})" if result.error and not result.error.startswith("exit status") else ""
                raise BuildFailed(
                    f"step {step.name} ({step.describe()}) failed: exit code {result.exit_code}{detail}", step.name
                )
        elif step.type is StepType.COPY:
            await self._copy(build, agent, step, meta)
        elif step.type is StepType.WORKDIR:
            path = resolve_path(step.args[0], meta)
            await self._helper(agent, "mkdir", {"path": path, "owner": meta.user}, step.name)
        elif step.type is StepType.USER:
            name = account_name(step.args[0])
            made = await self._helper(agent, "ensure_user", {"name": name}, step.name)
            if made.get("created"):
                logbook.add(f"Created user '{name}' (uid {made.get('uid')})", step=step.name)

    async def _copy(self, build: Build, agent: AgentClient, step: Step, meta: Metadata) -> None:
        assert step.files_hash is not None
        src, dest = step.args[0], step.args[1]
        upload = self.uploads.path(step.files_hash)
        if not upload.is_file():
            raise BuildFailed(f"the files of step {step.name} ({step.describe()}) were never uploaded "
                              f"(filesHash {step.files_hash})", step.name)  # fmt: skip

        def verify() -> str:
            with open(upload, "rb") as fh:
                return files_hash_of_tar(fh, src, dest)

        try:
            actual = await asyncio.to_thread(verify)
        except WarrenError as exc:
            self.uploads.remove(step.files_hash)
            raise BuildFailed(f"step {step.name}: {exc}", step.name) from exc
        if actual != step.files_hash:
            self.uploads.remove(step.files_hash)
            raise BuildFailed(
                f"the uploaded files of step {step.name} ({step.describe()}) do not match their filesHash "
                f"{step.files_hash} (got {actual}); the upload was discarded, build again to re-send it",
                step.name,
            )
        remote = f"{SCRATCH}/{step.files_hash}.tar"
        try:
            await agent.write_file(remote, _read_chunks(upload), user=ROOT)
        except AgentError as exc:
            raise BuildFailed(f"step {step.name}: copying the files into the build sandbox failed: {exc}",
                              step.name) from exc  # fmt: skip
        target = resolve_path(dest, meta) + ("/" if dest.endswith("/") else "")
        owner = step.args[2] if len(step.args) > 2 and step.args[2] else meta.user
        args = {"tar": remote, "src": copy_source_base(src), "dest": target, "owner": owner,
                "mode": step.args[3] if len(step.args) > 3 else "", "glob": copy_is_glob(src)}  # fmt: skip
        done = await self._helper(agent, "copy", args, step.name)
        build.log.add(f"Copied {src} to {done.get('target', target)}", step=step.name)

    async def _helper(self, agent: AgentClient, op: str, args: Mapping[str, Any], step: str) -> dict[str, Any]:
        argv = [*HELPER_ARGV, self._helper_source, op, json.dumps(dict(args))]
        try:
            result = await agent.run(argv, user=ROOT, cwd="/", timeout_s=HELPER_TIMEOUT_S)
        except AgentError as exc:
            raise BuildFailed(f"step {step}: {op} failed in the build sandbox: {exc}", step) from exc
        if not result.ok:
            reason = result.output_tail() or f"exit code {result.exit_code}"
            raise BuildFailed(f"step {step}: {reason}", step)
        try:
            out = json.loads(result.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise BuildFailed(f"step {step}: {op} answered {result.stdout[-200:]!r}", step) from exc
        return out if isinstance(out, dict) else {}

    async def _commit(
        self,
        build: Build,
        req: BuildRequest,
        base: _Base,
        layers: Sequence[str],
        meta: Metadata,
        cache: list[dict[str, Any]],
        new_layer: Path | None,
        shell: str | None,
    ) -> TemplateRecord:
        previous = await self._templates.find(build.template_id)
        record = TemplateRecord(
            id=build.template_id,
            name=build.name,
            runtime=base.runtime,
            layers=tuple(layers),
            env=dict(meta.env),
            workdir=meta.workdir,
            user=meta.user,
            start_cmd=req.start_cmd,
            ready_cmd=req.ready_cmd,
            cpu_count=build.cpu_count,
            memory_mb=build.memory_mb,
            disk_mb=previous.disk_mb if previous else DEFAULT_DISK_MB,
            created_at=previous.created_at if previous else self._clock(),
            build={
                "build_id": build.build_id,
                "built_at": self._clock(),
                "source": base.source,
                "steps": len(req.steps),
                "cache": cache,
                "layer": str(new_layer) if new_layer else None,
                "files": sorted(build.files),
                "tags": list(build.tags),
                "shell": shell,
                "build_count": int(previous.build.get("build_count", 1)) + 1 if previous else 1,
            },
        )
        async with self._gc_lock:
            clash = await self._templates.find(build.name)
            if clash is not None and clash.id != build.template_id and clash.name == build.name:
                raise BuildFailed(f"template name '{build.name}' was taken while building", FINALIZE_STEP)
            await self._templates.put(record)
        if previous is not None:
            await self.gc(candidates=previous.layers)
        if self.on_built is not None:
            await self.on_built(record)
        return record

    # ------------------------------------------------------------------ image pulls

    def registry_config(self, image: str | None = None, auth: tuple[str, str] | None = None) -> RegistryConfig:
        s = self._settings
        config = RegistryConfig(
            mirrors=s.registry_mirrors,
            insecure=frozenset(s.insecure_registries),
            max_layer_bytes=s.max_layer_bytes,
            max_layer_unpacked_bytes=s.max_layer_unpacked_bytes,
        )
        if s.registry_auth_file is not None:
            config = config.with_docker_config(s.registry_auth_file)
        if auth is not None and image is not None:
            host = parse_reference(image).registry
            config = dataclasses.replace(config, credentials={**config.credentials, host: Credentials(*auth)})
        return config

    async def _pull(
        self,
        ref: str,
        auth: tuple[str, str] | None,
        say: Callable[[str], None],
        pinned: list[str],
        progress: Callable[[ProgressEvent], None] | None = None,
    ) -> PulledImage:
        started = time.monotonic()

        def on_event(event: ProgressEvent) -> None:
            if progress is not None:
                progress(event)
            short = event.digest.removeprefix("sha256:")[:12]
            if event.kind == "resolved":
                say(f"Resolved {ref} to {event.digest}")
            elif event.kind == "exists":
                say(f"Layer {short} is stored already")
            elif event.kind == "download":
                say(f"Downloading layer {short} ({event.total} bytes)")
            elif event.kind == "unpacked":
                say(f"Unpacked layer {short}")
            elif event.kind == "warning":
                say(f"Warning: layer {short}: {event.message}")

        try:
            async with self._pull_slot(say):
                image = await pull(ref, self.image_store, config=self.registry_config(ref, auth), progress=on_event)
        except WarrenError as exc:
            raise BuildFailed(describe_pull_error(ref, exc), BASE_STEP) from exc
        self._pin([str(p) for p in image.layers], pinned)
        say(f"Pulled {image.reference} ({len(image.layers)} layers) in {time.monotonic() - started:.1f}s")
        return image

    @contextlib.asynccontextmanager
    async def _pull_slot(self, say: Callable[[str], None]) -> AsyncIterator[None]:
        """One of ``pull_concurrency`` pull slots; a pull over the limit waits (queued, never refused)."""
        if self._pulls.locked():
            say("Waiting for another image pull to finish")
        self._pull_counts["waiting"] += 1
        try:
            await self._pulls.acquire()
        finally:
            self._pull_counts["waiting"] -= 1
        self._pull_counts["running"] += 1
        try:
            yield
        finally:
            self._pull_counts["running"] -= 1
            self._pulls.release()

    def limits(self) -> dict[str, dict[str, int]]:
        """Pulls and builds running and waiting, with their limits (``/health``)."""
        building = [b for b in self._builds.values() if b.task is not None and not b.log.status.finished]
        running = sum(1 for b in building if b.log.status is BuildStatus.BUILDING)
        return {
            "pulls": {**{k: self._pull_counts[k] for k in ("running", "waiting")},
                      "max": max(1, self._settings.pull_concurrency)},
            "builds": {"running": running, "waiting": len(building) - running,
                       "max": max(1, self._settings.build_concurrency)},
        }  # fmt: skip

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
        if runtime is not None and runtime not in {k.value for k in RuntimeKind}:
            raise InvalidRequestError(f"unknown runtime {runtime!r}")
        if await self._templates.find(name) is not None or any(
            b.name == name and not b.log.status.finished for b in self._builds.values()
        ):
            raise ConflictError(f"template '{name}' exists already; delete it first or choose another name")
        pinned: list[str] = []
        try:
            pulled = await self._pull(image, None, say or (lambda _: None), pinned, progress)
            user = account_name(pulled.user) if pulled.user else ROOT
            record = TemplateRecord(
                id=new_template_id(),
                name=name,
                runtime=runtime or self._settings.default_runtime,
                layers=tuple(str(p) for p in pulled.layers),
                env=env_from_image(pulled.env),
                workdir=pulled.workdir or None,
                user=user,
                start_cmd=None,
                ready_cmd=None,
                cpu_count=DEFAULT_CPU,
                memory_mb=DEFAULT_MEMORY_MB,
                disk_mb=DEFAULT_DISK_MB,
                created_at=self._clock(),
                build={
                    "build_id": str(uuid.uuid4()),
                    "source": {"image": pulled.reference, "digest": pulled.digest, "config": pulled.config_digest},
                    "diff_ids": list(pulled.diff_ids),
                    "entrypoint": list(pulled.entrypoint),
                    "cmd": list(pulled.cmd),
                    "pulled": True,
                },
            )
            async with self._gc_lock:
                if await self._templates.find(name) is not None:
                    raise ConflictError(f"template '{name}' exists already")
                await self._templates.put(record)
            return record
        finally:
            self._unpin(pinned)

    # ------------------------------------------------------------------ deletion and garbage

    async def delete(self, id_or_name: str) -> TemplateRecord:
        """Delete a template and the layers only it used; ``ConflictError`` while a sandbox or build uses it."""
        record = await self._templates.find(id_or_name)
        if record is None:
            raise NotFoundError(f"template '{id_or_name}' not found")
        usage = self._usage()
        if record.id in usage.template_ids:
            raise ConflictError(f"template '{record.name}' is used by a sandbox; kill its sandboxes first")
        for build in self._builds.values():
            if not build.log.status.finished and record.id in (build.base_template_id, build.template_id):
                if build.task is not None:
                    raise ConflictError(f"template '{record.name}' is used by build {build.build_id}")
        async with self._gc_lock:
            await self._templates.delete(record.id)
        if self.on_deleted is not None:
            await self.on_deleted(record)
        await self.gc(candidates=record.layers)
        return record

    def _pin(self, layers: Iterable[str], pinned: list[str]) -> None:
        for layer in layers:
            self._pins[layer] += 1
            pinned.append(layer)

    def _unpin(self, pinned: list[str]) -> None:
        for layer in pinned:
            self._pins[layer] -= 1
            if self._pins[layer] <= 0:
                del self._pins[layer]
        pinned.clear()

    async def _cache_index(self) -> dict[str, tuple[str, ...]]:
        """Cache key -> layers, from every template's build record (entries whose layers are gone skipped)."""
        records = await self._templates.all()

        def index() -> dict[str, tuple[str, ...]]:
            out: dict[str, tuple[str, ...]] = {}
            for record in records:
                for entry in record.build.get("cache", ()):
                    layers = tuple(entry.get("layers", ()))
                    if layers and all(Path(p).is_dir() for p in layers):
                        out.setdefault(str(entry.get("key")), layers)
            return out

        return await asyncio.to_thread(index)

    async def gc(self, candidates: Iterable[str] = ()) -> list[str]:
        """Remove layers nothing uses: build layers, the given candidates under ``layers/``, image layers.

        In use: any template's layers, any sandbox's or snapshot's (``usage``), any overlay mounted
        now, and the pins of builds and pulls in progress. Returns the removed paths.
        """
        async with self._gc_lock:
            records = await self._templates.all()
            usage = self._usage()
            used = {p for r in records for p in r.layers} | set(usage.layers) | set(self._pins)
            used |= await asyncio.to_thread(mounted_lower_dirs)
            removed: list[str] = []
            wanted = {str(p) for p in candidates}
            if self.layers_dir.is_dir():
                for entry in sorted(self.layers_dir.iterdir()):
                    path = str(entry)
                    own = entry.name.startswith(LAYER_PREFIX) or path in wanted
                    if own and not entry.name.startswith(".") and path not in used and entry.is_dir():
                        await asyncio.to_thread(remove_tree, entry)
                        removed.append(path)
            store_dir = self.image_store.layers_dir
            diff_ids = {f"sha256:{Path(p).name}" for p in used if Path(p).parent == store_dir}
            for gone in await asyncio.to_thread(self.image_store.gc, diff_ids):
                removed.append(str(self.image_store.root / gone))
            keep = {h for r in records for h in r.build.get("files", ())}
            keep |= {h for b in self._builds.values() for h in b.files}
            await asyncio.to_thread(self.uploads.gc, keep)
        if removed:
            log.info("removed unused layers: %s", ", ".join(removed))
        return removed


class _LineLogger:
    """Splits process output into lines for the build log (partial lines wait for their newline)."""

    def __init__(self, emit: Callable[[str, str], None]) -> None:
        self._emit = emit
        self._partial: dict[str, bytes] = {}

    def feed(self, stream: str, data: bytes) -> None:
        buf = self._partial.get(stream, b"") + data
        *lines, rest = buf.split(b"\n")
        for line in lines:
            self._emit(line.decode(errors="replace").rstrip("\r"), stream)
        if len(rest) > 8192:
            self._emit(rest.decode(errors="replace"), stream)
            rest = b""
        self._partial[stream] = rest

    def flush(self) -> None:
        for stream, rest in self._partial.items():
            if rest:
                self._emit(rest.decode(errors="replace").rstrip("\r"), stream)
        self._partial.clear()


async def _read_chunks(path: Path) -> AsyncIterator[bytes]:
    fh = await asyncio.to_thread(path.open, "rb")
    try:
        while chunk := await asyncio.to_thread(fh.read, _COPY_CHUNK):
            yield chunk
    finally:
        fh.close()


def mounted_lower_dirs(mountinfo: Path = Path("/proc/self/mountinfo")) -> set[str]:
    """Every ``lowerdir`` of the overlay mounts in our mount namespace."""
    found: set[str] = set()
    try:
        text = mountinfo.read_text()
    except OSError:
        return found
    for line in text.splitlines():
        _, sep, tail = line.partition(" - ")
        parts = tail.split(" ")
        if not sep or len(parts) < 3 or parts[0] != "overlay":
            continue
        for option in parts[2].split(","):
            if option.startswith("lowerdir="):
                found.update(p.replace("\\040", " ") for p in option[len("lowerdir="):].split(":") if p)
    return found


def check_resources(settings: Settings, cpu_count: int | None, memory_mb: int | None) -> None:
    """A template's ``cpuCount``/``memoryMB`` within the node's bounds, else 400 naming the bound (E2B's wording)."""
    if cpu_count is not None:
        if cpu_count < settings.min_cpu:
            raise InvalidRequestError(f"CPU count must be at least {settings.min_cpu}")
        if cpu_count > settings.max_cpu:
            raise InvalidRequestError(f"CPU count can't be higher than {settings.max_cpu} (WARREN_MAX_CPU)")
    if memory_mb is not None:
        if memory_mb < settings.min_memory_mb:
            raise InvalidRequestError(f"Memory must be at least {settings.min_memory_mb} MiB")
        if memory_mb > settings.max_memory_mb:
            raise InvalidRequestError(
                f"Memory can't be higher than {settings.max_memory_mb} MiB (WARREN_MAX_MEMORY_MB)"
            )


def describe_pull_error(ref: str, exc: WarrenError) -> str:
    """A build error message for a failed pull (registry credentials are never our API's 401)."""
    if isinstance(exc, RegistryAuthError):
        return (f"the registry refused access to {ref}: {exc} (set credentials with fromImage username/password "
                f"or the node's WARREN_REGISTRY_AUTH docker config)")  # fmt: skip
    if isinstance(exc, NotFoundError):
        return f"image {ref} not found: {exc}"
    if isinstance(exc, DigestMismatchError):
        return f"image {ref} is corrupt (digest mismatch): {exc}"
    if isinstance(exc, UnsafeLayerError):
        return f"image {ref} has an unsafe layer: {exc}"
    if isinstance(exc, UnsupportedImageError):
        return f"image {ref} is not supported: {exc}"
    if isinstance(exc, LayerTooLargeError):
        return f"image {ref} is too large: {exc}"
    if isinstance(exc, RegistryError):
        return f"cannot pull {ref}: {exc}"
    return f"pulling {ref} failed: {exc}"


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
