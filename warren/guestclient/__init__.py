"""The host's one client of the guest agent (``warren.guest``, envd-compatible).

* :mod:`.wire`: health and ``/init`` on raw sockets, on every create, resume and claim;
* :mod:`.client`: :class:`AgentClient` for builds and start commands: processes (Connect JSON, as the
  E2B SDK sends them) and files, over httpx; its health and init are the wire calls.
"""

from warren.guestclient.client import AgentClient, AgentError, OutputCallback, ProcessResult, envelope, read_envelopes
from warren.guestclient.wire import init_agent, wait_healthy

__all__ = [
    "AgentClient",
    "AgentError",
    "OutputCallback",
    "ProcessResult",
    "envelope",
    "init_agent",
    "read_envelopes",
    "wait_healthy",
]
