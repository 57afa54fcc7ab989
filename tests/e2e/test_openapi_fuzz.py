"""Property-based run of schemathesis over every operation of the served OpenAPI document, against a
real node: whatever the generated input, no answer is a 5xx, every status is one the document lists,
and every JSON answer matches its schema.

The node gets its own state dir, and a proxy on a closed port for outbound traffic (``HTTPS_PROXY``),
so fuzzed image references fail at once instead of waiting on a registry this machine cannot reach.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from tests.framework.node import DEFAULT_CACHE, Node, running_node
from warren.api.openapi import OPENAPI

pytestmark = [pytest.mark.root]

schema = schemathesis.openapi.from_dict(OPENAPI)

_CLOSED = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def fuzz_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("the node starts real sandboxes and needs root")
    if not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip(f"no built-in templates in {DEFAULT_CACHE}: run scripts/setup.sh first")
    env = {"HTTPS_PROXY": _CLOSED, "HTTP_PROXY": _CLOSED, "NO_PROXY": "127.0.0.1,localhost",
           "WARREN_IMPORT_ROOTS": str(tmp_path_factory.mktemp("imports"))}  # fmt: skip
    with running_node(tmp_path_factory.mktemp("fuzz") / "state", extra_env=env) as node:
        yield node


@schema.parametrize()
@settings(max_examples=int(os.environ.get("WARREN_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])  # fmt: skip
def test_no_operation_answers_5xx_or_outside_its_contract(case: schemathesis.Case, fuzz_node: Node) -> None:
    case.call_and_validate(
        base_url=fuzz_node.url,
        headers={"X-API-Key": fuzz_node.api_key},
        checks=[checks.not_a_server_error, checks.status_code_conformance, checks.response_schema_conformance,
                checks.content_type_conformance],
        timeout=60,
    )
