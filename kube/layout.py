"""Layout verbs: GPU nodes and pods as wire dicts, node merge patches, the one time-slicing ConfigMap.

The guide's RBAC lets the controller patch nodes (labels, cordon) and get and
patch exactly one ConfigMap, by name, in the GPU Operator's namespace: there
is no create here, and no call that names another ConfigMap.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"


class ConfigMapUnavailable(Exception):
    """The time-slicing ConfigMap is missing (404) or not readable with our grant (403)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def _json(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data)
    return data


def list_nodes(api: client.ApiClient) -> list[dict[str, Any]]:
    return list(_json(client.CoreV1Api(api).list_node(_preload_content=False)).get("items") or [])


def list_pods(api: client.ApiClient) -> list[dict[str, Any]]:
    """Every pod in the cluster (GPU demand and what bound pods hold)."""
    answer = _json(client.CoreV1Api(api).list_pod_for_all_namespaces(_preload_content=False))
    return list(answer.get("items") or [])


def patch_node(api: client.ApiClient, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    """Merge patch on a node (labels, annotations, spec.unschedulable)."""
    return _json(client.CoreV1Api(api).patch_node(name, patch, _content_type=MERGE_PATCH,
                                                  _preload_content=False))


def read_configmap(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    try:
        return _json(client.CoreV1Api(api).read_namespaced_config_map(name, namespace, _preload_content=False))
    except ApiException as exc:
        if exc.status in (403, 404):
            raise ConfigMapUnavailable(int(exc.status), str(exc.reason)) from exc
        raise


def patch_configmap(api: client.ApiClient, namespace: str, name: str, patch: dict[str, Any],
                    resource_version: str | None) -> dict[str, Any]:
    """Merge patch on the ConfigMap, conditional on the resourceVersion read (409 on a concurrent edit)."""
    body = {**patch, "metadata": {"resourceVersion": resource_version}} if resource_version else patch
    try:
        return _json(client.CoreV1Api(api).patch_namespaced_config_map(
            name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False))
    except ApiException as exc:
        if exc.status in (403, 404):
            raise ConfigMapUnavailable(int(exc.status), str(exc.reason)) from exc
        raise
