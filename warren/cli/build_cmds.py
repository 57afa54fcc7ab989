"""``warren pull IMAGE`` and ``warren build -f Dockerfile --name NAME [CONTEXT]``.

``pull`` streams ``POST /warren/images/pull`` and draws a Rich progress bar per layer and overall.
``build`` translates the Dockerfile (``warren.templates.dockerfile``) and makes the E2B SDK's calls:
``POST /v3/templates``, for each COPY ``GET /templates/{id}/files/{hash}`` and a PUT of the files'
tar when the server lacks it, ``POST /v2/templates/{id}/builds/{buildID}``, then polling the status
while printing its log.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

from warren.cli import output
from warren.cli.client import ApiClient, ApiError, CliError
from warren.cli.options import ApiKeyOption, JsonOption, UrlOption, api_client
from warren.cli.output import print_json, print_message, print_note, wants_json

PULL_TIMEOUT_S = 60.0
"""Seconds to connect and send the request; the answer itself may stream for as long as the pull takes."""
UPLOAD_TIMEOUT_S = 3600.0
POLL_S = 0.3
BUILD_TIMEOUT_S = 6 * 3600.0


class _PullView:
    """Progress bars for one pull: a bar per downloading layer and an overall bar (bytes)."""

    def __init__(self, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self._console = Console(stderr=True)
        self._enabled = enabled
        self._overall: TaskID | None = None
        self._layers: dict[str, TaskID] = {}
        self._done: dict[str, int] = {}

    def __enter__(self) -> _PullView:
        self.progress.__enter__()
        self._overall = self.progress.add_task("[bold]total", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def _update_overall(self) -> None:
        assert self._overall is not None
        total = sum(int(self.progress.tasks[t].total or 0) for t in self._layers.values())
        self.progress.update(self._overall, total=total or None, completed=sum(self._done.values()))

    def event(self, doc: dict[str, Any]) -> None:
        kind, digest = doc.get("event"), str(doc.get("digest", ""))
        short = digest.removeprefix("sha256:")[:12]
        if kind == "download":
            self._layers[digest] = self.progress.add_task(f"layer {short}", total=int(doc.get("total") or 0))
            self._done[digest] = 0
        elif kind in ("progress", "downloaded") and digest in self._layers:
            self._done[digest] = int(doc.get("current") or 0)
            self.progress.update(self._layers[digest], completed=self._done[digest])
        elif kind == "exists":
            self.note(f"layer {short}: already stored")
        elif kind == "unpacked":
            self.note(f"layer {short}: unpacked")
        elif kind == "warning":
            self.note(f"layer {short}: warning: {doc.get('message', '')}")
        elif kind == "log" and self._enabled:
            self.note(str(doc.get("message", "")))
        self._update_overall()

    def note(self, message: str) -> None:
        if self._enabled:
            self.progress.console.print(f"[dim]{escape(message)}[/dim]", highlight=False)


def pull(
    image: Annotated[str, typer.Argument(help="Image reference, e.g. debian:bookworm or host:5000/repo@sha256:…")],
    name: Annotated[str | None, typer.Option("--name", "-n", help="Template name (default: from the image).")] = None,
    runtime: Annotated[str | None, typer.Option("--runtime", help="Runtime of its sandboxes: runc or gvisor.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Pull an OCI image into a new template (layers are shared with earlier pulls)."""
    body: dict[str, Any] = {"image": image}
    if name is not None:
        body["name"] = name
    if runtime is not None:
        body["runtime"] = runtime
    started = time.monotonic()
    template: dict[str, Any] | None = None
    with api_client(url, api_key) as api, _PullView(output.stdout_is_tty() or output.stdin_is_tty()) as view:
        for doc in api.stream_lines("/warren/images/pull", body, timeout=PULL_TIMEOUT_S):
            if doc.get("event") == "error":
                raise CliError(str(doc.get("message") or "the pull failed"))
            if doc.get("event") == "template":
                template = doc.get("template")
                continue
            view.event(doc)
    if not isinstance(template, dict):
        raise CliError("the server ended the pull without a result")
    if wants_json(json_out):
        print_json(template)
    else:
        print_message(
            "Pulled {} as template [bold]{}[/bold] ({}) in {}s.",
            image, (template.get("names") or ["?"])[0], template.get("templateID"), f"{time.monotonic() - started:.1f}",
        )  # fmt: skip


