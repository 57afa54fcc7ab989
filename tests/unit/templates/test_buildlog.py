"""Build status and log paging: ``logsOffset``/``limit`` and the SDK's poll-until-drained loop."""

from __future__ import annotations

import itertools
from typing import Any

from warren.templates.buildlog import DEFAULT_PAGE, MAX_ENTRIES, BuildLog, BuildStatus


def _clock() -> Any:
    ticks = itertools.count()
    return lambda: 1_700_000_000 + next(ticks) / 10


def test_pages_from_an_offset() -> None:
    log = BuildLog(clock=_clock())
    for i in range(250):
        log.add(f"line {i}", step="1")
    assert [e.message for e in log.page(0, None)] == [f"line {i}" for i in range(DEFAULT_PAGE)]
    assert [e.message for e in log.page(240, None)] == [f"line {i}" for i in range(240, 250)]
    assert [e.message for e in log.page(10, 3)] == ["line 10", "line 11", "line 12"]
    assert log.page(250, None) == [] and log.page(9999, 5) == []
    assert log.page(0, 0) == []


def test_status_body_shape() -> None:
    log = BuildLog(clock=_clock())
    log.add("hello", step="base")
    body = log.body("t1", "b1", 0, None)
    assert body["templateID"] == "t1" and body["buildID"] == "b1" and body["status"] == "waiting"
    entry = body["logEntries"][0]
    assert entry["message"] == "hello" and entry["level"] == "info" and entry["step"] == "base"
    assert entry["timestamp"].endswith("Z") and body["logs"][0].endswith("hello")
    assert "reason" not in body


def test_failure_reason_names_the_step_and_repeats_its_log() -> None:
    log = BuildLog(clock=_clock())
    log.status = BuildStatus.BUILDING
    log.add("step one", step="1")
    log.add("about to fail", step="2", level="error")
    log.fail("step 2 (RUN false) failed: exit code 1", step="2")
    body = log.body("t", "b", 0, None)
    assert body["status"] == "error"
    assert body["reason"]["message"] == "step 2 (RUN false) failed: exit code 1"
    assert body["reason"]["step"] == "2"
    assert [e["message"] for e in body["reason"]["logEntries"]] == ["about to fail", body["reason"]["message"]]
    assert body["logEntries"][-1]["level"] == "error"


def test_the_sdk_poll_loop_gets_every_entry_once() -> None:
    """The SDK advances logsOffset by what it got, and after ready polls until a page is empty."""
    log = BuildLog(clock=_clock())
    produced = iter(range(1000))
    offset, seen, polls = 0, [], 0
    while True:
        polls += 1
        for _ in range(37):  # the build keeps logging between polls
            n = next(produced, None)
            if n is not None:
                log.add(f"e{n}")
        if n is None and not log.status.finished:
            log.succeed("done")
        body = log.body("t", "b", offset, None)
        offset += len(body["logEntries"])
        seen += [e["message"] for e in body["logEntries"]]
        if body["status"] in ("ready", "error") and not body["logEntries"]:
            break
        assert polls < 1000
    assert seen == [f"e{i}" for i in range(1000)] + ["done"]


def test_huge_logs_are_truncated_but_still_finish() -> None:
    log = BuildLog(clock=_clock())
    for i in range(MAX_ENTRIES + 50):
        log.add(f"e{i}")
    log.add("x" * 10_000)
    log.fail("boom")
    assert len(log.entries) == MAX_ENTRIES + 2
    assert "truncated" in log.entries[MAX_ENTRIES].message and log.dropped == 51
    assert log.entries[-1].message == "boom" and log.status is BuildStatus.ERROR
    long = BuildLog(clock=_clock())
    long.add("y" * 10_000)
    assert len(long.entries[0].message) < 5000 and "more characters" in long.entries[0].message
