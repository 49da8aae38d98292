"""Karpenter (karpenter.sh/v1) as the capacity provider: NodePools by server-side apply, NodeClaims, evictions.

The guide's RBAC on Karpenter is exactly get, list, watch, create, patch and
delete on nodepools and nodeclaims: there is no update (PUT) here. The
NodePool is written by server-side apply under the field manager
`kubeon-gpu-optimizer` without `force`, so a field another manager owns is
never taken over: the API server's 409 comes back as `PoolConflict` and the
policy reports it. Pods leave a node only through the Eviction API
(`pods/eviction` create): a 429 from a PodDisruptionBudget is returned, never
worked around (the RBAC has no pod delete).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupolicy.capacity.nodepool import (
    FIELD_MANAGER,
    FOR_PODS_ANNOTATION,
    GROUP,
    INSTANCE_TYPE_LABEL,
    POOL_LABEL,
    VERSION,
    desired_nodeclaim,
    desired_nodepool,
)
from gpupolicy.capacity.provider import KARPENTER, CapacityNode, NewNode
from gpupolicy.model import CapacitySpec
from kube import calls

__all__ = ["GROUP", "VERSION", "KarpenterProvider", "PoolConflict", "apply_nodepool", "claim_to_node",
           "contains", "create_nodeclaim", "delete_nodeclaim", "list_nodeclaims", "read_nodepool"]
NODEPOOLS, NODECLAIMS = "nodepools", "nodeclaims"
APPLY_PATCH = "application/apply-patch+yaml"


class PoolConflict(Exception):
    """Server-side apply refused: another field manager owns a field the policy declares."""


def _json(response: Any) -> Any:
    return json.loads(response.data)


def apply_nodepool(api: client.ApiClient, body: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side apply of the fields we own (creates the NodePool when missing); never forced."""
    try:
        answer: dict[str, Any] = _json(client.CustomObjectsApi(api).patch_cluster_custom_object(
            GROUP, VERSION, NODEPOOLS, body["metadata"]["name"], dict(body), field_manager=FIELD_MANAGER,
            _content_type=APPLY_PATCH, _preload_content=False))
    except ApiException as exc:
        if exc.status == 409:
            raise PoolConflict(calls.message(exc)) from exc
        raise
    return answer


def read_nodepool(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = _json(client.CustomObjectsApi(api).get_cluster_custom_object(
            GROUP, VERSION, NODEPOOLS, name, _preload_content=False))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def list_nodeclaims(api: client.ApiClient, pool: str | None = None) -> list[dict[str, Any]]:
    selector = f"{POOL_LABEL}={pool}" if pool else None
    try:
        answer = _json(client.CustomObjectsApi(api).list_cluster_custom_object(
            GROUP, VERSION, NODECLAIMS, label_selector=selector, _preload_content=False))
    except ApiException as exc:
        if exc.status == 404:  # Karpenter's CRDs not installed
            return []
        raise
    return list(answer.get("items") or [])


def create_nodeclaim(api: client.ApiClient, body: Mapping[str, Any]) -> bool:
    """Create a NodeClaim; False when one of that name exists already (a repeated pass)."""
    return calls.created(client.CustomObjectsApi(api).create_cluster_custom_object, GROUP, VERSION, NODECLAIMS,
                         dict(body), _preload_content=False)


def delete_nodeclaim(api: client.ApiClient, name: str) -> None:
    calls.deleted(client.CustomObjectsApi(api).delete_cluster_custom_object, GROUP, VERSION, NODECLAIMS, name,
                  _preload_content=False)


def _quantity_int(value: Any) -> int:
    try:
        return int(float(str(value)))
    except ValueError:
        return 0


def claim_to_node(claim: Mapping[str, Any], products: Mapping[str, tuple[str, int, float]]) -> CapacityNode:
    """A NodeClaim as the provider reports it; `products`: instance type -> (GPU product, GPUs, $/h)."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    instance_type = labels.get(INSTANCE_TYPE_LABEL) or next(
        (str(r["values"][0]) for r in (claim.get("spec") or {}).get("requirements") or []
         if r.get("key") == INSTANCE_TYPE_LABEL and r.get("operator") == "In" and r.get("values")), "")
    product, gpus, price = products.get(instance_type, (None, 0, 0.0))
    capacity = status.get("capacity") or {}
    if "nvidia.com/gpu" in capacity:
        gpus = _quantity_int(capacity["nvidia.com/gpu"])
    launched_for = str((meta.get("annotations") or {}).get(FOR_PODS_ANNOTATION) or "")
    return CapacityNode(claim=str(meta.get("name")), node=status.get("nodeName") or None,
                        pool=labels.get(POOL_LABEL, ""), instance_type=instance_type, gpus=gpus, product=product,
                        price_per_hour=price, labels=labels, deleting=bool(meta.get("deletionTimestamp")),
                        launched_for=tuple(p for p in launched_for.split(",") if p),
                        allocatable={str(k): str(v) for k, v in (status.get("allocatable") or {}).items()})


class KarpenterProvider:
    """`CapacityProvider` over karpenter.sh/v1."""

    name = KARPENTER
    whole_gpus = False  # Karpenter provisions whole-GPU pods itself, from the NodePool

    def __init__(self, api: client.ApiClient, products: Mapping[str, tuple[str, int, float]]) -> None:
        self.api = api
        self.products = dict(products)

    def _desired(self, policy: str, spec: CapacitySpec) -> dict[str, Any]:
        return desired_nodepool(policy, spec, {t: p for t, (p, _, _) in self.products.items()})

    def groups(self, pool: str | None = None) -> None:
        return None  # a NodePool, no node groups

    def pool_in_shape(self, policy: str, spec: CapacitySpec) -> bool | None:
        current = read_nodepool(self.api, spec.node_pool)
        return None if current is None else contains(current, self._desired(policy, spec))

    def ensure_pool(self, policy: str, spec: CapacitySpec) -> str:
        desired = self._desired(policy, spec)
        try:
            apply_nodepool(self.api, desired)
        except PoolConflict as exc:
            return f"NodePool {spec.node_pool}: {exc}"
        return ""

    def nodes(self, pool: str | None = None) -> list[CapacityNode]:
        return [claim_to_node(c, self.products) for c in list_nodeclaims(self.api, pool)]

    def add(self, policy: str, spec: CapacitySpec, new: NewNode) -> str:
        body = desired_nodeclaim(new.name, policy, spec, new.instance_type, new.labels, list(new.pods))
        create_nodeclaim(self.api, body)
        return new.name

    def remove(self, claim: str) -> None:
        delete_nodeclaim(self.api, claim)


def contains(current: Any, desired: Any) -> bool:
    """Every field of `desired` has its value in `current` (fields other managers set are fine)."""
    if isinstance(desired, dict):
        return isinstance(current, dict) and all(contains(current.get(k), v) for k, v in desired.items())
    return bool(current == desired)
