from __future__ import annotations

from pathlib import Path

import pytest

from warren.templates.debian import (
    DEFAULT_MIRROR,
    host_debian_mirror,
    is_debian_archive,
    parse_deb822_uris,
    parse_one_line_uris,
)

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: bookworm
\t
Types: deb
URIs: http://mirror.example/debian/
 http://second.example/debian
Suites: trixie trixie-updates
Components: main
"""


def test_deb822_keeps_enabled_binary_stanzas_in_order() -> None:
    assert list(parse_deb822_uris(DEB822)) == [
        "http://deb.debian.org/debian-security",
        "http://mirror.example/debian/",
        "http://second.example/debian",
    ]


def test_one_line_sources_skip_options_comments_and_deb_src() -> None:
    text = (
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://opts.example/debian bookworm main\n"
        "deb http://plain.example/debian bookworm main # trailing\n"
    )
    assert list(parse_one_line_uris(text)) == ["http://opts.example/debian", "http://plain.example/debian"]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("http://deb.debian.org/debian", True),
        ("https://mirror.example/debian/", True),
        ("http://cache.local:3142/deb.debian.org/debian", True),
        ("http://snapshot.debian.org/archive/debian/20250520T000000Z", True),
        ("http://deb.debian.org/debian-security", False),
        ("http://security.debian.org/debian-security", False),
        ("https://deb.nodesource.com/node_20.x", False),
        ("https://packages.cloud.google.com/apt", False),
        ("mirror+file:/etc/apt/mirrors/debian.list", False),
        ("cdrom:[Debian]/debian", False),
    ],
)
def test_is_debian_archive(uri: str, expected: bool) -> None:
    assert is_debian_archive(uri) is expected


def test_host_mirror_skips_security_and_third_party(tmp_path: Path) -> None:
    listdir = tmp_path / "sources.list.d"
    listdir.mkdir()
    (listdir / "a-google.list").write_text("deb https://packages.cloud.google.com/apt cloud-sdk main\n")
    (listdir / "b-nodesource.sources").write_text(
        "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\n"
    )
    (listdir / "debian.sources").write_text(DEB822)
    (listdir / "ignored.list.disabled").write_text("deb http://ignored.example/debian bookworm main\n")
    assert host_debian_mirror([tmp_path / "sources.list", listdir]) == "http://mirror.example/debian"


def test_host_mirror_defaults_without_sources(tmp_path: Path) -> None:
    assert host_debian_mirror([tmp_path / "missing.list", tmp_path / "missing.d"]) == DEFAULT_MIRROR
