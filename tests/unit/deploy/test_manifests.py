"""The kustomize manifests: they parse, render, and keep the invariants the node depends on."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from warren.footprint import read_footprint_caps
from warren.store.lock import INSTANCE_LOCK_NAME

from .kustomize import Resource, all_containers, find, load_yaml_documents, pod_spec, render

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "k8s"
BASE = K8S / "base"
PRODUCTION = K8S / "overlays" / "production"
RENDERS = {"base": BASE, "production": PRODUCTION}
SCRIPTS = ("prestop.sh", "load-modules.sh", "seed-assets.sh")
STATE_DIR = "/var/lib/warren"
MIN_SHUTDOWN_MARGIN_S = 600


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def node_container(ds: Resource) -> dict[str, Any]:
    return next(c for c in pod_spec(ds)["containers"] if c["name"] == "node")


def init_container(ds: Resource, name: str) -> dict[str, Any]:
    return next(c for c in pod_spec(ds)["initContainers"] if c["name"] == name)


@pytest.fixture(params=sorted(RENDERS), scope="module")
def rendered(request: pytest.FixtureRequest) -> list[Resource]:
    return render(RENDERS[request.param])


@pytest.fixture(scope="module")
def daemonset(rendered: list[Resource]) -> Resource:
    return find(rendered, "DaemonSet", "warren-node")


def test_every_yaml_file_parses() -> None:
    files = sorted(K8S.rglob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        assert load_yaml_documents(path), f"{path} is empty"


def test_selector_matches_template_labels(daemonset: Resource) -> None:
    selector = daemonset["spec"]["selector"]["matchLabels"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_every_volume_mount_names_a_declared_volume_and_every_volume_is_used(daemonset: Resource) -> None:
    declared = [v["name"] for v in pod_spec(daemonset)["volumes"]]
    assert len(declared) == len(set(declared)), "duplicate volume names"
    used: set[str] = set()
    for container in all_containers(daemonset):
        mounts = container.get("volumeMounts", [])
        paths = [m["mountPath"] for m in mounts]
        assert len(paths) == len(set(paths)), f"{container['name']}: duplicate mount paths"
        for mount in mounts:
            assert mount["name"] in declared, f"{container['name']} mounts undeclared volume {mount['name']}"
            used.add(mount["name"])
    assert used == set(declared), f"unused volumes: {set(declared) - used}"


def test_bidirectional_propagation_only_in_privileged_containers(daemonset: Resource) -> None:
    for container in all_containers(daemonset):
        if any(m.get("mountPropagation") == "Bidirectional" for m in container.get("volumeMounts", [])):
            assert container["securityContext"]["privileged"] is True, container["name"]


def test_scripts_configmap_is_exactly_the_files_tests_run(rendered: list[Resource], daemonset: Resource) -> None:
    configmap = find(rendered, "ConfigMap", "warren-node-scripts")
    assert configmap["data"] == {name: (BASE / name).read_text() for name in SCRIPTS}
    volume = next(v for v in pod_spec(daemonset)["volumes"] if v["name"] == "scripts")
    assert volume["configMap"]["name"] == "warren-node-scripts"


def test_commands_run_scripts_from_the_scripts_mount(daemonset: Resource) -> None:
    commands = {c["name"]: " ".join(c.get("command", [])) for c in all_containers(daemonset)}
    commands["preStop"] = " ".join(node_container(daemonset)["lifecycle"]["preStop"]["exec"]["command"])
    expected = {"load-modules": "load-modules.sh", "seed-assets": "seed-assets.sh", "preStop": "prestop.sh"}
    for who, script in expected.items():
        assert f"/bin/sh /opt/warren/scripts/{script}" in commands[who]
        container = node_container(daemonset) if who == "preStop" else init_container(daemonset, who)
        mount = next(m for m in container["volumeMounts"] if m["name"] == "scripts")
        assert mount["mountPath"] == "/opt/warren/scripts"


def test_drain_deadline_leaves_the_server_time_to_shut_down(daemonset: Resource) -> None:
    grace = pod_spec(daemonset)["terminationGracePeriodSeconds"]
    deadline = int(env_of(node_container(daemonset))["DRAIN_DEADLINE_S"])
    assert grace == 3600
    assert deadline == 3000
    assert grace - deadline >= MIN_SHUTDOWN_MARGIN_S
    script_default = re.search(r"DRAIN_DEADLINE_S:-(\d+)", (BASE / "prestop.sh").read_text())
    assert script_default is not None and grace - int(script_default.group(1)) >= MIN_SHUTDOWN_MARGIN_S


def test_drain_logs_through_the_servers_instance_lock_pid(daemonset: Resource) -> None:
    assert env_of(node_container(daemonset))["DRAIN_LOG_PID_FILE"] == f"{STATE_DIR}/{INSTANCE_LOCK_NAME}"


def test_probes_hit_health_on_the_listen_port(daemonset: Resource) -> None:
    node = node_container(daemonset)
    ports = {p["name"]: p["containerPort"] for p in node["ports"]}
    args = node["args"]
    listen = args[args.index("--listen") + 1]
    assert listen == f"0.0.0.0:{ports['http']}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = node[probe]["httpGet"]
        assert get["path"] == "/health", probe
        assert ports.get(get["port"], get["port"]) == ports["http"], probe


def test_prometheus_scrapes_metrics_on_the_listen_port(daemonset: Resource) -> None:
    node = node_container(daemonset)
    ports = {p["name"]: p["containerPort"] for p in node["ports"]}
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports["http"])
    assert annotations["prometheus.io/path"] == "/metrics"
    assert "WARREN_METRICS_PUBLIC" not in env_of(node)  # public, as the annotations assume


def test_node_serves_the_host_state_dir(daemonset: Resource) -> None:
    node = node_container(daemonset)
    assert node["args"][0] == "serve"
    assert node["args"][node["args"].index("--state-dir") + 1] == STATE_DIR
    volumes = {v["name"]: v for v in pod_spec(daemonset)["volumes"]}
    mounts = {m["mountPath"]: m for m in node["volumeMounts"]}
    assert volumes[mounts[STATE_DIR]["name"]]["hostPath"]["path"] == STATE_DIR
    assert env_of(node)["WARREN_CACHE_DIR"].startswith(STATE_DIR + "/")


def test_node_has_the_host_mounts_runtimes_need(daemonset: Resource) -> None:
    node = node_container(daemonset)
    assert node["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in pod_spec(daemonset)["volumes"]}
    by_path = {m["mountPath"]: m for m in node["volumeMounts"]}
    for path in ("/dev", "/sys/fs/cgroup", "/run/netns", STATE_DIR):
        assert volumes[by_path[path]["name"]]["hostPath"]["path"] == path
    assert by_path["/run/netns"]["mountPropagation"] == "Bidirectional"
    assert by_path[STATE_DIR]["mountPropagation"] == "Bidirectional"


def test_footprint_caps_are_set_and_valid(daemonset: Resource) -> None:
    env = env_of(node_container(daemonset))
    caps = read_footprint_caps(env, cpus=64)
    assert caps.executor_workers == int(env["WARREN_EXECUTOR_WORKERS"])
    assert caps.http_max_keepalive == int(env["WARREN_HTTP_MAX_KEEPALIVE"])
    assert caps.malloc_arena_max == 2


def test_every_container_has_requests_and_a_memory_limit(daemonset: Resource) -> None:
    for container in all_containers(daemonset):
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert "memory" in resources["limits"], container["name"]


def test_env_names_are_unique(daemonset: Resource) -> None:
    for container in all_containers(daemonset):
        names = [e["name"] for e in container.get("env", [])]
        assert len(names) == len(set(names)), container["name"]


def test_init_containers_bootstrap_the_node(daemonset: Resource) -> None:
    spec = pod_spec(daemonset)
    assert [c["name"] for c in spec["initContainers"]] == ["load-modules", "seed-assets"]
    load = init_container(daemonset, "load-modules")
    assert load["securityContext"]["privileged"] is True
    host_root = next(m for m in load["volumeMounts"] if m["name"] == "host-root")
    assert host_root == {"name": "host-root", "mountPath": "/host", "readOnly": True}
    assert env_of(load)["HOST_ROOT"] == "/host"
    seed = init_container(daemonset, "seed-assets")
    assert seed["securityContext"]["privileged"] is False
    assert env_of(seed)["ASSETS_DST"] == env_of(node_container(daemonset))["WARREN_CACHE_DIR"]
    assert any(m["mountPath"] == STATE_DIR for m in seed["volumeMounts"])
    users = [c["name"] for c in all_containers(daemonset) if any(m["name"] == "host-root" for m in c["volumeMounts"])]
    assert users == ["load-modules"], "only load-modules may see the host root"


def test_images_are_tagged_and_never_latest(daemonset: Resource) -> None:
    for container in all_containers(daemonset):
        image = container["image"]
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, image


def test_production_overlay_pins_registry_nodes_and_requires_the_key() -> None:
    ds = find(render(PRODUCTION), "DaemonSet", "warren-node")
    assert all(c["image"].startswith("registry.example.com/") for c in all_containers(ds))
    assert pod_spec(ds)["nodeSelector"] == {"warren/sandboxes": "true"}
    key = next(e for e in node_container(ds)["env"] if e["name"] == "WARREN_API_KEY")
    assert key["valueFrom"]["secretKeyRef"]["optional"] is False
    base_key = next(e for e in node_container(find(render(BASE), "DaemonSet"))["env"] if e["name"] == "WARREN_API_KEY")
    assert base_key["valueFrom"]["secretKeyRef"]["optional"] is True


def test_namespace_applied_and_privileged_admission_allowed(rendered: list[Resource]) -> None:
    namespace = find(rendered, "Namespace", "warren")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for res in rendered:
        if res["kind"] != "Namespace":
            assert res["metadata"]["namespace"] == "warren"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("which", sorted(RENDERS))
def test_our_render_matches_kubectl_kustomize(which: str) -> None:
    """Cross-check the test resolver against the real kustomize, up to the ConfigMap hash suffix."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(RENDERS[which])], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    theirs = [d for d in yaml.safe_load_all(re.sub(r"(warren-node-scripts)-[a-z0-9]{10}\b", r"\1", out)) if d]
    ours = render(RENDERS[which])

    def key(r: Resource) -> tuple[str, str]:
        return r["kind"], r["metadata"]["name"]

    assert sorted(map(key, theirs)) == sorted(map(key, ours))
    by_key = {key(r): r for r in ours}
    for res in theirs:
        assert res == by_key[key(res)], f"{key(res)} differs from kubectl's render"
