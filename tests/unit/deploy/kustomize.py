"""Just enough kustomize to render warren's manifests in tests, without kubectl.

Supported, because the manifests use it: ``resources`` (files and directories),
``namespace``, ``configMapGenerator`` with ``files``, ``images``, and strategic-merge
``patches`` (by ``path``) whose lists of containers, volumes, env and ports merge by
``name`` and volumeMounts by ``mountPath``. Anything else in a kustomization fails loudly
rather than rendering something kubectl would not. Generated ConfigMaps keep their plain
names (kubectl adds a content hash and rewrites references; tests compare base names).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_KEYS = frozenset({"apiVersion", "kind", "namespace", "resources", "configMapGenerator", "images", "patches"})
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
}
CLUSTER_SCOPED = frozenset({"Namespace"})

Resource = dict[str, Any]


def load_yaml_documents(path: Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render(directory: Path) -> list[Resource]:
    """The resources a kustomization directory renders to."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise ValueError(f"{directory}: unsupported kustomization keys {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        resources += render(target) if target.is_dir() else load_yaml_documents(target)
    for generator in kustomization.get("configMapGenerator", []):
        if set(generator) - {"name", "files"}:
            raise ValueError(f"{directory}: unsupported configMapGenerator fields {sorted(generator)}")
        data = {Path(f).name: (directory / f).read_text() for f in generator["files"]}
        resources.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only patches by path are supported, got {patch}")
        for doc in load_yaml_documents(directory / patch["path"]):
            _apply_patch(resources, doc, directory / patch["path"])
    for image in kustomization.get("images", []):
        _set_image(resources, image)
    if namespace := kustomization.get("namespace"):
        for res in resources:
            if res["kind"] not in CLUSTER_SCOPED:
                res.setdefault("metadata", {})["namespace"] = namespace
    return resources


def strategic_merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """Merge ``patch`` into a copy of ``base`` the way kubectl does for the fields we use."""
    if isinstance(base, dict) and isinstance(patch, dict):
        if "$patch" in patch:
            raise ValueError("$patch directives are not supported")
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        # kustomize's order: the patch's items (merged into their base twins) first, then
        # the base items the patch does not name.
        key = MERGE_KEYS[field]
        by_key = {item[key]: item for item in base}
        patched = [strategic_merge(by_key[item[key]], item) if item[key] in by_key else item for item in patch]
        named = {item[key] for item in patch}
        return copy.deepcopy(patched) + [copy.deepcopy(item) for item in base if item[key] not in named]
    return copy.deepcopy(patch)


def pod_spec(resource: Resource) -> dict[str, Any]:
    return resource["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def all_containers(resource: Resource) -> list[dict[str, Any]]:
    spec = pod_spec(resource)
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def find(resources: list[Resource], kind: str, name: str | None = None) -> Resource:
    matches = [r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    if len(matches) != 1:
        raise LookupError(f"expected one {kind} {name or ''}, found {len(matches)}")
    return matches[0]


def _apply_patch(resources: list[Resource], patch: Resource, source: Path) -> None:
    for i, res in enumerate(resources):
        if res["kind"] == patch["kind"] and res["metadata"]["name"] == patch["metadata"]["name"]:
            resources[i] = strategic_merge(res, patch)
            return
    raise LookupError(f"{source}: patch target {patch['kind']}/{patch['metadata']['name']} not found")


def _set_image(resources: list[Resource], image: dict[str, str]) -> None:
    for res in resources:
        if "template" not in res.get("spec", {}):
            continue
        for container in all_containers(res):
            repo, _, tag = container["image"].partition(":")
            if repo == image["name"]:
                container["image"] = f"{image.get('newName', repo)}:{image.get('newTag', tag)}"
