"""Every template and image route is in the OpenAPI document, and bodies carry what the SDK parses."""

from __future__ import annotations

from e2b.api.client.models import Template, TemplateWithBuilds

from warren.api.openapi import OPENAPI
from warren.api.routes import images, templates
from warren.store import Provenance, TemplateRecord


def test_openapi_covers_template_and_image_routes() -> None:
    documented = {(m.upper(), p.replace("{templateID}", "{template_id}")) for p, ops in OPENAPI["paths"].items()
                  for m in ops}  # fmt: skip
    for route in [*templates.ROUTES, *images.ROUTES]:
        for method in route.methods or ():
            if method != "HEAD":
                assert (method, route.path) in documented, (method, route.path)


def test_template_bodies_parse_with_the_sdk_models() -> None:
    rec = TemplateRecord("t1", "web", "runc", ("/l/1",), {"A": "1"}, "/app", "user", "serve", "true", 2, 512, 2048,
                         1_700_000_000.0, Provenance(build_id="6f1f7c1e-5d2b-4a53-9d5e-2b8c8f0c1a11", build_count=3))
    listed = Template.from_dict(templates.template_body(rec))
    assert listed.template_id == "t1" and listed.names == ["web"] and listed.build_count == 3
    detail = TemplateWithBuilds.from_dict(templates.detail_body(rec, []))
    assert str(detail.builds[0].build_id) == "6f1f7c1e-5d2b-4a53-9d5e-2b8c8f0c1a11"
    imported = TemplateRecord("t2", "base", "runc", ("/l/b",), {}, None, None, None, None, 2, 512, 2048, 0.0)
    assert TemplateWithBuilds.from_dict(templates.detail_body(imported, [])).builds[0].build_id  # a stable uuid
