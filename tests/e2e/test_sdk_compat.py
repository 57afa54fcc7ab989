"""What SDK users of a year ago call still works: ``beta_pause`` (the only pause before e2b 2.9) and
``connect`` to resume, sync and async, on both runtimes. tests/e2e/test_sdk_versions.py runs this file
with the older SDK of the version matrix too (``Sandbox.connect`` there sends envd's routing headers on
the control-plane call, which the node must not proxy into the sandbox)."""

from __future__ import annotations

import asyncio
import time

from e2b import AsyncSandbox, Sandbox

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done"


def test_beta_pause_then_connect_keeps_memory(sbx: Sandbox) -> None:
    sbx.commands.run(COUNTER, background=True)
    time.sleep(1)
    sbx.beta_pause()
    assert sbx.get_info().state.value == "paused"
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=120)
    first = int(resumed.commands.run("cat /tmp/counter").stdout)
    assert first >= 2
    time.sleep(0.8)
    assert int(resumed.commands.run("cat /tmp/counter").stdout) > first


def test_connect_to_a_running_sandbox(sbx: Sandbox) -> None:
    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert again.commands.run("echo ok").stdout.strip() == "ok"
    assert again.files.read("/etc/hostname") == sbx.files.read("/etc/hostname")


async def test_async_beta_pause_then_connect(template: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120)
    try:
        await box.files.write("/home/user/kept.txt", "kept")
        await box.commands.run(COUNTER, background=True)
        await asyncio.sleep(1)
        await box.beta_pause()
        resumed = await AsyncSandbox.connect(box.sandbox_id, timeout=120)
        assert await resumed.files.read("/home/user/kept.txt") == "kept"
        assert int((await resumed.commands.run("cat /tmp/counter")).stdout) >= 2
    finally:
        await AsyncSandbox.kill(box.sandbox_id)
