"""Workload verbs: Deployments and StatefulSets (read, and written only through their scale subresource),
their pods (listed, evicted) and nodes.

Objects are returned as plain wire dicts (camelCase, as `kubectl get -o json`
shows them) so the core parses them with its own code. Scale patches are JSON
merge patches; one that carries `metadata.resourceVersion` is a precondition:
the write fails with `Conflict` (409) when the object changed since it was
read, and the caller retries on its next pass instead of overwriting.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import calls, rest

MERGE_PATCH = rest.MERGE_PATCH


class Conflict(Exception):
    """The object changed since it was read (409); retry on the next pass."""


class NotFound(Exception):
    """The object is gone (404)."""


PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets"}  # the workloads scale to zero reads


def _plural(kind: str) -> str:
    try:
        return PLURALS[kind]
    except KeyError:
        raise ValueError(f"unsupported workload kind {kind!r} (Deployment or StatefulSet)") from None


def _raw(api: client.ApiClient, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """One request (`kube.rest`: no model round trip); 409 is `Conflict`, 404 `NotFound`."""
    try:
        return rest.call(api, method, path, **kwargs)
    except ApiException as exc:
        if exc.status == 409:
            raise Conflict(str(exc.reason)) from exc
        if exc.status == 404:
            raise NotFound(str(exc.reason)) from exc
        raise


def read_scale(api: client.ApiClient, kind: str, namespace: str, name: str) -> dict[str, Any]:
    """autoscaling/v1 Scale of a workload."""
    return _raw(api, "GET", f"/apis/apps/v1/namespaces/{namespace}/{_plural(kind)}/{name}/scale")


def patch_scale(api: client.ApiClient, kind: str, namespace: str, name: str,
                patch: dict[str, Any]) -> dict[str, Any]:
    """Merge patch on the scale subresource (spec.replicas; resourceVersion makes it conditional)."""
    return _raw(api, "PATCH", f"/apis/apps/v1/namespaces/{namespace}/{_plural(kind)}/{name}/scale", body=patch,
                content_type=MERGE_PATCH)


def evict_pod(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Evict one pod through the Eviction API (policy/v1). False when a PodDisruptionBudget refuses (429)
    or the pod is already gone (404): both mean "nothing evicted now"."""
    return calls.evict(api, namespace, name)[0] == 201


def list_namespaces(api: client.ApiClient) -> dict[str, dict[str, str]]:
    """Namespace name -> labels (policy namespaceSelectors match on them)."""
    answer = _raw(api, "GET", "/api/v1/namespaces")
    return {i["metadata"]["name"]: dict(i["metadata"].get("labels") or {}) for i in answer.get("items") or []}


