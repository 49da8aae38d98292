"""Layout verbs: GPU nodes and pods as wire dicts, node merge patches, the one time-slicing ConfigMap.

The guide's RBAC lets the controller patch nodes (labels, cordon) and get and
patch exactly one ConfigMap, by name, in the GPU Operator's namespace: there
is no create here, and no call that names another ConfigMap.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import rest

MERGE_PATCH = rest.MERGE_PATCH


class ConfigMapUnavailable(Exception):
    """The time-slicing ConfigMap is missing (404) or not readable with our grant (403)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def list_nodes(api: client.ApiClient) -> list[dict[str, Any]]:
    return list(rest.call(api, "GET", "/api/v1/nodes").get("items") or [])


def patch_node(api: client.ApiClient, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    """Merge patch on a node (labels, annotations, spec.unschedulable)."""
    return rest.call(api, "PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=MERGE_PATCH)


def read_configmap(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    try:
        return rest.call(api, "GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    except ApiException as exc:
        if exc.status in (403, 404):
            raise ConfigMapUnavailable(int(exc.status), str(exc.reason)) from exc
        raise


def patch_configmap(api: client.ApiClient, namespace: str, name: str, patch: dict[str, Any],
                    resource_version: str | None) -> dict[str, Any]:
    """Merge patch on the ConfigMap, conditional on the resourceVersion read (409 on a concurrent edit)."""
    body = {**patch, "metadata": {"resourceVersion": resource_version}} if resource_version else patch
    try:
        return rest.call(api, "PATCH", f"/api/v1/namespaces/{namespace}/configmaps/{name}", body=body,
                         content_type=MERGE_PATCH)
    except ApiException as exc:
        if exc.status in (403, 404):
            raise ConfigMapUnavailable(int(exc.status), str(exc.reason)) from exc
        raise
