"""The Karpenter NodePool a capacity policy declares, and the NodeClaims it adds. Pure.

The controller owns exactly the fields built here and writes them by
server-side apply (field manager `kubeon-gpu-optimizer`, never forced), so a
field another manager set is never overwritten: the API server answers 409
and the policy reports the conflict. The shape:

- `template.spec.requirements`: the instance types whose GPU product is in
  `gpuModels` (every GPU type of the catalog when empty), on-demand;
- `template.spec.taints`: `nvidia.com/gpu:NoSchedule`, so only GPU pods land;
- `limits`: `nvidia.com/gpu: maxGpus` (Karpenter stops launching past it);
  with `wholeGpus: Optimizer`, `nvidia.com/gpu: 0`: Karpenter launches no
  node itself (it checks limits only before its own launches), and the
  optimizer's NodeClaims serve every GPU pod of the pool;
- `disruption`: `consolidationPolicy: WhenEmpty`, `consolidateAfter: Never`
  (the optimizer consolidates, usage-aware; Karpenter's requests-only
  consolidation would fight it), and a budget of `maxDisruptedNodes` nodes
  for what Karpenter still disrupts itself (drift, expiry).

NodeClaims (for shared GPUs, and for whole GPUs under `wholeGpus: Optimizer`)
carry the same requirements narrowed to one instance type, the taint, the pool label, and the sharing layout's node
labels (`nvidia.com/mig.config`), so the GPU Operator prepares the node as it
boots and the sharing-layout reconciler finds it ready.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from gpupolicy.catalog import GPU_RESOURCE, normalise_product_label
from gpupolicy.k8s.taints import GPU_TAINT
from gpupolicy.model import CapacitySpec, WholeGpus

GROUP, VERSION = "karpenter.sh", "v1"
API_VERSION = f"{GROUP}/{VERSION}"
FIELD_MANAGER = "kubeon-gpu-optimizer"
POOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
POLICY_LABEL = "gpu.kubeon.io/capacity-policy"  # on the NodePool and on the NodeClaims we create
MANAGED_BY = {"app.kubernetes.io/managed-by": "kubeon-gpu-optimizer"}
FOR_PODS_ANNOTATION = "gpu.kubeon.io/launched-for"  # the pending pods a NodeClaim was created for


def allowed_types(spec: CapacitySpec, products: Mapping[str, str]) -> list[str]:
    """Instance types (of `products`: type -> GPU product) whose GPU is one of gpuModels."""
    wanted = {normalise_product_label(m) for m in spec.gpu_models}
    return sorted(t for t, p in products.items() if not wanted or normalise_product_label(p) in wanted)


def requirements(types: list[str]) -> list[dict[str, Any]]:
    return [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(types)},
            {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]}]


def desired_nodepool(policy: str, spec: CapacitySpec, products: Mapping[str, str]) -> dict[str, Any]:
    """The NodePool object the policy declares (an apply body: only the fields we own)."""
    types = allowed_types(spec, products)
    if not types:
        raise ValueError(f"no instance type of the catalog has a GPU in gpuModels {spec.gpu_models}")
    body: dict[str, Any] = {
        "apiVersion": API_VERSION, "kind": "NodePool",
        "metadata": {"name": spec.node_pool, "labels": {**MANAGED_BY, POLICY_LABEL: policy}},
        "spec": {
            "template": {
                "metadata": {"labels": {POLICY_LABEL: policy}},
                "spec": {
                    "nodeClassRef": spec.node_class_ref.model_dump(),
                    "requirements": requirements(types),
                    "taints": [dict(GPU_TAINT)],
                },
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never",
                           "budgets": [{"nodes": str(spec.consolidation.max_disrupted_nodes)}]},
        },
    }
    if spec.whole_gpus is WholeGpus.OPTIMIZER:  # Karpenter checks limits before its own launches only
        body["spec"]["limits"] = {GPU_RESOURCE: "0"}
    elif spec.max_gpus is not None:
        body["spec"]["limits"] = {GPU_RESOURCE: str(spec.max_gpus)}
    return body


def claim_name(pool: str, instance_type: str, pods: list[str], index: int) -> str:
    """A stable NodeClaim name for one launch: the same pending pods give the same name (a crash
    between the create and the next pass, or a second leader, gets 409, never a second node)."""
    digest = hashlib.sha256("\x00".join([pool, instance_type, *sorted(pods), str(index)]).encode()).hexdigest()
    return f"{pool}-{digest[:10]}"[:63]


def desired_nodeclaim(name: str, policy: str, spec: CapacitySpec, instance_type: str,
                      labels: Mapping[str, str], pods: list[str]) -> dict[str, Any]:
    """The NodeClaim for one node of `instance_type` in the policy's pool."""
    shown = ",".join(sorted(pods)[:20]) + (f",+{len(pods) - 20}" if len(pods) > 20 else "")
    return {
        "apiVersion": API_VERSION, "kind": "NodeClaim",
        "metadata": {"name": name,
                     "labels": {**MANAGED_BY, POOL_LABEL: spec.node_pool, POLICY_LABEL: policy, **labels},
                     "annotations": {FOR_PODS_ANNOTATION: shown}},
        "spec": {
            "nodeClassRef": spec.node_class_ref.model_dump(),
            "requirements": [*requirements([instance_type]),
                             {"key": POOL_LABEL, "operator": "In", "values": [spec.node_pool]}],
            "taints": [dict(GPU_TAINT)],
        },
    }
