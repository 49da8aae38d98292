"""A Karpenter stand-in: NodeClaims become Nodes, deleted NodeClaims drain through the Eviction API.

What it does, per karpenter.sh/v1 (../shared/REFERENCE.md, Karpenter v1) and upstream's
controllers at the vendored commit (kubernetes-sigs/karpenter 2266468, pkg/controllers/...):
- A new NodeClaim gets the `karpenter.sh/termination` finalizer; after
  `launch_delay` seconds it goes through the lifecycle, one condition per
  upstream controller (nodeclaim/lifecycle/): Launched (launch.go: the cloud
  made the instance; status providerID, imageID, capacity, allocatable),
  Registered (registration.go: a Node named like the claim joins, sized from
  a small instance-type table keyed by the claim's
  `node.kubernetes.io/instance-type` requirement (first value of `In`), with
  labels karpenter.sh/nodepool, karpenter.sh/registered,
  node.kubernetes.io/instance-type, karpenter.sh/capacity-type,
  topology.kubernetes.io/zone, the claim's labels and single-valued `In`
  requirements, GPU Feature Discovery labels and the claim's taints),
  Initialized (initialization.go: the Node Ready, no startup taint left, and
  every extended resource in the claim's spec.resources.requests registered
  non-zero, so a GPU claim waits for its device plugin; then label
  karpenter.sh/initialized), and Ready once all three are True.
- NodePool limits are not checked at launch: upstream checks them only in its
  own provisioner before it creates a claim (provisioning/provisioner.go
  Create, `Limits.ExceededBy`), so a claim anyone else creates launches
  whatever the limits say. Every pass writes each NodePool's status.resources
  and status.nodes (nodepool/counter/controller.go): the capacity of its
  claims not being deleted, the Node's once Initialized, else the claim's
  status.capacity, nothing before Launched (state/cluster.go
  updateNodePoolResources, statenode.go Capacity), one `nodes` per claim
  counted, base resources always listed. A time-sliced node advertises
  nvidia.com/gpu.shared, not nvidia.com/gpu: the pool's nvidia.com/gpu count
  does not see it, as upstream's does not.
- Deleting a NodeClaim taints its Node `karpenter.sh/disrupted:NoSchedule`,
  evicts its pods through the Eviction API (a 429 from a PodDisruptionBudget
  is retried on a later pass, after `evict_retry` seconds), then deletes the
  Node and removes the finalizer so the claim goes away.

`check_against_crd` validates a NodePool or NodeClaim body with Karpenter's
own CRD schema (vendor/crds), made strict: an unknown field fails where the
API server would only prune it.

Not modelled: provisioning (creating NodeClaims for pending pods, where
upstream checks the limits), consolidation, drift, expiry, the Node's own
finalizer, startup taints on the Node it makes (a claim's are checked);
pods that tolerate the disrupted taint are evicted too; DaemonSet and mirror
pods are skipped, as by Karpenter and kubectl drain.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupolicy.quantity import parse_quantity
from tests.cluster.objects import make_node
from tests.kubeapi.scheduler import MERGE_PATCH, read_items, record_event
from tests.kubeapi.workloads import InBackground, PassLoop

log = logging.getLogger(__name__)

GROUP, VERSION = "karpenter.sh", "v1"
NODECLAIMS, NODEPOOLS = "nodeclaims", "nodepools"
FINALIZER = "karpenter.sh/termination"
DISRUPTED_TAINT = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
COMPONENT = "karpenter"
INITIALIZED_LABEL = "karpenter.sh/initialized"
LIFECYCLE = ("Launched", "Registered", "Initialized")  # Ready is True when all three are
BASE_RESOURCES = ("cpu", "memory", "pods", "ephemeral-storage", "nodes")


@dataclass(frozen=True)
class InstanceType:
    """What a cloud instance type brings: allocatable cpu/memory and its GPUs (product as GFD prints it)."""

    name: str
    cpu: str
    memory: str
    gpus: int = 0
    product: str | None = None
    zone: str = "us-east-1a"


INSTANCE_TYPES: dict[str, InstanceType] = {t.name: t for t in (
    InstanceType("p4d.24xlarge", "96", "1152Gi", 8, "NVIDIA-A100-SXM4-40GB"),
    InstanceType("p4de.24xlarge", "96", "1152Gi", 8, "NVIDIA-A100-SXM4-80GB"),
    InstanceType("p5.48xlarge", "192", "2048Gi", 8, "NVIDIA-H100-80GB-HBM3"),
    InstanceType("p5e.48xlarge", "192", "2048Gi", 8, "NVIDIA-H200"),
    InstanceType("g5.xlarge", "4", "16Gi", 1, "NVIDIA-A10G"),
    InstanceType("g5.12xlarge", "48", "192Gi", 4, "NVIDIA-A10G"),
    InstanceType("g6.xlarge", "4", "16Gi", 1, "NVIDIA-L4"),
    InstanceType("g6e.xlarge", "4", "32Gi", 1, "NVIDIA-L40S"),
    InstanceType("g6e.12xlarge", "48", "384Gi", 4, "NVIDIA-L40S"),
    InstanceType("m5.xlarge", "4", "16Gi"),
)}


CRD_DIR = Path(__file__).resolve().parents[2] / "vendor" / "crds"


def _strict(node: Any) -> Any:
    """`additionalProperties: false` wherever properties are listed, so an unknown field fails."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    return [_strict(v) for v in node] if isinstance(node, list) else node


