"""Section "egress" (issue 12): what the egress proxy costs a sandbox's HTTP(S) requests, vs going direct.

One node with its own nft table, the test "internet" of tests/e2e/egress_world.py (an echo server and
dnsmasq in a network namespace), and one sandbox per mode and runtime:

    direct        no policy: the request is routed and masqueraded, the proxy never sees it
    proxied       denyOut 0.0.0.0/0 + allowOut allowed.test: redirected to the proxy, which peeks Host/SNI,
                  checks the name and splices to the destination
    http_rule     a header rule on allowed.test: the proxy rewrites the request head (HTTP)
    https_rule    the same over HTTPS: TLS terminated with the node CA, re-encrypted to the upstream

In each sandbox a Python client measures: sequential requests on a new connection each (``latency``),
requests/s from 8 threads (``rps_8``), and one bulk download (``bulk_mb_s``). ``https_direct`` is the
HTTPS baseline (no policy) for ``https_proxied`` (SNI checked, TLS passed through) and ``https_rule``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench.harness import POOL_OFF, bench_node, sdk_env
from bench.stats import summary_ms
from tests.e2e.egress_world import ADDRS, DNS_IP, internet

CLIENT = r'''
import concurrent.futures, json, ssl, sys, time, urllib.request
url, n, big = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context() if url.startswith("https") else None
def one(u=url):
    t = time.perf_counter()
    with urllib.request.urlopen(u, timeout=20, context=ctx) as r:
        r.read()
    return time.perf_counter() - t
one()
lat = [one() for _ in range(n)]
t = time.perf_counter()
with concurrent.futures.ThreadPoolExecutor(8) as ex:
    list(ex.map(lambda _: one(), range(2 * n)))
rps = 2 * n / (time.perf_counter() - t)
bulk = one(big)
print(json.dumps({"lat": lat, "rps": rps, "bulk_s": bulk}))
'''
TABLE = "warren_bench_egress"
BULK = 64 << 20
COMPARED = (("proxied", "direct"), ("http_rule", "direct"), ("https_proxied", "https_direct"),
            ("https_rule", "https_direct"))
RULES = {"allowed.test": [{"transform": {"headers": {"Authorization": "Bearer bench"}}}]}
MODES: dict[str, tuple[dict[str, Any] | None, str]] = {
    "direct": (None, f"http://{ADDRS['allowed']}"),
    "proxied": ({"deny_out": ["0.0.0.0/0"], "allow_out": ["allowed.test"], "dns_servers": [DNS_IP]},
                "http://allowed.test"),
    "http_rule": ({"rules": RULES}, "http://allowed.test"),
    "https_direct": (None, "https://allowed.test"),
    "https_proxied": ({"deny_out": ["0.0.0.0/0"], "allow_out": ["allowed.test"], "dns_servers": [DNS_IP]},
                      "https://allowed.test"),
    "https_rule": ({"rules": RULES}, "https://allowed.test"),
}


def _measure(template: str, network: dict[str, Any] | None, base: str, n: int, ca_pem: bytes) -> dict[str, Any]:
    from e2b import Sandbox

    box = Sandbox.create(template=template, timeout=600, network=network)  # type: ignore[arg-type]
    try:
        box.files.write("/tmp/client.py", CLIENT)
        if not (network or {}).get("rules") and base.startswith("https"):  # not intercepted: trust the test CA
            box.files.write("/tmp/ca.pem", ca_pem)
            box.commands.run("cat /tmp/ca.pem >> /etc/ssl/certs/ca-certificates.crt", user="root")
        out = box.commands.run(f"python3 /tmp/client.py {base}/ {n} {base}/bytes/{BULK}", timeout=600).stdout
        data = json.loads(out.strip().splitlines()[-1])
    finally:
        box.kill()
    return {"latency": summary_ms(data["lat"]), "rps_8": round(data["rps"], 1),
            "bulk_mb_s": round(BULK / data["bulk_s"] / 1e6, 1)}


def run_egress(work: Path, runsc: Path | None, rootfs: Path, scale: float) -> dict[str, Any]:
    n = max(20, int(200 * scale))
    out: dict[str, Any] = {"requests": n, "bulk_bytes": BULK}
    with internet(work / "world") as world:
        env = {**POOL_OFF, "WARREN_DNS_SERVERS": DNS_IP, "WARREN_EGRESS_UPSTREAM_CA": str(world.ca_file),
               "WARREN_NETWORK_TABLE": TABLE, "WARREN_NETWORK_PREFIX": "b",
               "WARREN_NETWORK_CIDR": "10.75.0.0/16"}
        with bench_node(work / "state", runsc, env) as node:
            sdk_env(node)
            kinds = [("runc", "base")]
            with node.client() as c:
                if c.get("/health").json()["runtimes"].get("gvisor", {}).get("available"):
                    c.post("/warren/templates/import",
                           json={"path": str(rootfs), "name": "base-gvisor", "runtime": "gvisor"}).raise_for_status()
                    kinds.append(("gvisor", "base-gvisor"))
            ca_pem = world.ca_file.read_bytes()
            for runtime, template in kinds:
                res: dict[str, Any] = {}
                for mode, (net, base) in MODES.items():
                    try:
                        res[mode] = _measure(template, net, base, n, ca_pem)
                    except Exception as exc:  # one mode's failure is data; the others still run
                        res[mode] = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
                for mode, base_mode in COMPARED:
                    if "latency" in res[mode] and "latency" in res[base_mode]:
                        res[f"{mode}_vs_{base_mode}_p50_ratio"] = round(
                            res[mode]["latency"]["p50_ms"] / res[base_mode]["latency"]["p50_ms"], 2)
                out[runtime] = res
    subprocess.run(["nft", "delete", "table", "inet", TABLE], check=False)  # the node leaves it for its sandboxes
    return out
