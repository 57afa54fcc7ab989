"""Sandbox lifecycle commands over the API, docker-style: pause, resume, fork, snapshot (create, ls, rm),
metrics (a live view) and logs (the start command's and the guest agent's output)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer

from warren.cli.client import ApiClient, CliError
from warren.cli.options import ApiKeyOption, JsonOption, UrlOption, api_client
from warren.cli.output import Column, print_json, print_message, print_table, wants_json

IdArgument = Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")]

SNAPSHOT_COLUMNS: tuple[Column, ...] = (
    ("SNAPSHOT ID", "snapshotID"),
    ("NAMES", "names"),
    ("SANDBOX", "sandboxID"),
    ("TEMPLATE", "templateID"),
    ("RUNTIME", "runtime"),
    ("CREATED", "createdAt"),
)
FORK_COLUMNS: tuple[Column, ...] = (
    ("SANDBOX ID", lambda row: (row.get("sandbox") or {}).get("sandboxID", "")),
    ("ERROR", lambda row: (row.get("error") or {}).get("message", "")),
)
METRIC_COLUMNS: tuple[Column, ...] = (
    ("TIME", "timestamp"),
    ("CPU %", "cpuUsedPct"),
    ("CPUS", "cpuCount"),
    ("MEM USED MB", lambda row: _mib(row.get("memUsed"))),
    ("MEM TOTAL MB", lambda row: _mib(row.get("memTotal"))),
    ("DISK USED MB", lambda row: _mib(row.get("diskUsed"))),
    ("DISK TOTAL MB", lambda row: _mib(row.get("diskTotal"))),
)

snapshot_app = typer.Typer(name="snapshot", help="Snapshots of sandboxes: create, ls, rm.", no_args_is_help=True)


def _mib(value: object) -> str:
    return f"{value / 2**20:.1f}" if isinstance(value, int | float) else ""


def _sandbox(sandbox_id: str, suffix: str = "") -> str:
    return f"/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def pause(
    sandbox_id: IdArgument,
    memory: Annotated[
        bool, typer.Option("--memory/--no-memory", help="Keep the processes' memory (default), or the files only.")
    ] = True,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Pause a sandbox (it keeps its files, and its memory unless --no-memory)."""
    with api_client(url, api_key) as api:
        api.post(_sandbox(sandbox_id, "/pause"), {} if memory else {"memory": False})
    print_message("Paused sandbox {}.", sandbox_id)


def resume(
    sandbox_id: IdArgument,
    timeout: Annotated[int | None, typer.Option("--timeout", min=1, help="Seconds until it ends.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Resume a paused sandbox."""
    with api_client(url, api_key) as api:
        resumed = api.post(_sandbox(sandbox_id, "/resume"), {} if timeout is None else {"timeout": timeout})
    if wants_json(json_out):
        print_json(resumed)
    else:
        print_message("Resumed sandbox {}.", sandbox_id)


def fork(
    sandbox_id: IdArgument,
    count: Annotated[int, typer.Option("-n", "--count", min=1, help="How many children.")] = 1,
    timeout: Annotated[int | None, typer.Option("--timeout", min=1, help="Seconds until they end.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Fork a sandbox into N independent children (each a copy of its files and memory)."""
    body: dict[str, Any] = {"count": count}
    if timeout is not None:
        body["timeout"] = timeout
    with api_client(url, api_key) as api:
        results = api.post(_sandbox(sandbox_id, "/fork"), body) or []
    if wants_json(json_out):
        print_json(results)
    else:
        print_table(results, FORK_COLUMNS, empty="No children.")
    if any(isinstance(r, Mapping) and r.get("error") for r in results):
        raise typer.Exit(1)


@snapshot_app.command("create")
def snapshot_create(
    sandbox_id: IdArgument,
    name: Annotated[str | None, typer.Option("--name", help="A name to start sandboxes from.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Snapshot a sandbox (it keeps running)."""
    with api_client(url, api_key) as api:
        made = api.post(_sandbox(sandbox_id, "/snapshots"), {} if name is None else {"name": name})
    if wants_json(json_out):
        print_json(made)
    else:
        print_message("Created snapshot {}.", (made or {}).get("snapshotID", "?"))


@snapshot_app.command("ls")
def snapshot_ls(
    sandbox_id: Annotated[str | None, typer.Option("--sandbox", help="Only snapshots of this sandbox.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """List snapshots."""
    with api_client(url, api_key) as api:
        found = api.list_all("/snapshots", {"sandboxID": sandbox_id} if sandbox_id else None)
    if wants_json(json_out):
        print_json(found)
    else:
        print_table(found, SNAPSHOT_COLUMNS, empty="No snapshots.")


@snapshot_app.command("rm")
def snapshot_rm(
    snapshot_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Snapshot ids or names.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Delete snapshots."""
    with api_client(url, api_key) as api:
        for snapshot_id in snapshot_ids:
            api.delete(f"/snapshots/{quote(snapshot_id, safe='')}")
            print_message("Removed snapshot {}.", snapshot_id)


def _latest(api: ApiClient, sandbox_id: str) -> dict[str, Any]:
    samples = api.get(_sandbox(sandbox_id, "/metrics"))
    if not isinstance(samples, list) or not samples or not isinstance(samples[-1], dict):
        raise CliError(f"the server sent no metrics for sandbox {sandbox_id}")
    return samples[-1]


def metrics(
    sandbox_id: IdArgument,
    once: Annotated[bool, typer.Option("--once", "--no-follow", help="Print one sample and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between samples.")] = 2.0,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """A live view of a sandbox's CPU, memory and disk (a new sample every --interval; Ctrl-C stops)."""
    with api_client(url, api_key) as api:
        try:
            while True:
                sample = _latest(api, sandbox_id)
                if wants_json(json_out) and once:
                    print_json(sample)
                elif wants_json(json_out):  # one line per sample, for a pipe to follow
                    sys.stdout.write(json.dumps(sample, sort_keys=True) + "\n")
                    sys.stdout.flush()
                else:
                    print_table([sample], METRIC_COLUMNS, empty="")
                if once:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return


def logs(
    sandbox_id: IdArgument,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many lines.")] = 1000,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """The sandbox's logs: its start command's output and its guest agent's."""
    with api_client(url, api_key) as api:
        found = api.get(f"/v2{_sandbox(sandbox_id, '/logs')}?{urlencode({'limit': limit})}") or {}
    entries = found.get("logs", []) if isinstance(found, dict) else []
    if wants_json(json_out):
        print_json(entries)
        return
    for entry in entries:
        source = (entry.get("fields") or {}).get("source", "")
        typer.echo(f"{entry.get('timestamp', '')} {source:<6} {entry.get('message', '')}")


def register(app: typer.Typer) -> None:
    app.command("pause")(pause)
    app.command("resume")(resume)
    app.command("fork")(fork)
    app.add_typer(snapshot_app)
    app.command("metrics")(metrics)
    app.command("logs")(logs)
