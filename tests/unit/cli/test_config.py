from __future__ import annotations

from pathlib import Path

import pytest

from warren.cli.config import DEFAULT_URL, config_path, load_client_config, parse_config


def test_parse_config_reads_toml() -> None:
    assert parse_config('url = "http://h:1"\napi_key = "k"\n') == {"url": "http://h:1", "api_key": "k"}


def test_parse_config_reads_plain_key_value_lines() -> None:
    text = "# comment\nurl = http://h:1/\napi_key='k'\n\nnonsense\n"
    assert parse_config(text) == {"url": "http://h:1/", "api_key": "k"}


def test_config_path_follows_xdg_then_home() -> None:
    assert config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/warren/config")
    assert config_path({"HOME": "/home/u"}) == Path("/home/u/.config/warren/config")


def _write_config(home: Path, text: str) -> dict[str, str]:
    (home / "warren").mkdir(parents=True)
    (home / "warren" / "config").write_text(text)
    return {"XDG_CONFIG_HOME": str(home)}


def test_defaults_without_any_source(tmp_path: Path) -> None:
    cfg = load_client_config(env={"XDG_CONFIG_HOME": str(tmp_path)}, state_dir=tmp_path / "none")
    assert cfg.url == DEFAULT_URL
    assert cfg.api_key is None


def test_config_file_is_used(tmp_path: Path) -> None:
    env = _write_config(tmp_path, 'url = "http://file:1/"\napi_key = "file-key"\n')
    cfg = load_client_config(env=env, state_dir=tmp_path)
    assert (cfg.url, cfg.api_key) == ("http://file:1", "file-key")


@pytest.mark.parametrize(
    ("extra_env", "expected"),
    [
        ({"E2B_API_URL": "http://e2b:2", "E2B_API_KEY": "e2b-key"}, ("http://e2b:2", "e2b-key")),
        (
            {"E2B_API_URL": "http://e2b:2", "WARREN_URL": "http://w:3", "WARREN_API_KEY": "w-key"},
            ("http://w:3", "w-key"),
        ),
    ],
)
def test_environment_beats_config_file(tmp_path: Path, extra_env: dict[str, str], expected: tuple[str, str]) -> None:
    env = _write_config(tmp_path, "url = http://file:1\napi_key = file-key\n") | extra_env
    cfg = load_client_config(env=env, state_dir=tmp_path)
    assert (cfg.url, cfg.api_key) == expected


def test_flags_beat_everything(tmp_path: Path) -> None:
    env = _write_config(tmp_path, "url = http://file:1\n") | {"WARREN_URL": "http://w:3", "WARREN_API_KEY": "w"}
    cfg = load_client_config(url="http://flag:4", api_key="flag-key", env=env, state_dir=tmp_path)
    assert (cfg.url, cfg.api_key) == ("http://flag:4", "flag-key")


def test_node_api_key_file_is_the_last_resort(tmp_path: Path) -> None:
    (tmp_path / "api-key").write_text("node-key\n")
    cfg = load_client_config(env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}, state_dir=tmp_path)
    assert cfg.api_key == "node-key"
