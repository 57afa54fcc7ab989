"""The gateway's per-node operations: one answer from many nodes' (all succeed, the same refusal, or a
502/503 naming each failing node), and NDJSON streams merged with one last line of the gateway's."""

from __future__ import annotations

import json

import httpx
from starlette.requests import Request
from starlette.responses import Response

from warren.cluster.gateway.fanout import _Answer, _merged, _one_answer
from warren.cluster.records import NodeInfo, NodeView

NDJSON = {"content-type": "application/x-ndjson"}


def node(node_id: str) -> NodeView:
    info = NodeInfo(node_id=node_id, url=f"http://{node_id}", max_sandboxes=4, active=0, running=0, paused=0,
                    draining=False, runtime_classes=("runc",), runtime_hashes=("h",))  # fmt: skip
    return NodeView(info, True)


def request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/warren/templates/import", "headers": [],
                    "query_string": b""})  # fmt: skip


def answer(node_id: str, status: int | None, body: object = None, headers: dict[str, str] | None = None) -> _Answer:
    if status is None:
        return _Answer(node(node_id), None, "ConnectError: refused")
    content = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    return _Answer(node(node_id), httpx.Response(status, content=content, headers=headers))


def body_of(response: Response) -> dict[str, object]:
    return dict(json.loads(bytes(response.body)))


def test_all_succeed_the_first_nodes_answer() -> None:
    r = _one_answer([answer("a", 201, {"id": "a"}), answer("b", 201, {"id": "b"})], request())
    assert r.status_code == 201 and body_of(r) == {"id": "a"}


def test_the_same_refusal_everywhere_is_that_refusal() -> None:
    r = _one_answer([answer("a", 409, {"message": "exists"}), answer("b", 409, {"message": "exists"})], request())
    assert r.status_code == 409 and body_of(r)["message"] == "exists"


def test_mixed_answers_are_a_502_naming_each_failing_node() -> None:
    answers = [answer("a", 201), answer("b", 409, {"message": "taken"}), answer("c", 500, b"boom")]
    r = _one_answer(answers, request())
    message = str(body_of(r)["message"])
    assert r.status_code == 502
    assert "failed on 2 of 3 nodes (it succeeded on 1)" in message
    assert "b: 409 taken" in message and "c: 500 boom" in message and "a:" not in message


def test_nodes_that_did_not_answer_are_a_503() -> None:
    r = _one_answer([answer("a", 201), answer("b", None)], request())
    assert r.status_code == 503 and "b: did not answer (ConnectError: refused)" in str(body_of(r)["message"])


def test_one_node_is_relayed_as_it_answered() -> None:
    assert _one_answer([answer("a", 500, {"message": "x"})], request()).status_code == 500


async def _lines(answers: list[_Answer]) -> list[dict[str, object]]:
    return [json.loads(line) async for line in _merged(answers, request())]


async def test_streams_are_merged_and_end_with_the_first_template() -> None:
    a = answer("a", 200, b'{"event":"log","message":"one"}\n{"event":"template","template":{"id":"ta"}}\n', NDJSON)
    b = answer("b", 200, b'{"event":"template","template":{"id":"tb"}}\n', NDJSON)
    lines = await _lines([a, b])
    assert lines[-1] == {"event": "template", "template": {"id": "ta"}}
    assert {"event": "log", "message": "one", "node": "a"} in lines
    assert [d["event"] for d in lines[:-1]] == ["log"] * 3  # the nodes' own ends are log lines


async def test_a_failing_node_makes_the_last_line_an_error_naming_it() -> None:
    a = answer("a", 200, b'{"event":"template","template":{}}\n', NDJSON)
    b = answer("b", 200, b'{"event":"error","message":"cannot pull"}\n', NDJSON)
    c = answer("c", 409, {"message": "taken"})
    last = (await _lines([a, b, c]))[-1]
    assert last["event"] == "error"
    assert "b: cannot pull" in str(last["message"]) and "c: 409 taken" in str(last["message"])
