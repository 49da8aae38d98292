"""Workload verbs: Deployments and StatefulSets (read, and written only through their scale subresource),
their pods (listed, evicted) and nodes.

Objects are returned as plain wire dicts (camelCase, as `kubectl get -o json`
shows them) so the core parses them with its own code. Scale patches are JSON
merge patches; one that carries `metadata.resourceVersion` is a precondition:
the write fails with `Conflict` (409) when the object changed since it was
read, and the caller retries on its next pass instead of overwriting.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import calls

MERGE_PATCH = "application/merge-patch+json"
WORKLOAD_KINDS = ("Deployment", "StatefulSet")


class Conflict(Exception):
    """The object changed since it was read (409); retry on the next pass."""


class NotFound(Exception):
    """The object is gone (404)."""


@dataclass(frozen=True)
class _KindVerbs:
    plural: str
    list_all: Callable[[client.AppsV1Api], Callable[..., Any]]
    read_scale: Callable[[client.AppsV1Api], Callable[..., Any]]
    patch_scale: Callable[[client.AppsV1Api], Callable[..., Any]]


_VERBS: dict[str, _KindVerbs] = {
    "Deployment": _KindVerbs(
        "deployments",
        lambda a: a.list_deployment_for_all_namespaces,
        lambda a: a.read_namespaced_deployment_scale,
        lambda a: a.patch_namespaced_deployment_scale,
    ),
    "StatefulSet": _KindVerbs(
        "statefulsets",
        lambda a: a.list_stateful_set_for_all_namespaces,
        lambda a: a.read_namespaced_stateful_set_scale,
        lambda a: a.patch_namespaced_stateful_set_scale,
    ),
}


def _verbs(kind: str) -> _KindVerbs:
    try:
        return _VERBS[kind]
    except KeyError:
        raise ValueError(f"unsupported workload kind {kind!r} (Deployment or StatefulSet)") from None


def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a generated method and return the JSON body as a dict (no model round trip)."""
    try:
        response = call(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        if exc.status == 409:
            raise Conflict(str(exc.reason)) from exc
        if exc.status == 404:
            raise NotFound(str(exc.reason)) from exc
        raise
    data: dict[str, Any] = json.loads(response.data)
    return data


def _with_kind(items: list[dict[str, Any]], kind: str, api_version: str) -> list[dict[str, Any]]:
    for item in items:
        item.setdefault("kind", kind)
        item.setdefault("apiVersion", api_version)
    return items


def list_workloads(api: client.ApiClient, kinds: tuple[str, ...] = WORKLOAD_KINDS) -> list[dict[str, Any]]:
    """Every Deployment and StatefulSet in the cluster (each with `kind` set)."""
    apps = client.AppsV1Api(api)
    found: list[dict[str, Any]] = []
    for kind in kinds:
        answer = _raw(_verbs(kind).list_all(apps))
        found.extend(_with_kind(list(answer.get("items") or []), kind, "apps/v1"))
    return found


def read_scale(api: client.ApiClient, kind: str, namespace: str, name: str) -> dict[str, Any]:
    """autoscaling/v1 Scale of a workload."""
    return _raw(_verbs(kind).read_scale(client.AppsV1Api(api)), name, namespace)


def patch_scale(api: client.ApiClient, kind: str, namespace: str, name: str,
                patch: dict[str, Any]) -> dict[str, Any]:
    """Merge patch on the scale subresource (spec.replicas; resourceVersion makes it conditional)."""
    call = _verbs(kind).patch_scale(client.AppsV1Api(api))
    return _raw(call, name, namespace, patch, _content_type=MERGE_PATCH)


def evict_pod(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Evict one pod through the Eviction API (policy/v1). False when a PodDisruptionBudget refuses (429)
    or the pod is already gone (404): both mean "nothing evicted now"."""
    return calls.evict(api, namespace, name)[0] == 201


def list_namespaces(api: client.ApiClient) -> dict[str, dict[str, str]]:
    """Namespace name -> labels (policy namespaceSelectors match on them)."""
    answer = _raw(client.CoreV1Api(api).list_namespace)
    return {i["metadata"]["name"]: dict(i["metadata"].get("labels") or {}) for i in answer.get("items") or []}


def list_pods(api: client.ApiClient, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
    answer = _raw(client.CoreV1Api(api).list_namespaced_pod, namespace, label_selector=label_selector)
    return list(answer.get("items") or [])


def list_nodes(api: client.ApiClient) -> dict[str, dict[str, str]]:
    """Node name -> labels (GFD's `nvidia.com/gpu.product` among them)."""
    answer = _raw(client.CoreV1Api(api).list_node)
    return {i["metadata"]["name"]: dict(i["metadata"].get("labels") or {}) for i in answer.get("items") or []}


def selector_string(match_labels: dict[str, str]) -> str:
    """`a=b,c=d` for a list call's labelSelector."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
