"""One template JSON body: the list, the detail, the node's import and the image pull all answer it."""

from __future__ import annotations

from warren.api import models
from warren.api.routes import images, node, templates
from warren.store import Provenance, TemplateRecord


def _record(build: Provenance) -> TemplateRecord:
    return TemplateRecord("tabc", "web", "runc", ("/l/1",), {"A": "1"}, "/home/user", "user", None, None,
                          2, 512, 2048, 1000.0, build=build)  # fmt: skip


def test_every_route_answers_the_one_body() -> None:
    assert templates.template_body is node.template_body is images.template_body is models.template_body


def test_an_imported_template_has_one_stable_build_id() -> None:
    rec = _record(Provenance())
    body = models.template_body(rec)
    assert body["buildID"] == models.template_body(rec)["buildID"] == models.build_id_of(rec)
    assert body["buildID"] != rec.id
    assert templates.detail_body(rec, [])["builds"][0]["buildID"] == body["buildID"]


def test_a_built_template_answers_its_build() -> None:
    body = models.template_body(_record(Provenance(build_id="b-1", built_at=2000.0, build_count=3)))
    assert body["buildID"] == "b-1" and body["buildCount"] == 3
    assert body["updatedAt"].startswith("1970-01-01T00:33:20")
