"""Templates from OCI images and builds, through the unmodified E2B SDK, the REST API and the CLI.

The test images live in a real registry (Debian's ``docker-registry``): the built-in busybox rootfs
as a base layer (it has a ``/bin/bash`` shim and the user ``user``) plus small layers of their own.
Builds that need Python start from the built-in ``base`` template.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException
from e2b.template.main import TemplateFinal

from tests.framework import leaks
from tests.framework.images import Layer, image_config, layer_from_dir, make_layer, member
from tests.framework.node import DEFAULT_CACHE, Node
from tests.framework.registry import PushedImage, Registry, auth_registry, free_port, push_image, registry

__all__ = ["auth_registry", "registry"]  # session registry fixtures, used by the tests below

PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVER_PORT = 8765


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def busybox_base() -> Layer:
    """The built-in busybox rootfs as one image layer."""
    rootfs = DEFAULT_CACHE / "templates" / "busybox" / "rootfs"
    if not rootfs.is_dir():
        pytest.skip(f"no busybox template in {DEFAULT_CACHE}")
    return layer_from_dir(rootfs)


def _file_layer(files: dict[str, bytes]) -> Layer:
    dirs = sorted({str(Path(p).parent) for p in files if str(Path(p).parent) != "."})
    members = [member(d, kind=tarfile.DIRTYPE, mode=0o755) for d in dirs]
    members += [member(path, data) for path, data in sorted(files.items())]
    return make_layer(members)


def _push(reg: Registry, repo: str, layers: list[Layer], *, env: tuple[str, ...] = (PATH,)) -> PushedImage:
    return push_image(reg, repo, "v1", layers, config=image_config(layers, env=env))


def _cli(node: Node, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WARREN_URL": node.url, "WARREN_API_KEY": node.api_key}
    return subprocess.run([sys.executable, "-m", "warren.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)  # fmt: skip


def _store(node: Node) -> dict[str, object]:
    """What a failed build must not change: template names and the layer, image and sandbox dirs."""
    with node.client() as c:
        names = sorted(n for t in c.get("/templates").json() for n in t["names"])

    def ls(p: Path) -> list[str]:
        return sorted(os.listdir(p)) if p.is_dir() else []

    state = node.state_dir
    return {
        "templates": names,
        "layers": ls(state / "layers"),
        "images": ls(state / "images" / "layers"),
        "sandboxes": ls(state / "sandboxes"),
        "image_tmp": ls(state / "images" / "tmp"),
    }


def _build_leftovers(node: Node) -> dict[str, list[str]]:
    """Host resources of build sandboxes (``bld…``): processes, netns, cgroups, mounts under the state dir.

    Scoped to build sandboxes so that other nodes and tests running on the host at the same time
    cannot make it fail.
    """
    processes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if "/bld" in Path(f"/proc/{pid}/cgroup").read_text():
                processes.append(pid)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    root = Path("/sys/fs/cgroup")
    cgroups = [str(p) for pattern in ("warren/bld*", "*/warren/bld*") for p in root.glob(pattern)]
    return {
        "processes": processes,
        "netns": [n for n in netns if n.startswith("wrn-bld")],
        "cgroups": cgroups,
        "mounts": sorted(m for m in leaks.snapshot(state_dirs=[node.state_dir]).mounts if "/bld" in m),
    }


def _assert_no_build_leftovers(node: Node, settle: float = 5.0) -> None:
    deadline = time.monotonic() + settle
    while True:
        left = {k: v for k, v in _build_leftovers(node).items() if v}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"build sandbox leftovers: {left}"


@dataclass
class Made:
    """What a test created: sandboxes are killed, then templates deleted (in that order)."""

    sandboxes: list[Sandbox] = field(default_factory=list)
    templates: list[str] = field(default_factory=list)

    def sandbox(self, template: str) -> Sandbox:
        box = Sandbox.create(template=template, timeout=120)
        self.sandboxes.append(box)
        return box


@pytest.fixture
def made(node: Node) -> Iterator[Made]:
    record = Made()
    yield record
    for box in record.sandboxes:
        with contextlib.suppress(Exception):
            box.kill()
    with node.client() as c:
        for name in record.templates:
            r = c.delete(f"/templates/{name}")
            assert r.status_code in (204, 404), r.text


def _expect_build_error(node: Node, template: object, name: str, *needles: str) -> list[str]:
    """Build, expect a BuildException mentioning ``needles``; nothing of it may stay behind."""
    before_store = _store(node)
    logs: list[str] = []
    with pytest.raises(BuildException) as err:
        Template.build(template, name, on_build_logs=lambda e: logs.append(str(e.message)))  # type: ignore[arg-type]
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    _assert_no_build_leftovers(node)
    assert _store(node) == before_store
    with node.client() as c:
        assert c.get(f"/templates/aliases/{name}").status_code == 404
    return logs


# --------------------------------------------------------------------------- SDK builds


def _context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "conf" / "sub").mkdir(parents=True)
    (ctx / "hello.txt").write_text("hello from the context\n")
    (ctx / "conf" / "app.ini").write_text("[app]\nmode=test\n")
    (ctx / "conf" / "sub" / "deep.txt").write_text("deep\n")
    (ctx / "run.sh").write_text("#!/bin/sh\necho run\n")
    (ctx / "run.sh").chmod(0o755)
    return ctx


def test_sdk_build_from_template_and_create(
    node: Node, tmp_path: Path, made: Made) -> None:
    ctx = _context(tmp_path)
    ready = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {SERVER_PORT}), 1)\""

    def template(skip_cache: bool = False) -> TemplateFinal:
        start = Template(file_context_path=str(ctx))
        return (
            (start.skip_cache() if skip_cache else start)
            .from_template("base")
            .run_cmd("echo step-one-output && rm /etc/motd && mkdir -p /opt/tools && echo tool > /opt/tools/t.txt",
                     user="root")
            .set_workdir("/app")
            .set_envs({"GREETING": "hello", "APP_MODE": "test"})
            .copy("hello.txt", "/app/hello.txt")
            .copy("conf", "/app/conf")
            .copy("run.sh", "/usr/local/bin/")
            .set_user("appuser")
            .set_start_cmd(f"python3 -m http.server {SERVER_PORT} --bind 127.0.0.1", ready)
        )  # fmt: skip

    made.templates.append("sdk-built")
    logs: list[str] = []
    started = time.monotonic()
    Template.build(template(), "sdk-built", cpu_count=1, memory_mb=512, on_build_logs=lambda e: logs.append(e.message))
    print(f"\nSDK build (7 steps from template base): {time.monotonic() - started:.2f}s")
    assert any("step-one-output" in line for line in logs)
    assert Template.exists("sdk-built")

    sbx = made.sandbox("sdk-built")
    assert sbx.files.read("/app/hello.txt") == "hello from the context\n"
    assert sbx.files.read("/app/conf/app.ini") == "[app]\nmode=test\n"
    assert sbx.files.read("/app/conf/sub/deep.txt") == "deep\n"
    out = sbx.commands.run(
        "pwd; echo $GREETING $APP_MODE; whoami; test -e /etc/motd || echo motd-removed; cat /opt/tools/t.txt; "
        "run.sh; stat -c '%U %a' /app/hello.txt /usr/local/bin/run.sh"
    )
    assert out.stdout.splitlines() == [
        "/app", "hello test", "appuser", "motd-removed", "tool", "run", "user 644", "user 755",
    ]  # fmt: skip
    assert sbx.commands.run(f"pgrep -f 'http.server {SERVER_PORT}'").exit_code == 0
    listed = httpx.get(f"{node.url}/v2/templates", headers={"X-API-Key": node.api_key}).json()
    assert "sdk-built" in [t["names"][0] for t in listed]

    # The same steps again come from the cache: no step runs, the layers are the same.
    with node.client() as c:
        first = c.get("/templates/sdk-built").json()
    logs.clear()
    started = time.monotonic()
    Template.build(template(), "sdk-built", on_build_logs=lambda e: logs.append(e.message))
    print(f"cached rebuild: {time.monotonic() - started:.2f}s")
    assert "step-one-output" not in logs  # the RUN step did not run again
    assert any(line.startswith("CACHED [7/7]") for line in logs), logs
    with node.client() as c:
        second = c.get("/templates/sdk-built").json()
    assert second["layers"] == first["layers"] and second["buildID"] != first["buildID"]
    assert second["buildCount"] == 2

    # skip_cache() runs every step again and makes a new layer.
    logs.clear()
    Template.build(template(skip_cache=True), "sdk-built", on_build_logs=lambda e: logs.append(e.message))
    assert "step-one-output" in logs
    with node.client() as c:
        third = c.get("/templates/sdk-built").json()
    assert third["layers"][:-1] == first["layers"][:-1] and third["layers"][-1] != first["layers"][-1]
    old_layer, new_layer = Path(first["layers"][-1]), Path(third["layers"][-1])
    assert old_layer.is_dir()  # the sandbox made from the first build still runs on it
    sbx.kill()
    made.sandboxes.clear()
    with node.client() as c:
        assert c.delete("/templates/sdk-built").status_code == 204
    assert not old_layer.exists() and not new_layer.exists()  # both build layers were collected
    assert Path(first["layers"][0]).is_dir()  # the base template's layer stays


def test_build_in_background_is_not_a_listed_sandbox(node: Node, made: Made) -> None:
    """A build runs in a real sandbox that GET /v2/sandboxes never shows; its log pages by logsOffset."""
    made.templates.append("slow-build")
    template = Template().from_template("base").run_cmd("echo begin; sleep 2; echo end")
    info = Template.build_in_background(template, "slow-build")
    sandboxes_dir = node.state_dir / "sandboxes"
    seen_build_sandbox = False
    offset, messages = 0, []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen_build_sandbox |= any(p.name.startswith("bld") for p in sandboxes_dir.iterdir())
        with node.client() as c:
            assert c.get("/v2/sandboxes").json() == []
        status = Template.get_build_status(info, logs_offset=offset)
        offset += len(status.log_entries)
        messages += [e.message for e in status.log_entries]
        if status.status.value in ("ready", "error") and not status.log_entries:
            break
        time.sleep(0.1)
    assert status.status.value == "ready", status.reason
    assert seen_build_sandbox and not any(p.name.startswith("bld") for p in sandboxes_dir.iterdir())
    assert messages.index("begin") < messages.index("end")
    assert len(messages) == len(set(zip(range(len(messages)), messages, strict=True)))  # no entry served twice
    with node.client() as c:
        paged = c.get(f"/templates/{info.template_id}/builds/{info.build_id}/status",
                      params={"logsOffset": 1, "limit": 2}).json()  # fmt: skip
    assert [e["message"] for e in paged["logEntries"]] == messages[1:3]


def test_three_step_build_time(node: Node, made: Made) -> None:
    """``from_base_image()`` (the SDK's default, e2bdev/base) builds on the built-in ``base`` template."""
    template = (
        Template()
        .from_base_image()
        .run_cmd("echo one > /home/user/one.txt")
        .set_envs({"THREE": "3"})
        .run_cmd("echo two > /home/user/two.txt")
    )
    made.templates.append("three-steps")
    started = time.monotonic()
    Template.build(template, "three-steps")
    print(f"\n3-step build: {time.monotonic() - started:.2f}s")
    sbx = made.sandbox("three-steps")
    assert sbx.commands.run("cat one.txt two.txt; echo $THREE").stdout == "one\ntwo\n3\n"


def test_sdk_build_from_image(
    node: Node, registry: Registry, busybox_base: Layer, tmp_path: Path, made: Made
) -> None:
    image = _push(registry, "warren-test/sdk-base", [busybox_base, _file_layer({"etc/flavour": b"sdk\n"})],
                  env=(PATH, "FROM_IMAGE=yes"))  # fmt: skip
    ctx = _context(tmp_path)
    template = (
        Template(file_context_path=str(ctx))
        .from_image(image.ref)
        .copy("hello.txt", "hello.txt")
        .run_cmd("echo $FROM_IMAGE > from-image.txt")
    )
    made.templates.append("sdk-image")
    Template.build(template, "sdk-image")
    sbx = made.sandbox("sdk-image")
    out = sbx.commands.run("whoami; pwd; cat /etc/flavour hello.txt from-image.txt")
    assert out.stdout == "user\n/home/user\nsdk\nhello from the context\nyes\n"


# --------------------------------------------------------------------------- pulls


def test_pull_api_then_cli_shares_base_layers(
    node: Node, registry: Registry, busybox_base: Layer, made: Made
) -> None:
    layer_a, layer_b = _file_layer({"etc/image-a": b"A\n"}), _file_layer({"etc/image-b": b"B\n"})
    image_a = _push(registry, "warren-test/pull-a", [busybox_base, layer_a], env=(PATH, "IMAGE=a"))
    image_b = _push(registry, "warren-test/pull-b", [busybox_base, layer_b], env=(PATH, "IMAGE=b"))
    made.templates.extend(["pulled-a", "pulled-b"])

    started = time.monotonic()
    with node.client() as c:
        r = c.post("/warren/images/pull", json={"image": image_a.ref, "name": "pulled-a"}, timeout=300)
    print(f"\npull through the API: {time.monotonic() - started:.2f}s")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    events = [json.loads(line) for line in r.text.splitlines()]
    assert events[-1]["event"] == "template", events[-1]
    assert {"resolved", "download", "downloaded", "unpacked"} <= {e["event"] for e in events}
    template_a = events[-1]["template"]

    sbx = made.sandbox("pulled-a")
    assert sbx.commands.run("cat /etc/image-a; echo $IMAGE; whoami").stdout == "A\na\nroot\n"

    mark = registry.mark()
    started = time.monotonic()
    result = _cli(node, "pull", image_b.ref, "--name", "pulled-b", "--json")
    print(f"pull through the CLI (base layer shared): {time.monotonic() - started:.2f}s")
    assert result.returncode == 0, result.stderr
    template_b = json.loads(result.stdout)
    assert template_b["names"] == ["pulled-b"]
    assert registry.blob_gets(busybox_base.digest, since=mark) == []  # the shared layer was not fetched again
    assert registry.blob_gets(layer_b.digest, since=mark)

    store = node.state_dir / "images" / "layers"
    base_dir = store / busybox_base.diff_id.removeprefix("sha256:")
    stored = os.listdir(store)
    assert {x.diff_id.removeprefix("sha256:") for x in (busybox_base, layer_a, layer_b)} <= set(stored)
    assert template_a["layers"][0] == template_b["layers"][0] == str(base_dir)

    sbx = made.sandbox("pulled-b")
    assert sbx.commands.run("cat /etc/image-b; echo $IMAGE").stdout == "B\nb\n"

    # A taken name is refused before anything is pulled.
    with node.client() as c:
        r = c.post("/warren/images/pull", json={"image": image_b.ref, "name": "pulled-b"})
        assert r.status_code == 409 and "exists" in r.json()["message"]


# --------------------------------------------------------------------------- the CLI


def test_cli_build_from_dockerfile_and_manage(
    node: Node, registry: Registry, busybox_base: Layer, tmp_path: Path, made: Made
) -> None:
    image = _push(registry, "warren-test/cli-base", [busybox_base])
    ctx = tmp_path / "cli-ctx"
    (ctx / "data").mkdir(parents=True)
    (ctx / "app.sh").write_text("#!/bin/sh\necho app-ran\n")
    (ctx / "app.sh").chmod(0o755)
    (ctx / "data" / "one.txt").write_text("one\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {image.ref}\n"
        "ENV GREETING=hi TARGET=world\n"
        "RUN echo built-by-dockerfile > /built.txt\n"
        "WORKDIR /srv/app\n"
        "COPY app.sh ./app.sh\n"
        "COPY --chown=user data/ /srv/data/\n"
        "USER user\n"
        'CMD ["sleep", "1000"]\n'
    )
    made.templates.append("cli-built")
    result = _cli(node, "build", "-f", str(ctx / "Dockerfile"), "--name", "cli-built", str(ctx), "--json")
    assert result.returncode == 0, result.stderr
    built = json.loads(result.stdout)
    assert built["startCmd"] == "sleep 1000" and built["user"] == "user" and built["workdir"] == "/srv/app"

    sbx = made.sandbox("cli-built")
    out = sbx.commands.run("cat /built.txt; pwd; whoami; ./app.sh; cat /srv/data/one.txt; echo $GREETING $TARGET; "
                           "stat -c %U /srv/data/one.txt; ps -o args | grep -c '^sleep 1000'")  # fmt: skip
    assert out.stdout == "built-by-dockerfile\n/srv/app\nuser\napp-ran\none\nhi world\nuser\n1\n"

    listed = _cli(node, "templates", "ls", "--json")
    assert listed.returncode == 0 and "cli-built" in [t["names"][0] for t in json.loads(listed.stdout)]
    shown = _cli(node, "templates", "inspect", "cli-built")
    assert shown.returncode == 0 and json.loads(shown.stdout)["build"]["source"]["image"].endswith("cli-base:v1")
    busy = _cli(node, "templates", "rm", "cli-built")
    assert busy.returncode == 1 and "used by a sandbox" in busy.stderr
    sbx.kill()
    made.sandboxes.clear()
    layer = Path(built["layers"][-1])
    assert layer.is_dir()
    gone = _cli(node, "templates", "rm", "cli-built")
    assert gone.returncode == 0, gone.stderr
    assert not layer.exists()  # its own build layer went with it
    assert _cli(node, "templates", "inspect", "cli-built").returncode == 1


# --------------------------------------------------------------------------- bad input


def test_unknown_image_and_tag(node: Node, registry: Registry, busybox_base: Layer) -> None:
    _expect_build_error(node, Template().from_image(f"{registry.host}/warren-test/nope:v1").run_cmd("true"),
                        "bad-repo", "not found")  # fmt: skip
    image = _push(registry, "warren-test/tagged", [busybox_base])
    _expect_build_error(node, Template().from_image(image.ref.replace(":v1", ":missing")).run_cmd("true"),
                        "bad-tag", "not found")  # fmt: skip


def test_registry_credentials(node: Node, auth_registry: Registry, busybox_base: Layer, made: Made) -> None:
    """A registry that wants credentials is a build error without them (not a 401 of warren's API)."""
    image = _push(auth_registry, "warren-test/private", [busybox_base, _file_layer({"etc/private": b"p\n"})])
    _expect_build_error(node, Template().from_image(image.ref).run_cmd("true"), "private", "refused access")
    made.templates.append("private")
    user, password = auth_registry.credentials or ("", "")
    Template.build(Template().from_image(image.ref, username=user, password=password).run_cmd("true"), "private")
    assert made.sandbox("private").commands.run("cat /etc/private").stdout == "p\n"


def test_registry_down(node: Node) -> None:
    ref = f"127.0.0.1:{free_port()}/warren-test/gone:v1"
    _expect_build_error(node, Template().from_image(ref).run_cmd("true"), "no-registry", "cannot pull")


def test_corrupted_blob(node: Node, registry: Registry, busybox_base: Layer) -> None:
    bad = _file_layer({"etc/corrupt-me": os.urandom(4096)})
    image = _push(registry, "warren-test/corrupt", [busybox_base, bad])
    blob = registry.blob_file(bad.digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    _expect_build_error(node, Template().from_image(image.ref).run_cmd("true"), "corrupt", "digest")


def test_unsafe_layer(node: Node, registry: Registry, busybox_base: Layer) -> None:
    image = _push(registry, "warren-test/unsafe-dotdot", [busybox_base, make_layer([member("../escape.txt", b"x")])])
    _expect_build_error(node, Template().from_image(image.ref).run_cmd("true"), "unsafe", "unsafe layer", "'..'")


def test_device_node_in_a_layer_is_dropped_with_a_warning(node: Node, registry: Registry, busybox_base: Layer) -> None:
    """As rootless engines do: the image builds, the device is not in it, and the build log says so."""
    layer = make_layer([member("opt/evil", kind=tarfile.CHRTYPE), member("etc/kept.txt", b"kept")])
    image = _push(registry, "warren-test/with-device", [busybox_base, layer])
    logs: list[str] = []
    Template.build(Template().from_image(image.ref).run_cmd("true"), "with-device",
                   on_build_logs=lambda e: logs.append(str(e.message)))  # type: ignore[arg-type]
    assert any("opt/evil" in line for line in logs), logs
    box = Sandbox.create(template="with-device")
    try:
        out = box.commands.run("cat /etc/kept.txt; test ! -e /opt/evil && echo gone").stdout
        assert out.strip() == "keptgone"  # kept.txt has no newline
    finally:
        box.kill()
        with node.client() as c:
            c.delete("/templates/with-device")


def test_failing_run_step(node: Node) -> None:
    template = Template().from_template("base").run_cmd("echo first-ok").run_cmd("echo about-to-fail >&2; exit 3")
    logs = _expect_build_error(node, template, "fails", "step 2", "exit code 3")
    assert any("about-to-fail" in line for line in logs), logs


def test_bad_build_requests(node: Node) -> None:
    with node.client() as c:
        assert c.post("/v3/templates", json={"name": "bad name!"}).status_code == 400
        created = c.post("/v3/templates", json={"alias": "old-alias-field"})
        assert created.status_code == 202
        body = created.json()
        assert set(body) >= {"templateID", "buildID", "public", "names", "tags", "aliases"}
        url = f"/v2/templates/{body['templateID']}/builds/{body['buildID']}"
        assert c.post(url, json={"fromTemplate": "base", "steps": [{"type": "FROB", "args": []}]}).status_code == 400
        assert c.post(url, json={"steps": []}).status_code == 400
        assert c.get(f"/templates/{body['templateID']}/builds/nope/status").status_code == 404
        assert c.get("/templates/aliases/old-alias-field").status_code == 404  # never built
        assert c.delete("/templates/never-existed").status_code == 404


def test_delete_template_in_use_is_409(node: Node, made: Made) -> None:
    made.templates.append("in-use")
    Template.build(Template().from_template("base").run_cmd("echo hi > /home/user/hi"), "in-use")
    sbx = made.sandbox("in-use")
    with node.client() as c:
        r = c.delete("/templates/in-use")
        assert r.status_code == 409 and "used by a sandbox" in r.json()["message"]
        sbx.kill()
        made.sandboxes.clear()
        assert c.delete("/templates/in-use").status_code == 204
        assert c.get("/templates/aliases/in-use").status_code == 404


def test_node_killed_mid_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL during a build leaves a running build sandbox; the next start removes it and its layer."""
    node = Node(state_dir=tmp_path / "state", port=free_port(), api_key="wrn_build_" + os.urandom(6).hex())
    node.start()
    for k, v in node.env().items():
        monkeypatch.setenv(k, v)
    try:
        info = Template.build_in_background(Template().from_template("base").run_cmd("sleep 600"), "killed")
        sandboxes_dir = node.state_dir / "sandboxes"
        deadline = time.monotonic() + 30
        while not any(p.name.startswith("bld") for p in sandboxes_dir.iterdir()):
            assert time.monotonic() < deadline, "the build sandbox never appeared"
            time.sleep(0.05)
        time.sleep(0.5)
        assert Template.get_build_status(info).status.value == "building"
        node.stop(signal.SIGKILL)
        assert _build_leftovers(node)["processes"]  # the build sandbox outlived the node
        node.start()
        _assert_no_build_leftovers(node)
        assert not any(p.name.startswith("bld") for p in sandboxes_dir.iterdir())
        assert not any(p.name.startswith("build-") for p in (node.state_dir / "layers").iterdir())
        with node.client() as c:
            assert c.get("/templates/aliases/killed").status_code == 404
    finally:
        node.stop()
