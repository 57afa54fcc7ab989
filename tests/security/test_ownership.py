"""In a user namespace nothing changes for users: files keep their owners through a filesystem pause,
a snapshot, a fork and a template build, although each copy moves them to another host uid range."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox, Template

from tests.framework.node import Node

MAKE = ("mkdir -p /srv/own && touch /srv/own/root-file && install -o user -g user -d /srv/own/user-dir "
        "&& install -o user -g user /dev/null /srv/own/user-dir/user-file && chown 4242:4343 /srv/own/odd "
        "2>/dev/null || (touch /srv/own/odd && chown 4242:4343 /srv/own/odd)")
OWNERS = ("python3 -c \"import os; print(*sorted(f'{p}={os.lstat(p).st_uid}:{os.lstat(p).st_gid}' for p in "
          "['/srv/own/root-file', '/srv/own/user-dir', '/srv/own/user-dir/user-file', '/srv/own/odd', "
          "'/home/user', '/etc/shadow']))\"")
EXPECTED = sorted(["/srv/own/root-file=0:0", "/srv/own/user-dir=1000:1000", "/srv/own/user-dir/user-file=1000:1000",
                   "/srv/own/odd=4242:4343", "/home/user=1000:1000", "/etc/shadow=0:42"])


def owners(box: Sandbox) -> list[str]:
    return sorted(box.commands.run(OWNERS, user="root").stdout.split())


@pytest.fixture
def made(node: Node) -> Iterator[Sandbox]:
    box = Sandbox.create(template="base", timeout=300)
    try:
        box.commands.run(MAKE, user="root")
        assert owners(box) == EXPECTED
        yield box
    finally:
        Sandbox.kill(box.sandbox_id)


def test_filesystem_pause_keeps_owners(made: Sandbox) -> None:
    assert made.pause(mode="filesystem") is True
    made.connect()
    assert owners(made) == EXPECTED


def test_snapshot_and_fork_keep_owners(made: Sandbox) -> None:
    info = made.create_snapshot()
    child = Sandbox.create(template=info.snapshot_id)
    forks = made.fork(count=1)
    try:
        assert owners(child) == EXPECTED
        assert all(owners(f) == EXPECTED for f in forks)
        assert owners(made) == EXPECTED
    finally:
        for box in (child, *forks):
            box.kill()
        Sandbox.delete_snapshot(info.snapshot_id)


def test_build_keeps_owners(node: Node) -> None:
    template = Template().from_template("base").run_cmd(MAKE, user="root")
    Template.build(template, "owners-kept")
    box = Sandbox.create(template="owners-kept")
    try:
        assert owners(box) == EXPECTED
        box.commands.run("touch /srv/own/user-dir/again")  # user still owns its dir
    finally:
        box.kill()
        with node.client() as c:
            c.delete("/templates/owners-kept")
