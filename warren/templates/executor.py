"""One build, start to record: its base, the cache, the steps in a build sandbox, the seal, the template.

1. the base: a template's layers, or a pulled image (the SDK's default base image is the built-in
   ``base`` template);
2. the cache: every step prefix has a key (``steps.chain_keys``); the longest prefix an earlier build
   sealed is reused and only the rest runs (``force`` and per-step ``force`` limit it);
3. the steps in a build sandbox (:mod:`warren.templates.sandbox`, :mod:`warren.templates.runner`),
   then its filesystem sealed as one new layer (:mod:`warren.templates.seal`);
4. the template record (layers = parents + the new one), written under the layers lock.

A failed build leaves nothing: no template record, no layer, no build sandbox (pulled image layers stay
in the image store until the next gc).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warren.errors import WarrenError
from warren.images import parse_reference
from warren.names import DEFAULT_TAG
from warren.runtime.base import Runtime
from warren.store import CacheEntry, TemplateRecord, TemplateRepo
from warren.templates._fs import remove_tree
from warren.templates.layers import Layers
from warren.templates.model import BASE_STEP, FINALIZE_STEP, Build, BuildFailed
from warren.templates.pulls import Puller
from warren.templates.records import built_record
from warren.templates.runner import StepRunner
from warren.templates.sandbox import build_sandbox
from warren.templates.seal import seal
from warren.templates.steps import (
    DEFAULT_USER,
    FS_STEPS,
    BuildRequest,
    Metadata,
    Step,
    apply_step,
    base_key,
    cache_search,
    chain_keys,
    env_from_image,
    fold,
    seal_point,
)
from warren.templates.uploads import UploadStore

BUILTIN_IMAGES = {"docker.io/e2bdev/base:latest": "base"}
"""The SDK's default base image (``Template()`` without ``from_*``) is the built-in ``base`` template:
both are Debian with Python, and a node need not reach Docker Hub to build from it."""


@dataclass(frozen=True)
class Base:
    """Where a build starts: the parent layers and metadata, and whether the image needs the default user."""

    parents: tuple[str, ...]
    meta: Metadata
    provision: bool
    source: dict[str, Any]
    runtime: str


@dataclass(frozen=True)
class Built:
    """A build's template record, and the template's record before it (its layers may now be garbage).

    ``current``: the build became the template's current record (it carries the ``default`` tag, or the
    template is new); a build of other tags only is kept for ``name:tag``. ``dropped``: builds no tag
    names any more (their layers may be garbage too)."""

    record: TemplateRecord
    previous: TemplateRecord | None
    current: bool = True
    dropped: tuple[TemplateRecord, ...] = ()


class Executor:
    """Runs builds (one call of :meth:`execute` per build; the caller bounds how many run at once)."""

    def __init__(
        self,
        *,
        templates: TemplateRepo,
        runtime: Runtime | None,
        layers: Layers,
        puller: Puller,
        uploads: UploadStore,
        default_runtime: str,
        step_timeout_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._templates = templates
        self._runtime = runtime
        self._layers = layers
        self._puller = puller
        self._uploads = uploads
        self._default_runtime = default_runtime
        self._step_timeout_s = step_timeout_s
        self._clock = clock

    async def execute(self, build: Build, req: BuildRequest) -> Built:
        logbook = build.log
        logbook.add(f"Building template {build.name} (build {build.build_id})")
        pinned: list[str] = []
        try:
            base = await self._resolve_base(build, req, pinned)
            keys = chain_keys(base_key(base.parents, base.meta, provision=base.provision,
                                       source=json.dumps(base.source, sort_keys=True)), req.steps)  # fmt: skip
            hit = None
            if not req.force:
                cache = await self._layers.cache_index()
                hit = cache_search(keys, req.first_forced, cache.get)
            start, lower = hit if hit is not None else (0, base.parents)
            self._layers.pin(lower, pinned)
            entries: list[CacheEntry] = []
            if hit is not None:
                entries.append(CacheEntry(keys[start], tuple(lower)))
                for step in req.steps[:start]:
                    logbook.add(f"CACHED [{step.name}/{len(req.steps)}] {step.describe()}", step=step.name)
            todo = req.steps[start:]
            provision = base.provision and hit is None
            layers = tuple(lower)
            new_layer: Path | None = None
            shell = None
            if provision or any(s.type in FS_STEPS for s in todo):
                seal_at = max(seal_point(req.steps), start)
                meta = fold(base.meta, req.steps[:start])
                new_layer, shell = await self._build_layer(build, req, lower, meta, todo, provision,
                                                           keys[seal_at], pinned)  # fmt: skip
                layers = (*lower, str(new_layer))
                entries.append(CacheEntry(keys[seal_at], tuple(layers)))
            else:
                for step in todo:
                    logbook.add(f"[{step.name}/{len(req.steps)}] {step.describe()}", step=step.name)
            try:
                return await self._commit(build, req, base, layers, entries, new_layer, shell)
            except BaseException:
                if new_layer is not None:
                    await asyncio.shield(asyncio.to_thread(remove_tree, new_layer))
                raise
        finally:
            self._layers.unpin(pinned)

    async def _resolve_base(self, build: Build, req: BuildRequest, pinned: list[str]) -> Base:
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
            self._layers.pin(parent.layers, pinned)
            logbook.add(f"FROM template {parent.name} ({parent.id})", step=BASE_STEP)
            meta = Metadata(env=dict(parent.env), workdir=parent.workdir, user=parent.user or DEFAULT_USER)
            return Base(tuple(parent.layers), meta, False, {"template": parent.id, "name": parent.name},
                        build.runtime or parent.runtime)  # fmt: skip
        assert ref is not None
        logbook.add(f"FROM image {ref}", step=BASE_STEP)
        image = await self._puller.pull(ref, req.registry_auth, lambda m: logbook.add(m, step=BASE_STEP), pinned)
        meta = Metadata(env=env_from_image(image.env), workdir=f"/home/{DEFAULT_USER}", user=DEFAULT_USER)
        source = {"image": image.reference, "digest": image.digest, "config": image.config_digest}
        return Base(tuple(str(p) for p in image.layers), meta, True, source,
                    build.runtime or self._default_runtime)  # fmt: skip

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
        """Run ``todo`` in a build sandbox over ``lower`` and seal its filesystem; (layer, shell)."""
        logbook = build.log
        runtime = self._runtime
        started = time.monotonic()
        async with build_sandbox(runtime, lower, cpu_count=build.cpu_count, memory_mb=build.memory_mb,
                                 log_to=logbook) as box:  # fmt: skip
            assert runtime is not None  # build_sandbox refuses a missing runtime
            runner = StepRunner(box.agent, logbook, self._uploads, step_timeout_s=self._step_timeout_s)
            shell = await runner.prepare(provision=provision)
            for step in todo:
                logbook.add(f"[{step.name}/{len(req.steps)}] {step.describe()}", step=step.name)
                await runner.run(step, meta, shell)
                meta = apply_step(meta, step)
            await runner.cleanup()
            try:
                layer = await seal(runtime, box.sandbox_id, key, self._layers, pinned)
            except WarrenError as exc:
                raise BuildFailed(f"sealing the build layer failed: {exc}", FINALIZE_STEP) from exc
            logbook.add(f"Sealed layer {layer.name} ({time.monotonic() - started:.1f}s in the sandbox)",
                        step=FINALIZE_STEP)  # fmt: skip
            return layer, shell

    async def _commit(
        self,
        build: Build,
        req: BuildRequest,
        base: Base,
        layers: Sequence[str],
        cache: list[CacheEntry],
        new_layer: Path | None,
        shell: str | None,
    ) -> Built:
        previous = await self._templates.find(build.template_id)
        record = built_record(build, req, previous=previous, runtime=base.runtime, source=base.source,
                              layers=layers, meta=fold(base.meta, req.steps), cache=cache, new_layer=new_layer,
                              shell=shell, now=self._clock())  # fmt: skip
        async with self._layers.lock:
            clash = await self._templates.find(build.name)
            if clash is not None and clash.id != build.template_id and clash.name == build.name:
                raise BuildFailed(f"template name '{build.name}' was taken while building", FINALIZE_STEP)
            tags = build.tags or (DEFAULT_TAG,)
            current = previous is None or DEFAULT_TAG in tags
            dropped = await self._templates.tags.record_build(record, tags, current=current, now=self._clock())
        return Built(record, previous, current, tuple(dropped))


__all__ = ["BUILTIN_IMAGES", "Base", "Built", "Executor"]
