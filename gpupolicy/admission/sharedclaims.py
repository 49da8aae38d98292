"""Time-slicing through DRA: which shared ResourceClaim a pod's share names, and what that claim holds. Pure.

NVIDIA's DRA driver shares a device among the pods that name one ResourceClaim
(its demo `demo/specs/quickstart/v1/gpu-test3.yaml`); a ResourceClaimTemplate
makes a claim per pod, so a time-sliced share is a `kubeon-ts-<policy>-<i>`
claim that at most `replicas` pods name. The claim carries no opaque
`GpuConfig`: the driver checks a `sharing: {strategy: TimeSlicing}` config only
with its alpha gate `TimeSlicingSettings` on (off by default; `GpuSharing.Validate`
in api/nvidia.com/resource/v1beta1/validate.go fails "invalid GPU sharing
settings" otherwise and the kubelet plugin refuses to prepare the claim), and
without one the pods naming the claim share its GPU with the GPU's default
time slice, which is what the device plugin's time-slicing gives too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupolicy.admission.claims import MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, gpu_template
from gpupolicy.admission.rewrite import GpuScan
from gpupolicy.catalog import GPU_RESOURCE, Catalog
from gpupolicy.cluster import ClusterView
from gpupolicy.dra import SHARED_CLAIM_PREFIX, shared_claim_name
from gpupolicy.model import SharingSpec

MAX_CLAIM_CONSUMERS = 256  # resource.k8s.io/v1 ResourceClaimReservedForMaxSize: pods one claim may serve


def pick_shared_claim(policy: str, replicas: int, held: Mapping[str, int]) -> str:
    """The claim a new share names: the lowest-numbered one that `held` (claim name -> pods naming it that
    have not ended, as the caller knows them) counts fewer than `replicas` pods on; when all are full, the
    next name in order, the same for every caller that counts the same pods."""
    index = 0
    while held.get(shared_claim_name(policy, index), 0) >= min(replicas, MAX_CLAIM_CONSUMERS):
        index += 1
    return shared_claim_name(policy, index)


def shared_claim(name: str, namespace: str, sharing: SharingSpec, catalog: Catalog, policy: str,
                 policy_uid: str | None = None) -> dict[str, Any]:
    """The ResourceClaim as the controller creates it: one whole GPU (of the policy's gpuModels when it
    lists some, the same selector as `kubeon-gpu-1`), labelled ours and owned by the policy for GC."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: policy}}
    if policy_uid:
        metadata["ownerReferences"] = [{"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
                                        "name": policy, "uid": policy_uid}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": gpu_template(1, sharing, catalog).spec()["spec"]}


@dataclass(frozen=True)
class SharePlan:
    """The container that takes the pod's share and the claim it names, or why the pod is left alone."""

    container: str = ""
    claim: str = ""
    skip_reason: str = ""
    warning: str = ""


def plan_share(pod: Mapping[str, Any], policy: str, replicas: int, scan: GpuScan, view: ClusterView,
               namespace: str) -> SharePlan:
    """Which shared claim a pod's `nvidia.com/gpu: 1` names under a TimeSlicing `via: DRA` policy.

    A share is one GPU for one container: a pod asking for more, or for a
    fraction, or with its own `spec.resourceClaims`, is left alone with the
    reason; one that names a claim of ours already (a reinvocation) quietly.
    """
    wanting = {str(c.get("name", "")): gpus.get(GPU_RESOURCE, 0.0) for c, gpus in (*scan.init, *scan.main)
               if gpus.get(GPU_RESOURCE, 0.0) > 0}
    if any(name != GPU_RESOURCE and count > 0 for _, gpus in (*scan.init, *scan.main) for name, count in gpus.items()):
        return SharePlan(skip_reason="already asks for a MIG slice or a shared GPU")
    if not wanting:
        return SharePlan(skip_reason="no container asks for nvidia.com/gpu")
    claims = (pod.get("spec") or {}).get("resourceClaims") or []
    if claims:
        if all(str(c.get("resourceClaimName", "")).startswith(SHARED_CLAIM_PREFIX) for c in claims):
            return SharePlan(skip_reason="names a shared claim already")
        return _left("the pod has its own spec.resourceClaims")
    if len(wanting) != 1 or next(iter(wanting.values())) != 1:
        asked = ", ".join(f"{name}: {count:g}" for name, count in wanting.items())
        return _left(f"a time-sliced share is one GPU for one container ({asked})")
    held = {claim: n for (ns, claim), n in view.shared_claim_pods.items() if ns == namespace}
    return SharePlan(next(iter(wanting)), pick_shared_claim(policy, replicas, held))


def _left(reason: str) -> SharePlan:
    return SharePlan(skip_reason=reason, warning=f"pod left unchanged: {reason}")


def is_shared_claim_of(policy: str, name: str) -> bool:
    """Whether `name` is one `shared_claim_name(policy, i)` gives: the controller creates no other."""
    head = shared_claim_name(policy, 0)[:-2]
    index = name[len(head) + 1:] if name.startswith(head + "-") else ""
    return index.isascii() and index.isdigit() and len(index) < 6 and shared_claim_name(policy, int(index)) == name
