"""Options shared by the client commands, and the one place they become a ``ClientConfig``."""

from __future__ import annotations

from typing import Annotated

import typer

from warren.cli.client import ApiClient
from warren.cli.config import ClientConfig, load_client_config

UrlOption = Annotated[
    str | None,
    typer.Option("--url", help="Server URL (env WARREN_URL, E2B_API_URL; config file)", show_default=False),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", help="API key (env WARREN_API_KEY, E2B_API_KEY; config file)", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON even on a terminal.")]
UserOption = Annotated[
    str | None, typer.Option("--user", "-u", help="Run as this user (default: the sandbox's, usually 'user').")
]


def client_config(url: str | None, api_key: str | None) -> ClientConfig:
    return load_client_config(url=url, api_key=api_key)


def api_client(url: str | None, api_key: str | None) -> ApiClient:
    return ApiClient(client_config(url, api_key))
