"""The ``warren`` command line: a thin layer over ``warren.node`` and the REST API.

warren serve --listen 127.0.0.1:3000 --state-dir /var/lib/warren
warren setup
warren start base                  # start a sandbox and open a shell in it
warren ls | warren exec ID -- CMD | warren shell ID | warren rm ID | warren timeout ID SECONDS
warren pause ID | warren resume ID | warren fork ID -n N | warren metrics ID | warren logs ID
warren snapshot create ID [--name NAME] | warren snapshot ls | warren snapshot rm ID
warren templates [ls|inspect|rm] | warren template import DIR --name NAME
warren pull IMAGE --name NAME | warren build -f Dockerfile --name NAME [CONTEXT]
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from warren import __version__
from warren.cli import build_cmds, lifecycle_cmds, node_cmds, sandbox_cmds, template_cmds
from warren.cli.client import CliError
from warren.cli.output import print_error
from warren.errors import WarrenError


class _Group(TyperGroup):
    """Turns expected failures into one red line and exit status 1, for every subcommand."""

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        try:
            return super().invoke(ctx)
        except (CliError, WarrenError) as exc:
            print_error(str(exc) or type(exc).__name__)
            raise typer.Exit(1) from exc


app = typer.Typer(
    name="warren",
    cls=_Group,
    help="Self-hosted AI-agent sandboxes that serve the unmodified E2B SDK.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
node_cmds.register(app)
sandbox_cmds.register(app)
lifecycle_cmds.register(app)
template_cmds.register(app)
build_cmds.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"warren {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Self-hosted AI-agent sandboxes that serve the unmodified E2B SDK."""


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
