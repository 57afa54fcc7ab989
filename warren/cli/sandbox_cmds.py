"""Sandbox commands: ls, start, exec, shell, rm, timeout."""

from __future__ import annotations

import enum
import shlex
from typing import Annotated, Any
from urllib.parse import quote

import typer

from warren.cli import output
from warren.cli.client import CliError
from warren.cli.options import ApiKeyOption, JsonOption, UrlOption, UserOption, api_client, client_config
from warren.cli.output import Column, print_json, print_message, print_note, print_table, wants_json

LIST_COLUMNS: tuple[Column, ...] = (
    ("SANDBOX ID", "sandboxID"),
    ("TEMPLATE", lambda row: row.get("alias") or row.get("templateID")),
    ("STATE", "state"),
    ("RUNTIME", "runtime"),
    ("STARTED", "startedAt"),
    ("ENDS", "endAt"),
    ("CPU", "cpuCount"),
    ("MEMORY MB", "memoryMB"),
)


class RuntimeChoice(enum.StrEnum):
    RUNC = "runc"
    GVISOR = "gvisor"


def _sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return f"/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def ls(url: UrlOption = None, api_key: ApiKeyOption = None, json_out: JsonOption = False) -> None:
    """List sandboxes (running and paused)."""
    with api_client(url, api_key) as api:
        sandboxes = api.list_all("/v2/sandboxes")
    if wants_json(json_out):
        print_json(sandboxes)
    else:
        print_table(sandboxes, LIST_COLUMNS, empty="No sandboxes.")


def start(
    template: Annotated[str, typer.Argument(help="Template name or id, e.g. base or busybox.")],
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Start and print the id; no shell.")] = False,
    timeout: Annotated[
        int | None, typer.Option("--timeout", min=1, help="Seconds until the sandbox is killed.")
    ] = None,
    runtime: Annotated[
        RuntimeChoice | None, typer.Option("--runtime", help="Isolation (default: the server's).")
    ] = None,
    remove: Annotated[bool, typer.Option("--rm", help="Kill the sandbox when the shell exits.")] = False,
    user: UserOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Start a sandbox and open a shell in it (or, with --detach, print its id)."""
    if not detach and not output.stdin_is_tty():
        raise CliError("start attaches a shell, which needs a terminal; use --detach")
    body: dict[str, Any] = {"templateID": template, "metadata": {}, "envVars": {}}
    if timeout is not None:
        body["timeout"] = timeout
    if runtime is not None:
        body["runtime"] = runtime.value
    config = client_config(url, api_key)
    with api_client(url, api_key) as api:
        created = api.post("/v2/sandboxes", body)
    sandbox_id = _sandbox_id(created)
    if detach:
        if wants_json(json_out):
            print_json(created)
        else:
            print_message("Started sandbox [bold]{}[/bold] from template {}.", sandbox_id, template)
        return
    from warren.cli.session import attach_shell, connect_sandbox

    try:
        code = attach_shell(connect_sandbox(config, sandbox_id), user=user)
    finally:
        if remove:
            with api_client(url, api_key) as api:
                api.delete(_sandbox_path(sandbox_id))
        else:
            print_note(f"Sandbox {sandbox_id} keeps running; remove it with: warren rm {sandbox_id}")
    raise typer.Exit(code)


def exec_(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="-- CMD...",
            help="One argument is a shell command line; several are quoted as an argv.",
        ),
    ],
    user: UserOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Kill the command after this many seconds; 0: never.")
    ] = 0,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Run a command in a sandbox (through /bin/bash -l -c); exits with the command's exit code."""
    from warren.cli.session import connect_sandbox, run_command

    if command and command[0] == "--":  # options stop at ID, so click hands the separator through
        command = command[1:]
    if not command:
        raise CliError("no command given: warren exec ID -- CMD...")
    line = command[0] if len(command) == 1 else shlex.join(command)
    sandbox = connect_sandbox(client_config(url, api_key), sandbox_id)
    raise typer.Exit(run_command(sandbox, line, user=user, timeout=timeout))


def shell(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    user: UserOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Open an interactive shell (a PTY running bash -i -l) in a sandbox."""
    from warren.cli.session import attach_shell, connect_sandbox

    raise typer.Exit(attach_shell(connect_sandbox(client_config(url, api_key), sandbox_id), user=user))


def rm(
    sandbox_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Sandbox ids.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Kill sandboxes and delete everything they had."""
    removed: list[dict[str, Any]] = []
    with api_client(url, api_key) as api:
        for sandbox_id in sandbox_ids:
            api.delete(_sandbox_path(sandbox_id))
            removed.append({"sandboxID": sandbox_id, "removed": True})
            if not wants_json(json_out):
                print_message("Removed sandbox {}.", sandbox_id)
    if wants_json(json_out):
        print_json(removed)


def timeout(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    seconds: Annotated[int, typer.Argument(min=0, help="New lifetime, counted from now.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Set a sandbox to end SECONDS from now."""
    with api_client(url, api_key) as api:
        api.post(_sandbox_path(sandbox_id, "/timeout"), {"timeout": seconds})
    if wants_json(json_out):
        print_json({"sandboxID": sandbox_id, "timeout": seconds})
    else:
        print_message("Sandbox {} now ends in {} s.", sandbox_id, seconds)


def register(app: typer.Typer) -> None:
    app.command("ls")(ls)
    app.command("start")(start)
    app.command(
        "exec",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(exec_)
    app.command("shell")(shell)
    app.command("rm")(rm)
    app.command("timeout")(timeout)


def _sandbox_id(created: Any) -> str:
    sandbox_id = created.get("sandboxID") if isinstance(created, dict) else None
    if isinstance(sandbox_id, str) and sandbox_id:
        return sandbox_id
    raise CliError("the server's create response has no sandboxID")
