"""``warren setup --with code-interpreter``: build ``code-interpreter-v1`` into the setup cache.

The template is made by warren's own template builder, which runs steps in a sandbox, so setup starts a
node of its own for the job: in-process, on a scratch state dir under the cache dir, listening on a
free loopback port. It asks that node for the template (``POST /warren/templates/ensure``), printing the
build's log as it goes; the node stores the sealed layer in the cache (``warren.templates.codeinterp.cache``),
where every later node on this machine imports it instead of building. Then the node stops and its state
dir is removed. Imported when the command runs (the client commands never load the server's modules).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from warren.cli.client import CliError

EXTRAS = {"code-interpreter": "code-interpreter-v1"}
BUILD_TIMEOUT_S = 3600.0
START_TIMEOUT_S = 300.0


def build_extra(cache_dir: Path, extra: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Build ``extra`` into ``cache_dir`` with a scratch node; the template's description. Needs root."""
    name = EXTRAS.get(extra)
    if name is None:
        raise CliError(f"unknown --with {extra!r}; choose from {', '.join(EXTRAS)}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".setup-node-", dir=cache_dir))
    scratch.chmod(0o711)  # sandbox roots (unprivileged uids) resolve their bundles under it
    try:
        return asyncio.run(_build(scratch / "state", cache_dir, name, say))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def _build(state_dir: Path, cache_dir: Path, name: str, say: Callable[[str], None]) -> dict[str, Any]:
    from warren.config import Settings
    from warren.node import serve

    settings = Settings.from_env(state_dir, listen_host="127.0.0.1", listen_port=0, cache_dir=cache_dir,
                                 warm_pool_size=0)  # fmt: skip
    stop = asyncio.Event()
    ready: asyncio.Future[Mapping[str, Any]] = asyncio.get_running_loop().create_future()
    node = asyncio.create_task(serve(settings, stop=stop, ready=ready), name="setup-node")
    try:
        waiting: set[asyncio.Future[Any]] = {ready, node}
        await asyncio.wait(waiting, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            if node.done():
                node.result()
            raise CliError(f"the scratch node did not start within {START_TIMEOUT_S:.0f}s")
        info = ready.result()
        headers = {"X-API-Key": str(info["api_key"])}
        timeout = httpx.Timeout(60.0, read=BUILD_TIMEOUT_S)
        async with httpx.AsyncClient(base_url=str(info["url"]), headers=headers, timeout=timeout) as client:
            async with client.stream("POST", "/warren/templates/ensure", json={"name": name}) as response:
                if response.is_error:
                    await response.aread()
                    raise CliError(f"building {name} failed: {response.status_code} {response.text}")
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    doc = json.loads(line)
                    if doc.get("event") == "log":
                        say(str(doc.get("message", "")))
                    elif doc.get("event") == "error":
                        raise CliError(f"building {name} failed: {doc.get('message')}")
                    elif doc.get("event") == "template":
                        return dict(doc.get("template") or {})
        raise CliError(f"the node ended the build of {name} without a result")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await node


__all__ = ["EXTRAS", "build_extra"]
