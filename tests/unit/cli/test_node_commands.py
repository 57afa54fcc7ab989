from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from warren import __version__
from warren.cli import node_cmds
from warren.cli.main import app
from warren.templates import Progress


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:3000", ("127.0.0.1", 3000)),
        (":8080", ("0.0.0.0", 8080)),
        ("[::1]:3000", ("::1", 3000)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert node_cmds.parse_listen(value) == expected


@pytest.mark.parametrize("value", ["3000", "host:", "host:http", "host:70000", "host:0"])
def test_parse_listen_rejects(value: str) -> None:
    with pytest.raises(typer.BadParameter):
        node_cmds.parse_listen(value)


@dataclass(frozen=True)
class _Settings:
    state_dir: Path
    listen_host: str
    listen_port: int
    cache_dir: Path
    runsc_path: Path | None
    domain: str | None
    tls_cert: Path | None = None
    tls_key: Path | None = None


def _fake_loader(objects: dict[str, Any]) -> Callable[[str, str], Any]:
    return lambda module, attr: objects[f"{module}.{attr}"]


def test_serve_builds_settings_and_runs_the_node(
    clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(
        node_cmds,
        "_load",
        _fake_loader({"warren.config.Settings": _Settings, "warren.node.run_node": ran.append}),
    )
    args = ["serve", "--listen", "0.0.0.0:3100", "--state-dir", "/s", "--cache-dir", "/c"]
    result = runner.invoke(app, [*args, "--runsc", "/opt/runsc", "--domain", "w.test"])
    assert result.exit_code == 0, result.output
    assert ran == [_Settings(Path("/s"), "0.0.0.0", 3100, Path("/c"), Path("/opt/runsc"), "w.test")]


def test_serve_passes_the_tls_files(clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(
        node_cmds,
        "_load",
        _fake_loader({"warren.config.Settings": _Settings, "warren.node.run_node": ran.append}),
    )
    args = ["serve", "--state-dir", "/s", "--cache-dir", "/c", "--domain", "w.test:8443"]
    result = runner.invoke(app, [*args, "--tls-cert", "/t/c.pem", "--tls-key", "/t/k.pem"])
    assert result.exit_code == 0, result.output
    assert ran[0].domain == "w.test:8443"
    assert (ran[0].tls_cert, ran[0].tls_key) == (Path("/t/c.pem"), Path("/t/k.pem"))


def test_serve_defaults(clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(
        node_cmds,
        "_load",
        _fake_loader({"warren.config.Settings": _Settings, "warren.node.run_node": ran.append}),
    )
    monkeypatch.setenv("WARREN_CACHE_DIR", "/env-cache")
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 0, result.output
    assert ran == [_Settings(Path("/var/lib/warren"), "127.0.0.1", 3000, Path("/env-cache"), None, None)]


def test_serve_prefers_settings_from_env(clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    class _EnvSettings:
        @classmethod
        def from_env(cls, state_dir: Path, **overrides: object) -> tuple[Path, dict[str, object]]:
            return (state_dir, overrides)

    monkeypatch.setattr(
        node_cmds,
        "_load",
        _fake_loader({"warren.config.Settings": _EnvSettings, "warren.node.run_node": seen.append}),
    )
    result = runner.invoke(app, ["serve", "--state-dir", "/s"])
    assert result.exit_code == 0, result.output
    ((state_dir, overrides),) = seen
    assert state_dir == Path("/s")
    assert overrides["listen_port"] == 3000 and overrides["runsc_path"] is None


def test_serve_joins_a_cluster(clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    class _EnvSettings:
        @classmethod
        def from_env(cls, state_dir: Path, **overrides: object) -> dict[str, object]:
            return overrides

    monkeypatch.setattr(
        node_cmds,
        "_load",
        _fake_loader({"warren.config.Settings": _EnvSettings, "warren.node.run_node": seen.append}),
    )
    result = runner.invoke(app, ["serve", "--cluster-redis", "redis://127.0.0.1:6379/0"])
    assert result.exit_code == 0, result.output
    assert seen[0]["cluster_redis"] == "redis://127.0.0.1:6379/0"


def test_gateway_needs_redis_and_the_api_key(
    clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []

    @dataclass(frozen=True)
    class _GatewaySettings:
        redis_url: str
        api_key: str
        listen_host: str
        listen_port: int
        metrics_public: bool
        domain: str | None
        tls_cert: Path | None
        tls_key: Path | None
        state_dir: Path

    monkeypatch.setattr(
        node_cmds,
        "_load",
        _fake_loader(
            {
                "warren.cluster.gateway.run_gateway": ran.append,
                "warren.cluster.gateway.GatewaySettings": _GatewaySettings,
                "warren.api.tls.TlsConfigError": ValueError,
            }
        ),
    )
    for name in ("WARREN_API_KEY", "WARREN_DOMAIN", "WARREN_TLS_CERT", "WARREN_TLS_KEY", "WARREN_GATEWAY_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    result = runner.invoke(app, ["gateway", "--redis", "redis://r:6379/0"])
    assert result.exit_code != 0 and "API key" in result.output
    result = runner.invoke(app, ["gateway", "--redis", "redis://r:6379/0", "--listen", ":8081", "--api-key", "k"])
    assert result.exit_code == 0, result.output
    assert ran == [
        _GatewaySettings(
            "redis://r:6379/0", "k", "0.0.0.0", 8081, True, None, None, None, node_cmds.DEFAULT_GATEWAY_STATE_DIR
        )
    ]
    monkeypatch.setenv("WARREN_METRICS_PUBLIC", "0")
    result = runner.invoke(app, ["gateway", "--redis", "redis://r:6379/0", "--api-key", "k"])
    assert result.exit_code == 0, result.output
    assert ran[-1].metrics_public is False
    # Domain mode, as on a node: --domain, --tls-cert/--tls-key (or WARREN_DOMAIN, WARREN_TLS_*), a state dir.
    result = runner.invoke(app, ["gateway", "--redis", "redis://r:6379/0", "--api-key", "k", "--domain", "w.test:8443",
                                 "--tls-cert", "/c.pem", "--tls-key", "/k.pem", "--state-dir", "/gw"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (ran[-1].domain, ran[-1].tls_cert, ran[-1].tls_key) == ("w.test:8443", Path("/c.pem"), Path("/k.pem"))
    assert ran[-1].state_dir == Path("/gw")
    monkeypatch.setenv("WARREN_DOMAIN", "env.test")
    monkeypatch.setenv("WARREN_GATEWAY_STATE_DIR", "/gw2")
    result = runner.invoke(app, ["gateway", "--redis", "redis://r:6379/0", "--api-key", "k"])
    assert result.exit_code == 0, result.output
    assert (ran[-1].domain, ran[-1].tls_cert, ran[-1].state_dir) == ("env.test", None, Path("/gw2"))


def test_serve_rejects_a_bad_listen_address(clean_env: Path, runner: CliRunner) -> None:
    result = runner.invoke(app, ["serve", "--listen", "nonsense"])
    assert result.exit_code == 2
    assert "HOST:PORT" in result.output


def test_load_reports_missing_modules_cleanly() -> None:
    from warren.cli.client import CliError

    with pytest.raises(CliError, match="not available"):
        node_cmds._load("warren._no_such_module", "run_node")


def test_setup_builds_the_bundle_and_templates(
    clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[Any] = []

    async def build_agent_bundle(cache_dir: Path, guest_src: Path) -> Path:
        calls.append(("bundle", cache_dir, guest_src.name))
        return cache_dir / "agent-x"

    def ensure(cache_dir: Path, *, on_progress: Callable[[str, Progress], None]) -> dict[str, Path]:
        calls.append(("templates", cache_dir))
        on_progress("busybox", Progress.CACHED)
        on_progress("base", Progress.BUILDING)
        on_progress("base", Progress.BUILT)
        return {"busybox": cache_dir / "templates/busybox", "base": cache_dir / "templates/base"}

    monkeypatch.setattr(
        node_cmds, "_load", _fake_loader({"warren.runtime.agent_bundle.build_agent_bundle": build_agent_bundle})
    )
    monkeypatch.setattr(node_cmds, "ensure_builtin_templates", ensure)
    result = runner.invoke(app, ["setup", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert calls == [("bundle", tmp_path, "guest"), ("templates", tmp_path)]
    assert "template busybox (cached)" in result.stderr
    assert "template base (built)" in result.stderr


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"warren {__version__}"


def test_main_is_the_console_script(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from warren.cli.main import main

    monkeypatch.setattr("sys.argv", ["warren", "--version"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0
    assert "warren" in capsys.readouterr().out


def test_serve_names_a_shared_store(clean_env: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    class _EnvSettings:
        @classmethod
        def from_env(cls, state_dir: Path, **overrides: object) -> dict[str, object]:
            return overrides

    monkeypatch.setattr(
        node_cmds,
        "_load",
        _fake_loader({"warren.config.Settings": _EnvSettings, "warren.node.run_node": seen.append}),
    )
    result = runner.invoke(app, ["serve", "--shared-store", "s3://snaps/prod"])
    assert result.exit_code == 0, result.output
    assert seen[0]["shared_store"] == "s3://snaps/prod"
    result = runner.invoke(app, ["serve"])
    assert "shared_store" not in seen[1]  # unset: WARREN_SHARED_STORE (Settings.from_env) decides
