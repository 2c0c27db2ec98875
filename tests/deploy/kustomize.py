"""A small kustomize: enough of `kustomize build` to render deploy/k8s exactly, with no binary needed.

It reads `resources` (files), `namespace`, `labels` (with includeSelectors: false) and `images`, and
refuses any other field rather than half-applying it. Where kubectl or kustomize is installed, the tests
check that this rendering equals theirs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN_FIELDS = frozenset({"apiVersion", "kind", "namespace", "labels", "resources", "images"})
# Kinds with no namespace among the ones this project uses (kustomize knows the full list).
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"})
WORKLOADS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"})


class KustomizeError(ValueError):
    pass


def load_kustomization(folder: Path) -> dict[str, Any]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"kustomization fields this renderer does not apply: {sorted(unknown)}")
    return spec


def render(folder: Path) -> list[dict[str, Any]]:
    """The resources `kustomize build folder` would print, in file order."""
    spec = load_kustomization(folder)
    docs: list[dict[str, Any]] = []
    for name in spec.get("resources", []):
        path = folder / name
        if not path.is_file():
            raise KustomizeError(f"resource {name}: only files are supported")
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return [_transform(copy.deepcopy(doc), spec) for doc in docs]


def _transform(doc: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    metadata = doc.setdefault("metadata", {})
    if "namespace" in spec and doc["kind"] not in CLUSTER_SCOPED:
        metadata["namespace"] = spec["namespace"]
    for entry in spec.get("labels", []):
        if entry.get("includeSelectors"):
            raise KustomizeError("labels with includeSelectors are not supported")
        metadata.setdefault("labels", {}).update(entry["pairs"])
        if entry.get("includeTemplates") and doc["kind"] in WORKLOADS:
            template = doc["spec"]["template"].setdefault("metadata", {})
            template.setdefault("labels", {}).update(entry["pairs"])
    if doc["kind"] in WORKLOADS:
        pod = doc["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            container["image"] = _image(container["image"], spec.get("images", []))
    return doc


def _image(image: str, rules: list[dict[str, str]]) -> str:
    name, _, tag = image.partition(":")
    for rule in rules:
        if rule["name"] == name:
            return f"{rule.get('newName', name)}:{rule.get('newTag', tag or 'latest')}"
    return image
