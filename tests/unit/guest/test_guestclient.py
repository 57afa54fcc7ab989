"""The host's one agent client (``warren.guestclient``) against the real guest agent on loopback:
health, ``/init`` (token, env, user, re-init needs the old token), a process run and a file write."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.unit.guest.conftest import AgentProc
from warren.errors import RuntimeFailure
from warren.guestclient import AgentClient, init_agent, wait_healthy


async def test_wire_calls_and_the_client_share_one_init(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    await wait_healthy("127.0.0.1", agent.port, time.monotonic() + 10)
    await init_agent("127.0.0.1", agent.port, env_vars={"FROM_INIT": "1"}, access_token="tok-1",
                     default_user="root", default_workdir=None)  # fmt: skip
    # A second init without the token the agent holds is refused (envd: 401) ...
    with pytest.raises(RuntimeFailure, match="/init"):
        await init_agent("127.0.0.1", agent.port, env_vars={}, access_token="tok-2", default_user=None,
                         default_workdir=None)  # fmt: skip
    # ... and accepted with it: the client's init carries the token it was made with.
    async with AgentClient("127.0.0.1", agent.port, access_token="tok-1") as client:
        await client.wait_healthy(time.monotonic() + 10)
        await client.init(access_token="tok-2", env_vars={"FROM_INIT": "2"}, default_user="root")
        result = await client.run(["/bin/sh", "-c", "echo $FROM_INIT"])
        assert result.ok and result.stdout == b"2\n"
        await client.write_file(str(agent.root / "written"), b"data")
    assert (agent.root / "written").read_bytes() == b"data"


async def test_health_times_out_with_the_address_in_the_error() -> None:
    with pytest.raises(RuntimeFailure, match=r"127\.0\.0\.1:9 did not answer"):
        await wait_healthy("127.0.0.1", 9, time.monotonic() + 0.2)
