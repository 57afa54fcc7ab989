"""Sandbox lifecycle through the unmodified E2B SDK (sync): create, list, info, timeout, kill."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import SandboxException

from tests.framework.node import Node


def test_create_with_metadata_envs_and_timeout(node: Node, template: str) -> None:
    tag = uuid.uuid4().hex
    sbx = Sandbox.create(template=template, timeout=120, metadata={"tag": tag}, envs={"GREETING": "hi"})
    try:
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == {"tag": tag}
        assert info.state.value == "running"
        assert 100 < (info.end_at - info.started_at).total_seconds() <= 121
        assert sbx.commands.run("echo $GREETING").stdout.strip() == "hi"
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_list_filters_by_metadata_and_paginates(node: Node, template: str) -> None:
    tag = uuid.uuid4().hex
    boxes = [Sandbox.create(template=template, metadata={"tag": tag, "n": str(i)}) for i in range(3)]
    other = Sandbox.create(template=template, metadata={"tag": "other"})
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        first = paginator.next_items()
        assert len(first) == 2 and paginator.has_next
        second = paginator.next_items()
        assert len(second) == 1 and not paginator.has_next
        ids = {s.sandbox_id for s in first + second}
        assert ids == {b.sandbox_id for b in boxes}
        assert all(s.metadata["tag"] == tag for s in first + second)
    finally:
        for b in [*boxes, other]:
            b.kill()


def test_set_timeout_and_expiry_kills(node: Node, template: str) -> None:
    sbx = Sandbox.create(template=template, timeout=300)
    sbx.set_timeout(2)
    info = sbx.get_info()
    assert (info.end_at - info.started_at).total_seconds() < 300
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sbx.is_running():
        time.sleep(0.2)
    assert not sbx.is_running()
    assert Sandbox.kill(sbx.sandbox_id) is False


def test_kill_twice_returns_false(node: Node, template: str) -> None:
    sbx = Sandbox.create(template=template)
    assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    assert not sbx.is_running()


def test_connect_extends_running_sandbox(node: Node, template: str) -> None:
    sbx = Sandbox.create(template=template, timeout=60)
    try:
        again = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert again.commands.run("echo ok").stdout.strip() == "ok"
        info = again.get_info()
        assert (info.end_at - info.started_at).total_seconds() > 500
    finally:
        sbx.kill()


def test_metrics_from_cgroups(node: Node, template: str) -> None:
    sbx = Sandbox.create(template=template)
    try:
        metrics = sbx.get_metrics()
        assert metrics and metrics[-1].mem_total > 0 and metrics[-1].mem_used > 0
    finally:
        sbx.kill()


def test_envd_access_token_is_enforced(node: Node, template: str) -> None:
    a = Sandbox.create(template=template)
    b = Sandbox.create(template=template)
    try:
        headers = {"E2b-Sandbox-Id": a.sandbox_id, "E2b-Sandbox-Port": "49983"}
        body = {"path": "/etc"}
        url = f"{node.url}/filesystem.Filesystem/Stat"
        assert httpx.post(url, json=body, headers=headers).status_code == 401
        wrong = {**headers, "X-Access-Token": b._envd_access_token or ""}
        assert httpx.post(url, json=body, headers=wrong).status_code == 401
        right = {**headers, "X-Access-Token": a._envd_access_token or ""}
        assert httpx.post(url, json=body, headers=right).status_code == 200
        assert httpx.get(f"{node.url}/health", headers=headers).status_code == 204
    finally:
        a.kill()
        b.kill()


def test_create_unknown_template_is_404(node: Node) -> None:
    with pytest.raises(SandboxException, match="404"):
        Sandbox.create(template="no-such-template")
