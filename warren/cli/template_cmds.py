"""Template commands: ``templates [ls|rm|inspect]`` and ``template import DIR --name NAME``.

(``pull`` and ``build`` make templates too: ``warren.cli.build_cmds``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from warren.cli.client import CliError
from warren.cli.options import ApiKeyOption, JsonOption, UrlOption, api_client
from warren.cli.output import Column, print_error, print_json, print_message, print_table, wants_json

IMPORT_TIMEOUT_S = 1800.0
"""The server copies the whole rootfs before it answers; a large one on a slow disk takes minutes."""

LIST_COLUMNS: tuple[Column, ...] = (
    ("TEMPLATE ID", "templateID"),
    ("NAMES", lambda row: row.get("names") or row.get("aliases")),
    ("STATUS", "buildStatus"),
    ("RUNTIME", "runtime"),
    ("CPU", "cpuCount"),
    ("MEMORY MB", "memoryMB"),
    ("CREATED", "createdAt"),
)

template_app = typer.Typer(name="template", help="Manage templates.", no_args_is_help=True)
templates_app = typer.Typer(
    name="templates", help="List, inspect and remove templates (no subcommand: list).", invoke_without_command=True
)


def _list(url: str | None, api_key: str | None, json_out: bool) -> None:
    with api_client(url, api_key) as api:
        found = api.get("/templates") or []
    if wants_json(json_out):
        print_json(found)
    else:
        print_table(found, LIST_COLUMNS, empty="No templates.")


@templates_app.callback()
def templates(
    ctx: typer.Context, url: UrlOption = None, api_key: ApiKeyOption = None, json_out: JsonOption = False
) -> None:
    """List templates (or run a subcommand)."""
    if ctx.invoked_subcommand is None:
        _list(url, api_key, json_out)


@templates_app.command("ls")
def ls(url: UrlOption = None, api_key: ApiKeyOption = None, json_out: JsonOption = False) -> None:
    """List templates."""
    _list(url, api_key, json_out)


@templates_app.command("inspect")
def inspect(
    template: Annotated[str, typer.Argument(help="Template name or id.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Show a template as JSON: layers, env, workdir, user, start command, how it was built."""
    with api_client(url, api_key) as api:
        print_json(api.get(f"/templates/{quote(template, safe='')}"))


@templates_app.command("rm")
def rm(
    names: Annotated[list[str], typer.Argument(metavar="TEMPLATE...", help="Template names or ids.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Delete templates (refused while a sandbox uses one); their unused layers are removed."""
    failed = []
    with api_client(url, api_key) as api:
        for name in names:
            try:
                api.delete(f"/templates/{quote(name, safe='')}")
            except CliError as exc:
                print_error(f"{name}: {exc}")
                failed.append(name)
            else:
                print_message("Removed template [bold]{}[/bold].", name)
    if failed:
        raise typer.Exit(1)


@template_app.command("import")
def import_(
    directory: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="A root filesystem directory on the server's host, under its import roots "
            "(WARREN_IMPORT_ROOTS; default: the cache dir).",
        ),
    ],
    name: Annotated[str, typer.Option("--name", "-n", help="Template name to create.")],
    runtime: Annotated[str | None, typer.Option("--runtime", help="Runtime for its sandboxes: runc or gvisor.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Import a root filesystem directory as a new template (the server copies it)."""
    body: dict[str, Any] = {"path": str(directory.absolute()), "name": name}
    if runtime is not None:
        body["runtime"] = runtime
    with api_client(url, api_key) as api:
        created = api.post("/warren/templates/import", body, timeout=IMPORT_TIMEOUT_S)
    if wants_json(json_out):
        print_json(created)
    else:
        template_id = created.get("templateID") if isinstance(created, dict) else None
        print_message("Imported {} as template [bold]{}[/bold] ({}).", directory, name, template_id or "?")


def register(app: typer.Typer) -> None:
    app.add_typer(templates_app)
    app.add_typer(template_app)
