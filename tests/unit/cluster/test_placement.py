"""Placement: the filter (dead, draining, snapshot runtime hash, template class, capacity) and the
least-loaded strategy with template locality."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from warren.cluster.placement import LeastLoaded, PlacementRequest, eligible, place
from warren.cluster.records import NodeInfo, NodeView, SnapshotInfo, TemplateInfo
from warren.errors import ConflictError, TooManyRequestsError, UnavailableError

BASE = TemplateInfo("t-base", "base", "runc")
GVISOR = TemplateInfo("t-gv", "base-gvisor", "gvisor")


def view(
    node_id: str,
    *,
    alive: bool = True,
    draining: bool = False,
    active: int = 0,
    reserved: int = 0,
    cap: int = 4,
    classes: tuple[str, ...] = ("runc", "gvisor"),
    hashes: tuple[str, ...] = ("h-runc",),
    templates: tuple[TemplateInfo, ...] = (BASE, GVISOR),
    snapshots: tuple[SnapshotInfo, ...] = (),
    use: dict[str, int] | None = None,
) -> NodeView:
    info = NodeInfo(
        node_id=node_id, url=f"http://{node_id}", max_sandboxes=cap, active=active, running=active, paused=0,
        draining=draining, runtime_classes=classes, runtime_hashes=hashes, templates=templates,
        snapshots=snapshots, template_use=use or {},
    )  # fmt: skip
    return NodeView(info, alive, reserved)


def ids(views: list[NodeView]) -> list[str]:
    return [v.node_id for v in views]


def test_dead_and_draining_nodes_are_filtered() -> None:
    nodes = [view("a", alive=False), view("b", draining=True), view("c")]
    assert ids(eligible(PlacementRequest("base"), nodes)) == ["c"]


def test_no_live_node_is_unavailable() -> None:
    with pytest.raises(UnavailableError, match="no live node"):
        eligible(PlacementRequest("base"), [view("a", alive=False), view("b", draining=True)])


def test_a_restore_goes_only_to_a_node_with_the_snapshots_runtime_hash() -> None:
    snap = SnapshotInfo("s1", ("mysnap",), "gvisor", "h-gv")
    nodes = [view("a", snapshots=(snap,), hashes=("h-runc",)), view("b", snapshots=(snap,), hashes=("h-runc", "h-gv"))]
    assert ids(eligible(PlacementRequest("s1"), nodes)) == ["b"]
    assert ids(eligible(PlacementRequest("mysnap"), nodes)) == ["b"]


def test_a_snapshot_in_the_shared_store_places_on_any_live_node_with_its_runtime_hash() -> None:
    shared = SnapshotInfo("s1", ("mysnap",), "gvisor", "h-gv", shared=True)
    nodes = [view("dead", alive=False, snapshots=(shared,), hashes=("h-gv",)), view("a", hashes=("h-runc", "h-gv")),
             view("b", hashes=("h-runc",)), view("c", draining=True, hashes=("h-gv",))]  # fmt: skip
    assert ids(eligible(PlacementRequest("mysnap"), nodes)) == ["a"]
    with pytest.raises(ConflictError, match="h-gv"):
        eligible(PlacementRequest("s1"), [nodes[0], nodes[2]])
    local = SnapshotInfo("s1", ("mysnap",), "gvisor", "h-gv")  # not shared: only where it is
    with pytest.raises(UnavailableError, match="dead or draining"):
        eligible(PlacementRequest("s1"), [view("dead", alive=False, snapshots=(local,)), view("a", hashes=("h-gv",))])


def test_a_restore_no_node_can_stage_is_a_409_naming_the_hash() -> None:
    snap = SnapshotInfo("s1", (), "gvisor", "h-gv")
    with pytest.raises(ConflictError, match="h-gv"):
        eligible(PlacementRequest("s1"), [view("a", snapshots=(snap,))])


def test_a_template_goes_to_nodes_that_have_it_and_its_runtime_class() -> None:
    nodes = [view("a", classes=("runc",)), view("b"), view("c", templates=(BASE,))]
    assert ids(eligible(PlacementRequest("base-gvisor"), nodes)) == ["b"]
    assert ids(eligible(PlacementRequest("t-gv"), nodes)) == ["b"]
    assert sorted(ids(eligible(PlacementRequest("base"), nodes))) == ["a", "b", "c"]


def test_a_template_whose_class_runs_nowhere_is_unavailable() -> None:
    with pytest.raises(UnavailableError, match="runtime is unavailable"):
        eligible(PlacementRequest("base-gvisor"), [view("a", classes=("runc",))])


def test_a_template_only_on_dead_nodes_is_unavailable() -> None:
    nodes = [view("a", alive=False), view("b", templates=())]
    with pytest.raises(UnavailableError, match="dead or draining"):
        eligible(PlacementRequest("base"), nodes)


def test_an_unknown_name_goes_to_any_live_node() -> None:
    nodes = [view("a"), view("b", alive=False)]
    assert ids(eligible(PlacementRequest("nope"), nodes)) == ["a"]


def test_a_tagged_reference_goes_to_the_nodes_that_have_its_template() -> None:
    web = TemplateInfo("t-web", "web", "runc")
    nodes = [view("a"), view("b", templates=(BASE, web))]
    assert ids(eligible(PlacementRequest("web:v2"), nodes)) == ["b"]
    assert ids(place(PlacementRequest("web:prod"), nodes, LeastLoaded())) == ["b"]


def test_a_name_built_a_moment_ago_goes_to_its_builder_before_any_heartbeat_lists_it() -> None:
    nodes = [view("a"), view("b"), view("c")]
    assert ids(eligible(PlacementRequest("fresh", built_on="b"), nodes)) == ["b"]
    assert ids(eligible(PlacementRequest("fresh:v1", built_on="b"), nodes)) == ["b"]
    # A builder that is down or draining: any live node (their 404 is the answer).
    assert ids(eligible(PlacementRequest("fresh", built_on="gone"), nodes)) == ["a", "b", "c"]
    # Once a heartbeat lists the template, the heartbeat decides.
    web = TemplateInfo("t-web", "web", "runc")
    listed = [view("a", templates=(BASE, web)), view("b")]
    assert ids(eligible(PlacementRequest("web", built_on="b"), listed)) == ["a"]


def test_full_nodes_are_skipped_counting_reservations() -> None:
    nodes = [view("a", active=4), view("b", active=2, reserved=2), view("c", active=3)]
    assert ids(place(PlacementRequest("base"), nodes, LeastLoaded())) == ["c"]


def test_all_full_is_a_429() -> None:
    with pytest.raises(TooManyRequestsError, match="cap"):
        place(PlacementRequest("base"), [view("a", active=4), view("b", reserved=4)], LeastLoaded())


def test_least_loaded_first() -> None:
    nodes = [view("a", active=3), view("b", active=1), view("c", active=3, cap=8)]
    assert ids(place(PlacementRequest("base"), nodes, LeastLoaded())) == ["b", "c", "a"]


def test_locality_breaks_near_ties() -> None:
    nodes = [view("a", active=1, cap=100), view("b", active=1, cap=100, use={"t-base": 1})]
    for seed in range(10):
        assert ids(LeastLoaded(random.Random(seed)).rank(PlacementRequest("base"), nodes))[0] == "b"


def test_locality_does_not_beat_a_real_load_difference() -> None:
    nodes = [view("a", active=0), view("b", active=2, use={"t-base": 2})]
    assert ids(LeastLoaded().rank(PlacementRequest("base"), nodes))[0] == "a"


def test_equal_nodes_share_the_creates() -> None:
    strategy = LeastLoaded(random.Random(7))
    nodes = [view("a"), view("b"), view("c")]
    firsts = Counter(strategy.rank(PlacementRequest("base"), nodes)[0].node_id for _ in range(300))
    assert set(firsts) == {"a", "b", "c"} and min(firsts.values()) > 60


def test_an_admin_drained_node_is_filtered() -> None:
    nodes = [NodeView(view("a").info, True, 0, drained=True), view("b")]
    assert ids(eligible(PlacementRequest("base"), nodes)) == ["b"]
    assert nodes[0].status == "draining"
