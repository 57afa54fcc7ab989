"""Egress policy changes of a sandbox (``PUT /sandboxes/{id}/network``) and the CA its header rules need.

A policy with header rules has its HTTPS intercepted by the node's egress proxy, so the sandbox must
trust the node's egress CA: it is written to ``/usr/local/share/ca-certificates/`` and appended (once) to
the system bundle ``/etc/ssl/certs/ca-certificates.crt``, which OpenSSL, curl and Python read. Both are in
the sandbox's upper dir, so pause, resume, snapshot and fork keep them.
"""

from __future__ import annotations

import dataclasses

from ..guestclient import AgentClient, AgentError
from ..runtime.base import AGENT_PORT
from ..store import EgressPolicy, NetworkConfig, SandboxRecord
from .runtimes import RuntimeSet
from .states import SandboxState
from .table import SandboxTable

CA_PATH = "/usr/local/share/ca-certificates/warren-egress-ca.crt"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_APPEND = (
    f'set -e; ca={CA_PATH}; b={BUNDLE}; mkdir -p "$(dirname "$b")"; touch "$b"; '
    'if ! grep -qF "$(sed -n 2p "$ca")" "$b"; then cat "$ca" >> "$b"; fi'
)


async def install_egress_ca(address: str, port: int, token: str | None, pem: bytes) -> None:
    """Make the sandbox at ``address`` trust the egress CA (idempotent). ``AgentError`` on failure."""
    async with AgentClient(address, port, access_token=token) as agent:
        await agent.write_file(CA_PATH, pem, user="root")
        result = await agent.run(["/bin/sh", "-c", _APPEND], user="root", timeout_s=30)
        if not result.ok:
            raise AgentError(f"installing the egress CA in the sandbox failed: {result.output_tail()}")


async def update_network(table: SandboxTable, runtimes: RuntimeSet, sandbox_id: str,
                         egress: EgressPolicy, asked: NetworkConfig | None = None) -> SandboxRecord:
    """Replace the sandbox's egress policy: enforced at once when it runs (or is frozen), at resume when
    it is paused; stored with the sandbox either way. ``asked``: the update's ``allowOut``/``denyOut`` as
    sent, which ``get_info`` shows from now on. 409 while it is changing state."""
    sandbox = table.get(sandbox_id)
    async with sandbox.lock:
        sandbox.require(SandboxState.RUNNING, SandboxState.PAUSED)
        runtime = runtimes.of(sandbox.kind)
        await runtime.update_egress(sandbox_id, egress)
        if egress.rules and sandbox.state is SandboxState.RUNNING and sandbox.record.address:
            await install_egress_ca(sandbox.record.address, AGENT_PORT, sandbox.record.access_token,
                                    runtime.egress_ca())
        requested = sandbox.record.requested
        if asked is not None:
            before = requested.network or NetworkConfig()
            network = dataclasses.replace(before, allow_out=asked.allow_out, deny_out=asked.deny_out)
            requested = dataclasses.replace(requested, network=network)
        return await sandbox.update(egress=egress, requested=requested)
