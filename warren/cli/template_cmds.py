"""Template commands: ``templates`` (list) and ``template import DIR --name NAME``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from warren.cli.options import ApiKeyOption, JsonOption, UrlOption, api_client
from warren.cli.output import Column, print_json, print_message, print_table, wants_json

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


def templates(url: UrlOption = None, api_key: ApiKeyOption = None, json_out: JsonOption = False) -> None:
    """List templates."""
    with api_client(url, api_key) as api:
        found = api.get("/templates") or []
    if wants_json(json_out):
        print_json(found)
    else:
        print_table(found, LIST_COLUMNS, empty="No templates.")


@template_app.command("import")
def import_(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A root filesystem directory on the server's host.")],
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
    app.command("templates")(templates)
    app.add_typer(template_app)