def build(
    name: Annotated[str, typer.Option("--name", "-n", help="Template name to create (or rebuild).")],
    context: Annotated[Path, typer.Argument(help="Build context directory (COPY sources).")] = Path("."),
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Dockerfile (default: CONTEXT/Dockerfile).")] = None,
    cpu: Annotated[int | None, typer.Option("--cpu", min=1, help="vCPUs of its sandboxes.")] = None,
    memory: Annotated[int | None, typer.Option("--memory", min=64, help="Memory of its sandboxes, MB.")] = None,
    runtime: Annotated[str | None, typer.Option("--runtime", help="Runtime of its sandboxes: runc or gvisor.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every step again.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the build log.")] = False,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Build a template from a Dockerfile: FROM, RUN, ENV, ARG, WORKDIR, USER, COPY/ADD, CMD/ENTRYPOINT."""
    from warren.templates.dockerfile import context_tar, read_dockerfile, translate

    if not context.is_dir():
        raise CliError(f"build context {context} is not a directory")
    dockerfile = file if file is not None else context / "Dockerfile"
    plan = translate(read_dockerfile(dockerfile), context.absolute())
    for warning in plan.warnings:
        print_note(warning)
    started = time.monotonic()
    with api_client(url, api_key) as api:
        from_template = _template_named(api, plan.base_image)
        request: dict[str, Any] = {"name": name}
        if cpu is not None:
            request["cpuCount"] = cpu
        if memory is not None:
            request["memoryMB"] = memory
        if runtime is not None:
            request["runtime"] = runtime
        created = api.post("/v3/templates", request)
        template_id, build_id = str(created["templateID"]), str(created["buildID"])
        tid = quote(template_id, safe="")
        for copy in plan.copies:
            link = api.get(f"/templates/{tid}/files/{copy.files_hash}")
            if link.get("present") and not no_cache:
                continue
            if not link.get("url"):
                raise CliError(f"the server gave no upload link for COPY {copy.src}")
            with context_tar(copy, context.absolute()) as tar:
                api.put_content(str(link["url"]), tar, dict(link.get("headers") or {}), timeout=UPLOAD_TIMEOUT_S)
            if not quiet:
                print_note(f"uploaded {copy.src}")
        api.post(f"/v2/templates/{tid}/builds/{build_id}", plan.request(from_template=from_template, force=no_cache))
        status = _follow(api, tid, build_id, quiet=quiet)
        if status.get("status") != "ready":
            reason = status.get("reason") or {}
            raise CliError(str(reason.get("message") or "the build failed"))
        template = api.get(f"/templates/{tid}")
    if wants_json(json_out):
        print_json(template)
    else:
        print_message("Built template [bold]{}[/bold] ({}) in {}s.", name, template_id,
                      f"{time.monotonic() - started:.1f}")  # fmt: skip


def _template_named(api: ApiClient, name: str) -> str | None:
    """``name`` if the server has a template called that (FROM then builds on it), else None."""
    if "/" in name or "@" in name:
        return None
    try:
        api.get(f"/templates/aliases/{quote(name, safe='')}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return name


def _follow(api: ApiClient, tid: str, build_id: str, *, quiet: bool) -> dict[str, Any]:
    """Poll the build's status, printing new log entries, until it finished and the log is drained."""
    console = Console(stderr=True)
    offset = 0
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    while time.monotonic() < deadline:
        status: dict[str, Any] = api.get(f"/templates/{tid}/builds/{build_id}/status?logsOffset={offset}")
        entries = status.get("logEntries") or []
        offset += len(entries)
        if not quiet:
            for entry in entries:
                style = {"error": "red", "warn": "yellow"}.get(str(entry.get("level")), "dim")
                console.print(f"[{style}]{escape(str(entry.get('message', '')))}[/{style}]", highlight=False)
        if status.get("status") in ("ready", "error") and not entries:
            return status
        if not entries:
            time.sleep(POLL_S)
    raise CliError(f"build {build_id} did not finish in {BUILD_TIMEOUT_S:.0f}s")


def register(app: typer.Typer) -> None:
    app.command("pull")(pull)
    app.command("build")(build)
