"""Template tags, E2B's rules: ``POST /templates/tags``, ``DELETE /templates/tags``, ``GET /templates/{id}/tags``.

A build with no tags gets ``default``; ``name`` means ``name:default``. Tags are trimmed, lower-cased,
``[a-z0-9._-]`` and no UUID (400 otherwise, :func:`warren.names.validate_tag`); ``default`` cannot be
removed (400); an unknown template or tag is 404. Moving ``default`` to another build makes that build
the template's current record (what ``name`` starts, what ``GET /templates/{id}`` shows). The store
keeps the tags and the builds they name (:mod:`warren.store.tags`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from warren.errors import InvalidRequestError, NotFoundError
from warren.names import DEFAULT_TAG, split_reference, validate_tags
from warren.store import TemplateRecord, TemplateRepo, TemplateTag, build_id_of


class TemplateTags:
    """Tag assignment and removal for one node's templates."""

    def __init__(
        self,
        templates: TemplateRepo,
        *,
        gc: Callable[[Iterable[str]], Awaitable[object]],
        clock: Callable[[], float],
        on_current: Callable[[TemplateRecord], Awaitable[None]],
    ) -> None:
        self._templates = templates
        self._gc = gc
        self._clock = clock
        self._on_current = on_current

    async def _template(self, name: str) -> TemplateRecord:
        record = await self._templates.find(name)
        if record is None:
            raise NotFoundError(f"template '{name}' not found")
        return record

    async def of(self, ref: str) -> list[TemplateTag]:
        """The tags of a template by id or name (a ``:tag`` on the reference is ignored, as E2B does)."""
        record = await self._templates.find(ref)
        if record is None:
            record = await self._template(split_reference(ref)[0])
        return await self._templates.tags.of(record)

    async def assign(self, target: str, tags: object) -> tuple[str, list[str]]:
        """Point ``tags`` at the build ``target`` (``name`` or ``name:tag``) names: (build id, tags)."""
        wanted = validate_tags(tags)
        if not wanted:
            raise InvalidRequestError("At least one tag is required")
        name, source = split_reference(target)
        record = await self._template(name)
        assigned = await self._templates.tags.assign(record, source or DEFAULT_TAG, wanted, self._clock())
        if assigned is None:
            raise NotFoundError(f"Template '{target}' with tag '{source or DEFAULT_TAG}' not found")
        build, dropped = assigned
        garbage = [p for r in dropped for p in r.layers]
        if DEFAULT_TAG in wanted and build_id_of(build) != build_id_of(record):
            await self._templates.put(build)
            garbage += record.layers
            await self._on_current(build)
        if garbage:
            await self._gc(garbage)
        return build_id_of(build), wanted

    async def remove(self, name: str, tags: object) -> None:
        """Remove ``tags`` from template ``name`` (tags it does not have are no error)."""
        wanted = validate_tags(tags)
        if not wanted:
            raise InvalidRequestError("At least one tag is required")
        if DEFAULT_TAG in wanted:
            raise InvalidRequestError(f"Cannot delete the '{DEFAULT_TAG}' tag")
        base, tag = split_reference(name)
        if tag not in (None, DEFAULT_TAG):
            raise InvalidRequestError("Template name should not contain a tag, use the 'tags' field instead")
        record = await self._template(base)
        dropped = await self._templates.tags.remove(record, wanted)
        if dropped:
            await self._gc([p for r in dropped for p in r.layers])


__all__ = ["TemplateTags"]
