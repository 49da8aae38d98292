"""Time-slicing through DRA: which shared ResourceClaim a pod's share names, and what that claim holds. Pure.

NOT WIRED YET (docs/designs/dra.md, "Time-slicing through one shared claim"): the model and the CRD still
refuse `strategy: TimeSlicing, via: DRA`; these are the decisions the webhook and the controller will call.

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
from typing import Any

from gpupolicy.admission.claims import MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, gpu_template
from gpupolicy.catalog import Catalog
from gpupolicy.dra import shared_claim_name
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
