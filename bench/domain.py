"""Section "domain": ``commands.run("true")`` in domain mode vs header mode, on two nodes, interleaved.

Header mode: the SDK is given ``E2B_SANDBOX_URL`` (plain HTTP to the node, the sandbox named by the
``E2b-Sandbox-Id`` header). Domain mode: only ``E2B_API_URL`` and ``E2B_DOMAIN``; the SDK reaches
``https://49983-<id>.warren.localhost:<port>`` (TLS with the node CA, routing by host name). The SDK
reads ``SSL_CERT_FILE`` when it first builds its HTTP client, so each measurement runs in a child
Python with its mode's environment; rounds alternate which mode goes first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import certifi

from bench.harness import POOL_OFF, bench_node
from bench.stats import summary_ms
from tests.framework.node import DOMAIN_HOST, Node

TEMPLATE = "base"
_CHILD = """
import json, sys, time
from e2b import Sandbox
n = int(sys.argv[1])
box = Sandbox.create(template=sys.argv[2], timeout=600)
try:
    for _ in range(5):
        box.commands.run("true")
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        box.commands.run("true")
        samples.append(time.perf_counter() - t0)
finally:
    box.kill()
print(json.dumps({"sandbox_domain": box.sandbox_domain, "samples": samples}))
"""


def _child_env(node: Node, bundle: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_API_URL")}
    return {**env, **node.env(), "SSL_CERT_FILE": str(bundle)}


def _measure(node: Node, bundle: Path, n: int) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n), TEMPLATE],
        env=_child_env(node, bundle), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"commands.run child failed ({out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if node.domain is not None and result["sandbox_domain"] != node.domain:
        raise RuntimeError(f"the SDK used domain {result['sandbox_domain']!r}, not {node.domain!r}")
    return [float(x) for x in result["samples"]]


def run_domain(work: Path, runsc: Path | None, scale: float) -> dict[str, Any]:
    from warren.node_tls import ensure_node_certificate

    work.mkdir(parents=True, exist_ok=True)
    ca_dir = work / "ca"
    files = ensure_node_certificate(ca_dir, DOMAIN_HOST)
    assert files.ca is not None
    bundle = ca_dir / "bundle.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + files.ca.read_bytes())
    rounds, n = 4, max(25, int(150 * scale))
    samples: dict[str, list[float]] = {"header_mode": [], "domain_mode": []}
    with (
        bench_node(work / "header", runsc, POOL_OFF) as header,
        bench_node(work / "domain", runsc, POOL_OFF, domain_ca=ca_dir) as domain,
    ):
        nodes = {"header_mode": header, "domain_mode": domain}
        keys = list(nodes)
        for i in range(rounds):
            for key in keys if i % 2 == 0 else keys[::-1]:
                samples[key] += _measure(nodes[key], bundle, n)
    out: dict[str, Any] = {"template": TEMPLATE, "rounds": rounds, "per_round": n}
    out.update({key: summary_ms(values) for key, values in samples.items()})
    header_p50 = out["header_mode"]["p50_ms"]
    out["commands_run_domain_vs_header_p50_ratio"] = round(out["domain_mode"]["p50_ms"] / header_p50, 3)
    return out
