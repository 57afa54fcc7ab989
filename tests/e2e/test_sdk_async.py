"""The async E2B SDK against a real node: create, commands, PTY, files, watch, list, kill."""

from __future__ import annotations

import asyncio
import uuid

from e2b import AsyncSandbox, SandboxQuery
from e2b.sandbox.commands.command_handle import PtySize

from tests.framework.node import Node


async def test_async_sdk_end_to_end(node: Node, template: str) -> None:
    tag = uuid.uuid4().hex
    sbx = await AsyncSandbox.create(template=template, metadata={"tag": tag}, envs={"E": "v"})
    try:
        result = await sbx.commands.run("echo $E; whoami")
        assert result.stdout.split() == ["v", "user"]
        assert (await sbx.commands.run("whoami", user="root")).stdout.strip() == "root"

        await sbx.files.make_dir("/home/user/aw")
        events = []
        watcher = await sbx.files.watch_dir("/home/user/aw", on_event=events.append)
        await sbx.files.write("/home/user/aw/f.txt", "async")
        assert await sbx.files.read("/home/user/aw/f.txt") == "async"
        for _ in range(100):
            if any(e.name == "f.txt" for e in events):
                break
            await asyncio.sleep(0.1)
        await watcher.stop()
        assert any(e.name == "f.txt" for e in events)

        out = bytearray()
        pty = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=out.extend)
        await sbx.pty.send_stdin(pty.pid, b"echo ASYNC_$((20+22)); exit\n")
        await pty.wait()
        assert b"ASYNC_42" in out

        handle = await sbx.commands.run("sleep 600", background=True)
        assert await sbx.commands.kill(handle.pid)

        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag}))
        items = await paginator.next_items()
        assert [s.sandbox_id for s in items] == [sbx.sandbox_id]
        assert await sbx.is_running()
    finally:
        assert await sbx.kill()
    assert not await AsyncSandbox.kill(sbx.sandbox_id)
