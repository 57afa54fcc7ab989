"""The served OpenAPI document is a contract: it names exactly the routes the node serves, defines
every path parameter, and every operation that reads a JSON body documents it (schemathesis then runs
over it against a real node: tests/e2e/test_openapi_fuzz.py)."""

from __future__ import annotations

import re

from starlette.routing import Route

from warren.api.app import ROUTE_MODULES
from warren.api.openapi import OPENAPI, OPERATIONS

_SPELLING = {"{sandbox_id}": "{sandboxID}", "{template_id}": "{templateID}", "{snapshot_id}": "{snapshotID}",
             "{node_id}": "{nodeID}"}  # fmt: skip


def _routed() -> set[tuple[str, str]]:
    out = set()
    for module in ROUTE_MODULES:
        for route in module.ROUTES:
            assert isinstance(route, Route)
            path = route.path
            for ours, theirs in _SPELLING.items():
                path = path.replace(ours, theirs)
            out |= {(m, path) for m in route.methods or () if m != "HEAD"}
    return out


def test_the_document_names_exactly_the_routes_served() -> None:
    documented = {(m.upper(), p) for p, ops in OPENAPI["paths"].items() for m in ops}
    assert documented == _routed()


def test_every_path_parameter_is_defined() -> None:
    for path, ops in OPENAPI["paths"].items():
        names = set(re.findall(r"\{([^}]+)\}", path))
        for method, op in ops.items():
            defined = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert defined == names, (method, path)


def test_bodies_and_answers_are_documented() -> None:
    schemas = OPENAPI["components"]["schemas"]
    for op in OPERATIONS:
        entry = OPENAPI["paths"][op.path][op.method]
        bodiless = ("/warren/runtimes/reload", *(f"/warren/sandboxes/{{sandboxID}}/{a}" for a in ("adopt", "release")))
        if op.method in ("post", "put") and op.path not in bodiless:
            assert "requestBody" in entry, (op.method, op.path)
        for status, answer in entry["responses"].items():
            for media in answer.get("content", {}).values():
                target = media["schema"].get("$ref", "").rsplit("/", 1)[-1]
                assert not target or target in schemas, (op.method, op.path, status, target)


def test_e2b_shapes_keep_e2b_required_fields() -> None:
    schemas = OPENAPI["components"]["schemas"]
    assert set(schemas["Sandbox"]["required"]) == {"templateID", "sandboxID", "clientID", "envdVersion"}
    assert {"templateID", "sandboxID", "startedAt", "endAt", "state"} <= set(schemas["SandboxDetail"]["required"])
    assert schemas["NewSandbox"]["required"] == ["templateID"]