def check_against_crd(obj: Mapping[str, Any], plural: str) -> None:
    """Validate a NodePool/NodeClaim body (spec; metadata name, labels, annotations) with Karpenter's own
    CRD schema (vendor/crds/karpenter.sh_<plural>.yaml), strictly: jsonschema.ValidationError if not."""
    crd = yaml.safe_load((CRD_DIR / f"karpenter.sh_{plural}.yaml").read_text())
    schema = _strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    body = {k: v for k, v in obj.items() if k != "status"}
    body["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items() if k in ("name", "labels", "annotations")}
    jsonschema.validate(body, schema)


def requested_instance_type(claim: Mapping[str, Any]) -> str | None:
    """First value of the claim's `node.kubernetes.io/instance-type In [...]` requirement. Pure."""
    for requirement in (claim.get("spec") or {}).get("requirements") or []:
        if requirement.get("key") == INSTANCE_TYPE_LABEL and requirement.get("operator") == "In":
            values = requirement.get("values") or []
            if values:
                return str(values[0])
    return None


def node_for_claim(claim: Mapping[str, Any], instance: InstanceType) -> dict[str, Any]:
    """The Node a launched claim registers as (name = claim name). Pure."""
    meta = claim["metadata"]
    labels = {
        INSTANCE_TYPE_LABEL: instance.name,
        "karpenter.sh/capacity-type": "on-demand",
        "karpenter.sh/registered": "true",
        "topology.kubernetes.io/zone": instance.zone,
        **(meta.get("labels") or {}),
    }
    for requirement in (claim.get("spec") or {}).get("requirements") or []:
        values = requirement.get("values") or []
        if requirement.get("operator") == "In" and len(values) == 1:
            labels.setdefault(requirement["key"], values[0])
    node = make_node(meta["name"], instance.product, instance.gpus, cpu=instance.cpu, memory=instance.memory,
                     labels=labels, taints=(claim.get("spec") or {}).get("taints") or (),
                     instance_type=instance.name)
    node["spec"]["providerID"] = provider_id(claim, instance)
    node["metadata"]["ownerReferences"] = [{
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeClaim", "name": meta["name"],
        "uid": meta.get("uid", ""), "blockOwnerDeletion": True}]
    return node


def provider_id(claim: Mapping[str, Any], instance: InstanceType) -> str:
    digest = hashlib.sha256(claim["metadata"]["name"].encode()).hexdigest()[:17]
    return f"aws:///{instance.zone}/i-{digest}"


def _set(conditions: dict[str, Any], kind: str, status: str, reason: str, message: str = "") -> None:
    """Set one status condition, keeping its lastTransitionTime while its status stays."""
    old = conditions.get(kind) or {}
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    conditions[kind] = {"type": kind, "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": since or _now()}


def initialization_blocker(claim: Mapping[str, Any], node: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a registered claim is not Initialized yet (upstream's reason and message), None when it is. Pure."""
    ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    if not ready or ready[0].get("status") != "True":
        return "NodeNotReady", "Node status is NotReady"
    taints = (node.get("spec") or {}).get("taints") or []
    for startup in (claim.get("spec") or {}).get("startupTaints") or []:
        if any(t.get("key") == startup.get("key") and t.get("effect") == startup.get("effect") for t in taints):
            return "StartupTaintsExist", f"StartupTaint {startup.get('key')!r} still exists"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for name, quantity in (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).items():
        if name in BASE_RESOURCES or _quantity(quantity) == 0:
            continue
        if _quantity(allocatable.get(name, 0)) == 0:
            return "ResourceNotRegistered", f"Resource {name!r} was requested but not registered"
    return None


def _quantity(value: Any) -> float:
    """A Kubernetes quantity as a number."""
    return float(parse_quantity(value if value not in (None, "") else 0))


def pool_resources(claims: list[dict[str, Any]], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """A NodePool's status.resources from its claims. Pure. Upstream sums StateNode.Capacity() of every
    claim not marked for deletion: the Node's capacity once Initialized, else the claim's status.capacity
    (empty before Launched: not counted, not even as a node); every counted claim adds one `nodes`; the
    base resources are always listed (counter/controller.go BaseResources)."""
    totals: dict[str, float] = dict.fromkeys(BASE_RESOURCES, 0.0)
    for claim in claims:
        if claim["metadata"].get("deletionTimestamp"):
            continue
        status = claim.get("status") or {}
        initialized = any(c.get("type") == "Initialized" and c.get("status") == "True"
                          for c in status.get("conditions") or [])
        node = nodes.get(str(status.get("nodeName") or ""))
        capacity = ((node.get("status") or {}).get("capacity") if initialized and node else None) or \
            status.get("capacity") or {}
        if not capacity:
            continue
        for name, quantity in capacity.items():
            totals[name] = totals.get(name, 0.0) + _quantity(quantity)
        totals["nodes"] += 1
    return {name: _format(value) for name, value in sorted(totals.items())}


def _format(value: float) -> str:
    if value and value % 2**30 == 0:
        return f"{int(value // 2**30)}Gi"
    return str(int(value)) if float(value).is_integer() else str(value)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def drainable(pod: Mapping[str, Any]) -> bool:
    """Pods a drain evicts: not DaemonSet-owned, not mirror pods, not finished or already going. Pure."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class Karpenter(InBackground):
    """Launches and terminates NodeClaims; `reconcile_once()` is one pass, `start()` runs passes."""

    def __init__(self, api_client: client.ApiClient, *, launch_delay: float = 0.2, evict_retry: float = 0.2,
                 instance_types: Mapping[str, InstanceType] = INSTANCE_TYPES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.launch_delay, self.evict_retry = launch_delay, evict_retry
        self.instance_types = dict(instance_types)
        self.clock = clock
        self.evictions: list[tuple[str, str, int]] = []  # (namespace, pod, HTTP status) for assertions
        self._seen: dict[str, float] = {}
        self._next_eviction: dict[str, float] = {}
        self._lock = threading.Lock()
        self._loop = PassLoop("test-karpenter", self.reconcile_once)

    def reconcile_once(self) -> int:
        """One pass over every NodeClaim; returns how many writes it made."""
        with self._lock:
            try:
                claims = read_items(self.custom.list_cluster_custom_object(
                    GROUP, VERSION, NODECLAIMS, _preload_content=False))
            except ApiException as exc:
                if exc.status == 404:  # NodeClaim CRD not installed: nothing to do
                    return 0
                raise
            writes = 0
            for claim in sorted(claims, key=lambda c: c["metadata"]["name"]):
                if claim["metadata"].get("deletionTimestamp"):
                    writes += self._terminate(claim)
                else:
                    writes += self._launch(claim)
            if writes:
                claims = read_items(self.custom.list_cluster_custom_object(
                    GROUP, VERSION, NODECLAIMS, _preload_content=False))
            return writes + self._count(claims)

    # -- launch: the NodeClaim lifecycle, one condition per upstream controller
    # (pkg/controllers/nodeclaim/lifecycle/{launch,registration,initialization}.go at the vendored commit)
    def _launch(self, claim: dict[str, Any]) -> int:
        meta = claim["metadata"]
        writes = 0
        if FINALIZER not in (meta.get("finalizers") or []):
            self._patch_claim(meta["name"], {"metadata": {"finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                                                          "resourceVersion": meta["resourceVersion"]}})
            writes += 1
        status = dict(claim.get("status") or {})
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        if all((conditions.get(t) or {}).get("status") == "True" for t in LIFECYCLE):
            return writes
        first_seen = self._seen.setdefault(meta["name"], self.clock())
        if self.clock() - first_seen < self.launch_delay:
            return writes
        wanted = requested_instance_type(claim)
        instance = self.instance_types.get(wanted or "")
        if instance is None:
            condition = {"type": "Launched", "status": "False", "reason": "InstanceTypeNotFound",
                         "message": f"no instance type {wanted!r} in the test table", "lastTransitionTime": _now()}
            if (conditions.get("Launched") or {}).get("reason") != condition["reason"]:
                self._patch_claim_status(meta["name"], {"status": {"conditions": [condition]}})
                writes += 1
            return writes
        node = node_for_claim(claim, instance)
        before = {t: (conditions.get(t) or {}).get("status") for t in (*LIFECYCLE, "Ready")}
        # Launched: the cloud created the instance; capacity and providerID come from it (launch.go)
        status.update({"providerID": node["spec"]["providerID"], "imageID": "ami-test",
                       "capacity": node["status"]["capacity"], "allocatable": node["status"]["allocatable"]})
        _set(conditions, "Launched", "True", "Launched")
        # Registered: a Node with the claim's providerID joined; labels and taints synced (registration.go)
        registered = self._register(meta["name"], node)
        status["nodeName"] = meta["name"]
        _set(conditions, "Registered", "True", "Registered")
        # Initialized: the Node is Ready, no startup taint left, every extended resource the claim requests
        # registered non-zero by its device plugin (initialization.go RequestedResourcesRegistered)
        reason = initialization_blocker(claim, registered)
        if reason is None:
            self._label_initialized(meta["name"], registered)
            _set(conditions, "Initialized", "True", "Initialized")
        else:
            _set(conditions, "Initialized", "Unknown", reason[0], reason[1])
        done = all(conditions[t]["status"] == "True" for t in LIFECYCLE)
        _set(conditions, "Ready", "True" if done else "Unknown", "Ready" if done else "NotReady")
        after = {t: conditions[t]["status"] for t in (*LIFECYCLE, "Ready")}
        if after == before and (claim.get("status") or {}).get("nodeName"):
            return writes
        status["conditions"] = list(conditions.values())
        self._patch_claim_status(meta["name"], {"status": status})
        if before.get("Launched") != "True":
            record_event(self.core, {"metadata": {**meta, "namespace": "default"}}, "Normal", "Launched",
                         f"launched {instance.name} as node {meta['name']}", COMPONENT,
                         kind="NodeClaim", api_version=f"{GROUP}/{VERSION}")
        return writes + 2

    def _register(self, name: str, node: dict[str, Any]) -> dict[str, Any]:
        """The Node joins (created once) and is read back as it is now."""
        try:
            self.core.create_node(node, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
        created: dict[str, Any] = json.loads(self.core.read_node(name, _preload_content=False).data)
        if not (created.get("status") or {}).get("allocatable"):  # a server that drops status on create
            self.core.patch_node_status(name, {"status": node["status"]}, _content_type=MERGE_PATCH,
                                        _preload_content=False)
            created = json.loads(self.core.read_node(name, _preload_content=False).data)
        return created

    def _label_initialized(self, name: str, node: Mapping[str, Any]) -> None:
        if ((node.get("metadata") or {}).get("labels") or {}).get(INITIALIZED_LABEL) != "true":
            self.core.patch_node(name, {"metadata": {"labels": {INITIALIZED_LABEL: "true"}}},
                                 _content_type=MERGE_PATCH, _preload_content=False)

    # -- the NodePool's status.resources (pkg/controllers/nodepool/counter/controller.go)
    def _count(self, claims: list[dict[str, Any]]) -> int:
        """status.resources and status.nodes of every NodePool: the capacity of its claims not being
        deleted, each also one `nodes` (state/cluster.go updateNodePoolResources, statenode.go Capacity:
        the Node's once initialized, else the claim's status.capacity; nothing before launch)."""
        try:
            pools = read_items(self.custom.list_cluster_custom_object(GROUP, VERSION, NODEPOOLS,
                                                                      _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return 0
            raise
        nodes = {n["metadata"]["name"]: n for n in read_items(self.core.list_node(_preload_content=False))}
        writes = 0
        for pool in pools:
            name = pool["metadata"]["name"]
            totals = pool_resources([c for c in claims if (c["metadata"].get("labels") or {}).get(NODEPOOL_LABEL)
                                     == name], nodes)
            wanted = {"resources": totals, "nodes": int(totals["nodes"])}
            current = pool.get("status") or {}
            if {k: current.get(k) for k in wanted} == wanted:
                continue
            # a merge patch from the stored object, as controller-runtime's MergeFrom: gone keys are null
            gone = dict.fromkeys(set(current.get("resources") or {}) - set(totals))
            patch = {"resources": {**gone, **totals}, "nodes": wanted["nodes"]}
            try:
                self.custom.patch_cluster_custom_object_status(GROUP, VERSION, NODEPOOLS, name, {"status": patch},
                                                               _content_type=MERGE_PATCH, _preload_content=False)
                writes += 1
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return writes

    # -- terminate
    def _terminate(self, claim: dict[str, Any]) -> int:
        meta = claim["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return 0
        node_name = (claim.get("status") or {}).get("nodeName")
        writes = 0
        if node_name:
            try:
                node = json.loads(self.core.read_node(node_name, _preload_content=False).data)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                node = None
            if node is not None:
                taints = list((node.get("spec") or {}).get("taints") or [])
                if not any(t.get("key") == DISRUPTED_TAINT["key"] for t in taints):
                    self.core.patch_node(node_name, {"spec": {"taints": [*taints, DISRUPTED_TAINT]}},
                                         _content_type=MERGE_PATCH, _preload_content=False)
                    writes += 1
                remaining = self._evict_pods(node_name)
                if remaining:
                    return writes
                try:
                    self.core.delete_node(node_name, _preload_content=False)
                    writes += 1
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        self._patch_claim(meta["name"], {"metadata": {"finalizers": finalizers or None,
                                                      "resourceVersion": meta["resourceVersion"]}})
        self._seen.pop(meta["name"], None)
        return writes + 1

    def _evict_pods(self, node_name: str) -> int:
        """Ask the Eviction API to remove every drainable pod on the node; returns how many remain."""
        pods = [p for p in read_items(self.core.list_pod_for_all_namespaces(_preload_content=False))
                if (p.get("spec") or {}).get("nodeName") == node_name and drainable(p)]
        now = self.clock()
        for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            if now < self._next_eviction.get(key, 0.0):
                continue
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"]}}
            try:
                self.core.create_namespaced_pod_eviction(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                                         body, _preload_content=False)
                status = 201
            except ApiException as exc:
                status = exc.status
                if status not in (404, 429, 500):
                    raise
            self.evictions.append((pod["metadata"]["namespace"], pod["metadata"]["name"], status))
            if status in (429, 500):  # a PDB forbids it now (or the pod matches several): back off
                self._next_eviction[key] = now + self.evict_retry
        return len(pods)

    # -- writes
    def _patch_claim(self, name: str, body: dict[str, Any]) -> None:
        try:
            self.custom.patch_cluster_custom_object(GROUP, VERSION, NODECLAIMS, name, body,
                                                    _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or changed since we read it: next pass
                raise

    def _patch_claim_status(self, name: str, body: dict[str, Any]) -> None:
        try:
            self.custom.patch_cluster_custom_object_status(GROUP, VERSION, NODECLAIMS, name, body,
                                                           _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
