"""The cluster overlay: Redis, the gateway Deployment + Service + PodDisruptionBudget, and the node
DaemonSet wired to them; every rendered resource valid against the Kubernetes schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .kustomize import Resource, find, pod_spec, render

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "k8s"
CLUSTER = K8S / "overlays" / "cluster"
KUBERNETES_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def rendered() -> list[Resource]:
    return render(CLUSTER)


def container(resource: Resource, name: str) -> dict[str, Any]:
    return next(c for c in pod_spec(resource)["containers"] if c["name"] == name)


def env_entries(c: dict[str, Any]) -> list[dict[str, Any]]:
    return list(c.get("env", []))


def arg_after(c: dict[str, Any], flag: str) -> str:
    args = c["args"]
    return str(args[args.index(flag) + 1])


@pytest.mark.parametrize("overlay", [K8S / "base", K8S / "overlays" / "production", CLUSTER], ids=lambda p: p.name)
def test_every_rendered_resource_is_valid_kubernetes(overlay: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for resource in render(overlay):
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_everything_is_in_the_warren_namespace(rendered: list[Resource]) -> None:
    for resource in rendered:
        if resource["kind"] != "Namespace":
            assert resource["metadata"].get("namespace") == "warren", resource["metadata"]["name"]


@pytest.mark.parametrize("component", ["gateway", "redis"])
def test_each_service_selects_its_pods_and_targets_a_named_container_port(
    rendered: list[Resource], component: str
) -> None:
    deployment = find(rendered, "Deployment", f"warren-{component}")
    service = find(rendered, "Service", f"warren-{component}")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for c in pod_spec(deployment)["containers"] for p in c.get("ports", [])}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_the_gateway_is_replicated_and_kept_available(rendered: list[Resource]) -> None:
    deployment = find(rendered, "Deployment", "warren-gateway")
    pdb = find(rendered, "PodDisruptionBudget", "warren-gateway")
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_the_gateway_runs_warren_gateway_on_redis_with_the_nodes_key(rendered: list[Resource]) -> None:
    gw = container(find(rendered, "Deployment", "warren-gateway"), "gateway")
    assert gw["args"][0] == "gateway"
    assert arg_after(gw, "--redis") == "redis://warren-redis:6379/0"
    assert arg_after(gw, "--listen").endswith(f":{gw['ports'][0]['containerPort']}")
    key = next(e for e in env_entries(gw) if e["name"] == "WARREN_API_KEY")
    ref = key["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "warren-api-key" and not ref.get("optional", False)  # no key, no gateway
    assert gw["readinessProbe"]["httpGet"]["path"] == "/health"
    assert gw["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in gw["securityContext"]


def test_no_cluster_pod_can_reach_the_kubernetes_api(rendered: list[Resource]) -> None:
    for name in ("warren-gateway", "warren-redis"):
        assert pod_spec(find(rendered, "Deployment", name))["automountServiceAccountToken"] is False


def test_nodes_join_the_same_redis_under_their_kubernetes_names(rendered: list[Resource]) -> None:
    ds = find(rendered, "DaemonSet", "warren-node")
    node = container(ds, "node")
    env = env_entries(node)
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))
    by_name = {e["name"]: e for e in env}
    assert by_name["WARREN_CLUSTER_REDIS"]["value"] == "redis://warren-redis.warren.svc.cluster.local:6379/0"
    assert by_name["WARREN_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert by_name["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    # $(HOST_IP) only expands when HOST_IP comes first; the port is the node's listen port.
    assert names.index("HOST_IP") < names.index("WARREN_ADVERTISE_URL")
    listen_port = arg_after(node, "--listen").rpartition(":")[2]
    assert by_name["WARREN_ADVERTISE_URL"]["value"] == f"http://$(HOST_IP):{listen_port}"
    assert pod_spec(ds)["hostNetwork"] is True  # so the host IP is where the node listens
    assert pod_spec(ds)["dnsPolicy"] == "ClusterFirstWithHostNet"  # so the node resolves the Redis Service


def test_nodes_share_one_snapshot_store_from_an_optional_secret(rendered: list[Resource]) -> None:
    by_name = {e["name"]: e for e in env_entries(container(find(rendered, "DaemonSet", "warren-node"), "node"))}
    for name, key in (("WARREN_SHARED_STORE", "url"), ("WARREN_S3_ENDPOINT", "endpoint"),
                      ("AWS_ACCESS_KEY_ID", "access-key-id"), ("AWS_SECRET_ACCESS_KEY", "secret-access-key")):
        ref = by_name[name]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "warren-shared-store", "key": key, "optional": True}, name


def test_the_overlay_keeps_the_base_daemonset_otherwise(rendered: list[Resource]) -> None:
    base = find(render(K8S / "base"), "DaemonSet", "warren-node")
    ds = find(rendered, "DaemonSet", "warren-node")
    base_env = [e for e in container(base, "node")["env"]]
    assert all(e in container(ds, "node")["env"] for e in base_env)
    assert pod_spec(ds)["volumes"] == pod_spec(base)["volumes"]


def test_prometheus_scrapes_the_gateways_metrics(rendered: list[Resource]) -> None:
    deployment = find(rendered, "Deployment", "warren-gateway")
    gw = container(deployment, "gateway")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(gw["ports"][0]["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"
    node = find(rendered, "DaemonSet", "warren-node")  # the overlay keeps the node's own
    assert node["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "3000"
