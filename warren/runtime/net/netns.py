"""Per-sandbox network namespace + veth pair, made with two ``ip -batch`` calls (about 5 ms).

Inside the namespace the sandbox end is ``eth0`` with the slot's guest address and a default route via
the host end; ``lo`` is up. The host end (``<veth_prefix><slot>``) stays in the root namespace.
"""

from __future__ import annotations

import os
from pathlib import Path

from warren.errors import RuntimeFailure
from warren.runtime.oci.command import run_command

__all__ = [
    "NETNS_DIR",
    "create_netns",
    "delete_netns",
    "link_exists",
    "list_netns",
    "netns_exists",
    "netns_path",
]

NETNS_DIR = Path("/run/netns")
"""Where ``ip netns`` keeps its namespace bind mounts."""

IP_TIMEOUT = 15.0
"""Seconds for one ``ip`` call; namespace teardown in the kernel can take a few tens of ms under load."""

IFNAMSIZ = 15
"""Longest Linux interface name."""

GUEST_IF = "eth0"


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def netns_exists(name: str) -> bool:
    return netns_path(name).exists()


def link_exists(ifname: str) -> bool:
    """Whether a network interface of that name exists in the root namespace."""
    return os.path.lexists(f"/sys/class/net/{ifname}")


def list_netns(prefix: str) -> list[str]:
    """Names of the namespaces in ``NETNS_DIR`` that start with ``prefix``."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


async def create_netns(name: str, host_if: str, host_ip: str, guest_ip: str, prefixlen: int) -> None:
    """Create namespace ``name`` wired to the root namespace through ``host_if``.

    On failure the namespace and the link may exist half-made; the caller runs :func:`delete_netns`.
    """
    if len(host_if) > IFNAMSIZ:
        raise RuntimeFailure(f"interface name {host_if!r} is longer than {IFNAMSIZ} characters")
    host_batch = (
        f"netns add {name}\n"
        f"link add {host_if} type veth peer name {GUEST_IF} netns {name}\n"
        f"addr add {host_ip}/{prefixlen} dev {host_if}\n"
        f"link set {host_if} up\n"
    )
    guest_batch = (
        f"addr add {guest_ip}/{prefixlen} dev {GUEST_IF}\n"
        f"link set {GUEST_IF} up\n"
        "link set lo up\n"
        f"route add default via {host_ip}\n"
    )
    await run_command(["ip", "-batch", "-"], stdin=host_batch.encode(), timeout=IP_TIMEOUT)
    await run_command(["ip", "-n", name, "-batch", "-"], stdin=guest_batch.encode(), timeout=IP_TIMEOUT)


async def delete_netns(name: str, host_if: str | None) -> None:
    """Remove the veth (both ends) and the namespace. Idempotent: missing pieces are fine.

    The link is deleted first and explicitly: deleting only the namespace leaves the kernel to destroy
    the pair asynchronously, and the slot could be handed out while its old veth still exists.
    """
    lines = []
    if host_if and link_exists(host_if):
        lines.append(f"link del {host_if}")
    if netns_exists(name):
        lines.append(f"netns del {name}")
    if lines:
        # -force: run every line even if one fails; the checks below decide.
        await run_command(["ip", "-force", "-batch", "-"], stdin=("\n".join(lines) + "\n").encode(),
                          timeout=IP_TIMEOUT, check=False)
    if host_if and link_exists(host_if):
        raise RuntimeFailure(f"could not delete interface {host_if}")
    if netns_exists(name):
        raise RuntimeFailure(f"could not delete network namespace {name}")
