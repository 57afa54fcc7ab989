"""Template tags through the unmodified E2B SDK: ``name:tag`` builds, ``Template.assign_tags/remove_tags/
get_tags`` (``POST``/``DELETE /templates/tags``, ``GET /templates/{id}/tags``) and ``name:tag`` at create.

E2B's rules: a build with no tags gets the tag ``default``; ``name`` means ``name:default``; tags are
lower-cased, ``[a-z0-9._-]`` and not a UUID (else 400); ``default`` cannot be removed (400); an unknown
template or tag is 404. Tags are stored, so they survive a restart of the node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from e2b import AsyncSandbox, AsyncTemplate, Sandbox, Template
from e2b.exceptions import SandboxException, TemplateException

from tests.e2e.conftest import RUNTIMES
from tests.framework.node import Node


def _base(runtime: str) -> str:
    return "base" if runtime == "runc" else "base-gvisor"


def _marked(runtime: str, text: str) -> Template:
    return Template().from_template(_base(runtime)).run_cmd(f"echo {text} > /etc/tagged", user="root")


@pytest.fixture(scope="module", params=RUNTIMES)
def tagged(request: pytest.FixtureRequest, node: Node) -> Iterator[str]:
    """Template ``tags-<runtime>-<hex>``: its default build writes ``one``, its ``v2`` build ``two``."""
    runtime = str(request.param)
    if runtime == "gvisor":
        with node.client() as c:
            probe = c.get("/health").json()["runtimes"].get("gvisor", {})
        if not probe.get("available"):
            pytest.skip(f"gVisor unavailable on this node: {probe.get('reason')}")
    name = f"tags-{runtime}-{uuid.uuid4().hex[:6]}"
    layers = node.state_dir / "layers"
    before = {p.name for p in layers.iterdir()} if layers.is_dir() else set()
    with pytest.MonkeyPatch.context() as mp:  # the autouse SDK env is per test; this fixture is per module
        for k, v in node.env().items():
            mp.setenv(k, v)
        Template.build(_marked(runtime, "one"), name)
        Template.build(_marked(runtime, "two"), f"{name}:v2")
    try:
        yield name
    finally:
        with node.client() as c:
            for box in c.get("/v2/sandboxes").json():
                if box.get("alias") == name:
                    c.delete(f"/sandboxes/{box['sandboxID']}")
            assert c.delete(f"/templates/{name}").status_code in (204, 404)
        # Both builds' layers (the default's and the one only a tag kept) were collected with the template.
        assert {p.name for p in layers.iterdir() if p.name.startswith("build-")} <= before


def _marker(template: str) -> str:
    box = Sandbox.create(template=template, timeout=60)
    try:
        return box.files.read("/etc/tagged").strip()
    finally:
        box.kill()


def test_tags_sync(node: Node, tagged: str) -> None:
    tags = {t.tag: t.build_id for t in Template.get_tags(tagged)}
    assert set(tags) == {"default", "v2"} and tags["default"] != tags["v2"]
    assert _marker(tagged) == "one"  # a bare name is its default tag
    assert _marker(f"{tagged}:default") == "one"
    assert _marker(f"{tagged}:v2") == "two"
    with node.client() as c:
        assert c.get(f"/templates/{tagged}").json()["names"] == [tagged]

    info = Template.assign_tags(f"{tagged}:v2", ["Prod", "stable", "prod"])
    assert info.build_id == tags["v2"] and sorted(info.tags) == ["prod", "stable"]
    assert _marker(f"{tagged}:prod") == "two"
    Template.assign_tags(tagged, "old")  # the target without a tag is its default build
    assert {t.tag: t.build_id for t in Template.get_tags(tagged)}["old"] == tags["default"]

    Template.remove_tags(tagged, ["prod", "old"])
    assert {t.tag for t in Template.get_tags(tagged)} == {"default", "v2", "stable"}
    with pytest.raises(SandboxException, match="404"):
        Sandbox.create(template=f"{tagged}:prod", timeout=60)


def test_bad_and_unknown_tags(node: Node, tagged: str) -> None:
    for bad in (["bad tag"], ["a/b"], [str(uuid.uuid4())], []):
        with pytest.raises(TemplateException, match="400"):
            Template.assign_tags(f"{tagged}:v2", bad)
    with pytest.raises(TemplateException, match="400"):
        Template.remove_tags(tagged, "default")
    with pytest.raises(TemplateException, match="400"):
        Template.remove_tags(f"{tagged}:v2", "x")  # the name must not carry a tag
    with pytest.raises(TemplateException, match="404"):
        Template.assign_tags(f"{tagged}:nope", "x")
    with pytest.raises(TemplateException, match="404"):
        Template.assign_tags("no-such-template:v1", "x")
    with pytest.raises(TemplateException, match="404"):
        Template.get_tags("no-such-template")
    with pytest.raises(TemplateException, match="404"):
        Template.remove_tags("no-such-template", "x")
    with pytest.raises(SandboxException, match="404"):
        Sandbox.create(template=f"{tagged}:nope", timeout=60)
    with node.client() as c:
        r = c.post("/templates/tags", json={"target": tagged})
        assert r.status_code == 400, r.text
        r = c.post("/templates/tags", content=b"not json", headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        r = c.request("DELETE", "/templates/tags", json={"name": tagged, "tags": "x"})
        assert r.status_code == 400, r.text


async def test_tags_async(node: Node, tagged: str) -> None:
    info = await AsyncTemplate.assign_tags(f"{tagged}:v2", "async")
    tags = {t.tag: t.build_id for t in await AsyncTemplate.get_tags(tagged)}
    assert tags["async"] == tags["v2"] == info.build_id
    box = await AsyncSandbox.create(template=f"{tagged}:async", timeout=60)
    try:
        assert (await box.files.read("/etc/tagged")).strip() == "two"
    finally:
        await box.kill()
    await AsyncTemplate.remove_tags(tagged, "async")
    assert "async" not in {t.tag for t in await AsyncTemplate.get_tags(tagged)}
    with pytest.raises(TemplateException, match="400"):
        await AsyncTemplate.remove_tags(tagged, "default")


def test_tags_survive_a_restart(node: Node, tagged: str) -> None:
    if not tagged.startswith("tags-runc"):
        pytest.skip("the store is the same for both runtimes")
    Template.assign_tags(f"{tagged}:v2", "kept")
    before = {t.tag: t.build_id for t in Template.get_tags(tagged)}
    node.stop()
    node.start()
    assert {t.tag: t.build_id for t in Template.get_tags(tagged)} == before
    assert _marker(f"{tagged}:kept") == "two"
    assert _marker(tagged) == "one"
