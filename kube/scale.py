"""Scale-to-zero verbs: KEDA ScaledObjects and the per-namespace scaler RoleBindings.

Workload reads, merge patches and the scale subresource live in
kube/workloads.py; this module adds what only scale to zero and autoscaling
need:

- KEDA ScaledObjects (keda.sh/v1alpha1): list, create, update, delete, and
  the `autoscaling.keda.sh/paused-replicas` annotation that pauses one.
- RoleBindings named `kubeon-gpu-optimizer-scaler` to the ClusterRole of the
  same name (shipped by the chart, bound nowhere): the controller binds it
  for its own ServiceAccount only in namespaces an acting ScaleToZero policy
  names (controller/workload_access.py decides which), and deletes the binding when no policy names the namespace
  any more. RBAC allows this without escalation because the chart grants
  `bind` on that one ClusterRole only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import calls, rest

MERGE_PATCH = "application/merge-patch+json"
KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
KEDA_PLURAL = "scaledobjects"
PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"

SCALER_ROLE = "kubeon-gpu-optimizer-scaler"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubeon-gpu-optimizer"
COMPONENT_LABEL = "app.kubernetes.io/component"


# -- not found is an answer -------------------------------------------------

# -- KEDA ScaledObjects ------------------------------------------------------

def list_scaled_objects(
    api: client.ApiClient, namespace: str, label_selector: str = ""
) -> list[dict[str, Any]]:
    """ScaledObjects in a namespace; [] when KEDA is not installed (nothing can manage the target)."""
    return calls.items_or_empty(client.CustomObjectsApi(api).list_namespaced_custom_object,
                           KEDA_GROUP, KEDA_VERSION, namespace, KEDA_PLURAL, label_selector=label_selector)


def list_scaled_objects_all_namespaces(api: client.ApiClient, label_selector: str = "") -> list[dict[str, Any]]:
    """ScaledObjects in every namespace; [] when KEDA is not installed."""
    return calls.items_or_empty(client.CustomObjectsApi(api).list_cluster_custom_object,
                           KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL, label_selector=label_selector)


def scaled_object_for(scaled_objects: Iterable[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    """The ScaledObject whose scaleTargetRef names this workload (KEDA defaults kind to Deployment)."""
    for obj in scaled_objects:
        ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("name") == name and (ref.get("kind") or "Deployment") == kind:
            return dict(obj)
    return None


def is_paused_at_zero(scaled_object: Mapping[str, Any]) -> bool:
    annotations = (scaled_object.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(PAUSED_REPLICAS, "")).strip() == "0"


def set_paused(api: client.ApiClient, namespace: str, name: str, paused: bool,
               resource_version: str | None = None) -> dict[str, Any]:
    """Pause the ScaledObject at 0 replicas (KEDA scales the target to 0 and stops), or unpause it."""
    metadata: dict[str, Any] = {"annotations": {PAUSED_REPLICAS: "0" if paused else None}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    obj: Any = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        KEDA_GROUP, KEDA_VERSION, namespace, KEDA_PLURAL, name, {"metadata": metadata},
        _content_type=MERGE_PATCH,
    )
    return dict(obj)


def create_scaled_object(api: client.ApiClient, body: Mapping[str, Any]) -> dict[str, Any]:
    namespace = body["metadata"]["namespace"]
    obj: Any = client.CustomObjectsApi(api).create_namespaced_custom_object(
        KEDA_GROUP, KEDA_VERSION, namespace, KEDA_PLURAL, dict(body),
    )
    return dict(obj)


def update_scaled_object(api: client.ApiClient, body: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """Merge our spec and labels into the live object (conditional on its resourceVersion).

    Annotations (a pause set by scale to zero, users' own) are left alone.
    """
    meta = current.get("metadata") or {}
    patch = {
        "metadata": {"labels": body["metadata"].get("labels", {}), "resourceVersion": meta.get("resourceVersion")},
        "spec": body["spec"],
    }
    obj: Any = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        KEDA_GROUP, KEDA_VERSION, meta["namespace"], KEDA_PLURAL, meta["name"], patch,
        _content_type=MERGE_PATCH,
    )
    return dict(obj)


def delete_scaled_object(api: client.ApiClient, namespace: str, name: str) -> bool:
    return calls.deleted(client.CustomObjectsApi(api).delete_namespaced_custom_object,
                    KEDA_GROUP, KEDA_VERSION, namespace, KEDA_PLURAL, name)


# -- scaler RoleBindings ------------------------------------------------------

@dataclass(frozen=True)
class ServiceAccountRef:
    """The controller's own ServiceAccount: the one subject the scaler binding names."""

    name: str
    namespace: str


def scaler_binding(namespace: str, subject: ServiceAccountRef) -> dict[str, Any]:
    """The RoleBinding granting the scaler ClusterRole to the controller in one namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": SCALER_ROLE,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, COMPONENT_LABEL: "workload-writes"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SCALER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": subject.name, "namespace": subject.namespace}],
    }


def _rbac(api: client.ApiClient) -> client.RbacAuthorizationV1Api:
    return client.RbacAuthorizationV1Api(api)


def list_scaler_bindings(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    """namespace -> our scaler RoleBinding, for every namespace that has one."""
    response: Any = _rbac(api).list_role_binding_for_all_namespaces(
        label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}", _preload_content=False,
    )
    items = json.loads(response.data).get("items") or []
    return {
        item["metadata"]["namespace"]: item
        for item in items
        if item.get("metadata", {}).get("name") == SCALER_ROLE
    }


def ensure_scaler_binding(api: client.ApiClient, namespace: str, subject: ServiceAccountRef,
                          existing: Mapping[str, Any] | None = None) -> bool:
    """Create the binding (or fix its subjects); True when something was written.

    roleRef is immutable in the API, so a binding pointing elsewhere is
    deleted and recreated.
    """
    want = scaler_binding(namespace, subject)
    if existing is not None:
        if existing.get("roleRef", {}).get("name") == SCALER_ROLE and existing.get("subjects") == want["subjects"]:
            return False
        delete_scaler_binding(api, namespace)
    return calls.created(_rbac(api).create_namespaced_role_binding, namespace, want)


def may_scale(api: client.ApiClient, namespace: str) -> bool:
    """Whether the API server's authorizer lets this client patch `deployments/scale` in `namespace` now.

    A SelfSubjectAccessReview (every authenticated user may ask one): a RoleBinding just created takes
    effect once the authorizer's cache has seen it, a few milliseconds to seconds later, and a write
    before that is refused with 403."""
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": namespace, "verb": "patch", "group": "apps",
                                            "resource": "deployments", "subresource": "scale"}}}
    answer = rest.call(api, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=body)
    return bool((answer.get("status") or {}).get("allowed"))


def delete_scaler_binding(api: client.ApiClient, namespace: str) -> bool:
    return calls.deleted(_rbac(api).delete_namespaced_role_binding, SCALER_ROLE, namespace)


@dataclass(frozen=True)
class BindingSync:
    """What one sync did, and where the binding exists afterwards (`bound`)."""

    created: list[str]
    deleted: list[str]
    bound: frozenset[str]


def sync_scaler_bindings(api: client.ApiClient, namespaces: Iterable[str],
                         subject: ServiceAccountRef) -> BindingSync:
    """Make the scaler bindings exist exactly in `namespaces`.

    Idempotent: a pass after a crash finds what the last one wrote. Only
    bindings carrying our managed-by label are ever deleted. A namespace that
    does not exist (yet) is skipped (not in `bound`) and retried on the next pass.
    """
    wanted = set(namespaces)
    have = list_scaler_bindings(api)
    created: list[str] = []
    deleted: list[str] = []
    bound: set[str] = set()
    for namespace in sorted(wanted):
        try:
            if ensure_scaler_binding(api, namespace, subject, have.get(namespace)):
                created.append(namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            continue
        bound.add(namespace)
    for namespace in sorted(set(have) - wanted):
        if delete_scaler_binding(api, namespace):
            deleted.append(namespace)
    return BindingSync(created, deleted, frozenset(bound))
