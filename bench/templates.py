"""Section "templates" (issue 2/5): image pulls from a local registry, and SDK template builds.

* *pull*: ``POST /warren/images/pull`` of a ~300 MB, 7-layer image (busybox + 6 layers of random
  data, gzip level 1) from Debian's ``docker-registry`` on loopback, until the NDJSON stream's
  ``template`` event; each pull is cold (the template is deleted after it, which garbage-collects
  its image layers). In the same run, alternating with it: ``skopeo copy docker://… dir:…`` of the
  same image (download + digest check only; warren also unpacks every layer into a directory).
* *shared-base pull*: with the large image pulled and kept, a pull of a second tag that has the same
  7 layers plus one new 16 MB layer: time, and bytes the registry served (from its access log).
* *build*: ``Template().from_template("base").run_cmd().set_envs().run_cmd()`` through the SDK's
  ``Template.build``, cold (``skip_cache=True``) and again with the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import summary_ms
from tests.framework.images import make_layer, member
from tests.framework.node import Node
from tests.framework.registry import Registry, push_image, push_large_image, running_registry

LARGE_BYTES = 300 << 20


def _served(reg: Registry, since: int) -> int:
    """Bytes of blob GETs the registry answered after request number ``since``."""
    return sum(r.size for r in reg.requests("GET", "/blobs/", since) if r.status in (200, 206))


def warren_pull(node: Node, image: str, name: str) -> float:
    with node.client() as c:
        t0 = time.perf_counter()
        with c.stream("POST", "/warren/images/pull", json={"image": image, "name": name}, timeout=600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"pull {image}: HTTP {r.status_code}: {r.read().decode()[:300]}")
            last: dict[str, Any] = {}
            for line in r.iter_lines():
                if line.strip():
                    last = json.loads(line)
        elapsed = time.perf_counter() - t0
    if last.get("event") != "template":
        raise RuntimeError(f"pull {image} ended with {last}")
    return elapsed


def skopeo_copy(image: str) -> float:
    dest = Path(tempfile.mkdtemp(prefix="warren-bench-skopeo-"))
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{image}",
                               f"dir:{dest}"], capture_output=True, timeout=600)  # fmt: skip
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"skopeo copy failed: {proc.stderr.decode()[-400:]}")
        return elapsed
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _delete_template(node: Node, name: str) -> None:
    with node.client() as c:
        r = c.delete(f"/templates/{name}")
        if r.status_code not in (204, 404):
            raise RuntimeError(f"delete template {name}: {r.status_code} {r.text}")


def pulls(node: Node, workdir: Path, n: int) -> dict[str, Any]:
    with running_registry(workdir / "registry") as reg:
        big = push_large_image(reg, "bench/large", "v1", total_bytes=LARGE_BYTES, layers=6)
        extra = make_layer([member("extra", kind=tarfile.DIRTYPE, mode=0o755),
                            member("extra/new.bin", os.urandom(16 << 20))], level=1)  # fmt: skip
        shared = push_image(reg, "bench/large", "v2", [*big.layers, extra])
        compressed = sum(x.size for x in big.layers)
        w, s, w_bytes, s_bytes = [], [], [], []
        for i in range(n):
            for tool in ("skopeo", "warren") if i % 2 == 0 else ("warren", "skopeo"):  # alternate who goes first
                mark = reg.mark()
                if tool == "skopeo":
                    s.append(skopeo_copy(big.ref))
                    s_bytes.append(_served(reg, mark))
                else:
                    w.append(warren_pull(node, big.ref, f"bench-large-{i}"))
                    w_bytes.append(_served(reg, mark))
            if i < n - 1:
                _delete_template(node, f"bench-large-{i}")
        # The last pull is kept: the shared-base image's first 7 layers are in the store now.
        mark = reg.mark()
        t_shared = warren_pull(node, shared.ref, "bench-shared")
        shared_bytes = _served(reg, mark)
        _delete_template(node, "bench-shared")
        _delete_template(node, f"bench-large-{n - 1}")
    out: dict[str, Any] = {
        "image": {
            "layers": len(big.layers),
            "compressed_bytes": compressed,
            "compressed_mib": round(compressed / 2**20, 1),
        },
        "warren_pull": summary_ms(w),
        "skopeo_copy_dir": summary_ms(s),
        "warren_vs_skopeo_p50_ratio": round(summary_ms(w)["p50_ms"] / summary_ms(s)["p50_ms"], 2),
        "warren_pull_bytes_fetched": w_bytes,
        "skopeo_bytes_fetched": s_bytes,
        "warren_pull_mib_per_s_p50": round(compressed / 2**20 / (summary_ms(w)["p50_ms"] / 1000), 1),
        "shared_base_pull": summary_ms([t_shared]),
        "shared_base_pull_bytes_fetched": shared_bytes,
        "shared_base_new_layer_bytes": extra.size,
        "note": "skopeo copy to dir: downloads and checks digests only; warren also unpacks each layer",
    }
    return out


def _template(skip_cache: bool) -> Any:
    from e2b import Template

    start = Template()
    return (
        (start.skip_cache() if skip_cache else start)
        .from_template("base")
        .run_cmd("mkdir -p /opt/bench && echo one > /opt/bench/one.txt", user="root")
        .set_envs({"BENCH_MODE": "build", "BENCH_N": "3"})
        .run_cmd("echo $BENCH_MODE > /opt/bench/two.txt && ls /opt/bench", user="root")
    )


def builds(node: Node, n: int) -> dict[str, Any]:
    from e2b import Template

    name = "bench-built"
    cold, cached = [], []
    logs: list[str] = []

    def build(skip_cache: bool) -> float:
        logs.clear()
        t0 = time.perf_counter()
        Template.build(
            _template(skip_cache), name, skip_cache=skip_cache, on_build_logs=lambda e: logs.append(str(e.message))
        )
        elapsed = time.perf_counter() - t0
        from_cache = [line for line in logs if line.startswith("CACHED")]
        if skip_cache and from_cache:
            raise RuntimeError(f"a skip_cache build used the cache: {from_cache}")
        if not skip_cache and not from_cache:
            raise RuntimeError("the cached rebuild ran its steps again")
        return elapsed

    try:
        cold = [build(skip_cache=True) for _ in range(n)]
        cached = [build(skip_cache=False) for _ in range(n)]
        sample_log = list(logs)
    finally:
        _delete_template(node, name)
    return {
        "steps": "from_template(base) + run_cmd + set_envs + run_cmd",
        "cold_build_skip_cache": summary_ms(cold),
        "cached_rebuild": summary_ms(cached),
        "cached_rebuild_log": [line for line in sample_log if line.startswith(("CACHED", "["))][:8],
    }


def run_templates(node: Node, workdir: Path, scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    n = max(1, round(3 * scale))
    try:
        out["pull"] = pulls(node, workdir, n)
    except Exception as exc:  # reported; the builds still run
        out["pull"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        out["build"] = builds(node, max(2, round(3 * scale)))
    except Exception as exc:
        out["build"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
