"""Pending shared-GPU pods as whole-GPU demand, and launching NodeClaims as nodes. Pure.

Karpenter cannot provision for `nvidia.com/gpu.shared` or `nvidia.com/mig-*`:
no instance type advertises them before the GPU Operator runs. The capacity
reconciler therefore:

1. asks the sharing-layout planner (layout.py) which waiting pods nothing can
   serve: not what nodes offer, not an empty node re-laid, and not a
   launching NodeClaim, which enters the planner as an empty node of its
   instance type (`claim_as_node`) so a burst of pending pods is counted
   against the capacity already asked for;
2. turns each unserved pod into GPU milli under the layout its sharing
   policy asks for (`launch_demand`): a time-sliced share is 1/replicas of a
   GPU; a MIG slice is its compute slices' share of a GPU cut by its
   profile's `all-<profile>` layout (the GPU Operator's default set), i.e.
   1/instances, the live model's conversion (packing/migslices.py), per
   product that has the profile (the caller plans each product and keeps
   the cheapest);
   (Under node groups whole-GPU pods come here too, as `num_gpu` whole GPUs:
   no Karpenter provisions them there.)
3. groups them by resource, so every node launched runs one layout, and
   `boot_labels` names the MIG layout the node boots with
   (`nvidia.com/mig.config`). A time-sliced node boots whole and the layout
   reconciler moves it to its ConfigMap key once it is there and empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.catalog import (
    DEFAULT_CATALOG,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    Catalog,
    normalise_product_label,
)
from gpupolicy.model import GpuPolicy
from gpupolicy.packing.dradevices import claims_demand
from gpupolicy.packing.kubemodel import ObjectError, pod_requests
from gpupolicy.packing.migslices import slice_milli
from gpupolicy.packing.nodemodel import MILLI, PodDemand

GPU_COUNT_LABEL = "nvidia.com/gpu.count"


def is_shared_resource(resource: str) -> bool:
    return resource == SHARED_GPU_RESOURCE or resource.startswith(MIG_RESOURCE_PREFIX)


def claim_as_node(claim_name: str, instance: InstanceType, labels: Mapping[str, str]) -> dict[str, Any]:
    """A launching NodeClaim as the Node it will register as (empty; whole GPUs unless it boots MIG)."""
    return {"metadata": {"name": claim_name,
                         "labels": {**labels, PRODUCT_LABEL: instance.model, GPU_COUNT_LABEL: str(instance.gpus)}},
            "spec": {},
            "status": {"allocatable": {"cpu": f"{instance.cpu_milli}m", "memory": f"{instance.memory_mib}Mi",
                                       GPU_RESOURCE: str(instance.gpus)}}}


@dataclass(frozen=True)
class LaunchDemand:
    """One unserved pod as the provisioner sees it."""

    pod: str               # namespace/name
    resource: str          # what it waits for
    demand: PodDemand      # in whole-GPU milli terms (MIG: the largest share among its products)
    layout: str | None     # the MIG layout a node for it boots with (None: whole / time-sliced later)
    # MIG: the demand on each product that has the profile (a 1g.10gb is 1/7 of an A100-80GB, 1/4 of
    # an A100-40GB), so the provisioner can size per product. Empty for time-sliced shares.
    by_product: Mapping[str, PodDemand] = field(default_factory=dict)


def milli_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's CPU (milli) and memory (MiB) requests; (0, 0) when unreadable (the webhook names the field)."""
    try:
        requests = pod_requests(pod)
    except ObjectError:
        return 0, 0
    return int(requests.get("cpu", 0) * 1000), int(requests.get("memory", 0) / (1024 * 1024))


def _gpu_count(pod: Mapping[str, Any]) -> int:
    """Whole GPUs the pod asks for, its claims' included (`dradevices.claims_demand`: a shared claim's one GPU
    reaches here only for the pod that counts it, `layout.read_demand`)."""
    try:
        return int(pod_requests(pod).get(GPU_RESOURCE, 0)) + claims_demand(pod)[0]
    except ObjectError:
        return 0


def launch_demand(pod: Mapping[str, Any], resource: str, policy: GpuPolicy | None, capacity_models: list[str],
                  catalog: Catalog = DEFAULT_CATALOG) -> LaunchDemand | None:
    """The whole-GPU demand of one pending pod waiting for `resource`; None when no product can serve it."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
    cpu, mem = milli_requests(pod)
    allowed = {normalise_product_label(m) for m in capacity_models} or None
    sharing = policy.spec.sharing if policy is not None else None
    if sharing is not None and sharing.gpu_models:
        theirs = {normalise_product_label(m) for m in sharing.gpu_models}
        allowed = theirs if allowed is None else allowed & theirs
    selected = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(PRODUCT_LABEL)
    if selected:
        only = {normalise_product_label(str(selected))}
        allowed = only if allowed is None else allowed & only
    if resource == GPU_RESOURCE:  # whole GPUs (node groups: no Karpenter provisions them)
        count = _gpu_count(pod)
        return LaunchDemand(key, resource, PodDemand(cpu_milli=cpu, memory_mib=mem, num_gpu=count, gpu_milli=MILLI,
                                                     allowed_models=frozenset(allowed) if allowed is not None
                                                     else None, name=key), None) if count else None
    if resource == SHARED_GPU_RESOURCE:
        replicas = sharing.time_slicing_replicas if sharing is not None else 2
        models = frozenset(allowed) if allowed is not None else None
        return LaunchDemand(key, resource, PodDemand(cpu_milli=cpu, memory_mib=mem, num_gpu=1,
                                                     gpu_milli=MILLI // replicas, allowed_models=models,
                                                     name=key), None)
    profile_name = resource.removeprefix(MIG_RESOURCE_PREFIX)
    worst = 0
    products: set[str] = set()
    by_product: dict[str, PodDemand] = {}
    layout = ""
    for product in catalog.products:
        if allowed is not None and product.product not in allowed and not set(product.aliases) & allowed:
            continue
        profile = product.profile(profile_name.replace(".me", "+me"))
        if profile is None or profile.max_instances <= 0:
            continue
        products.add(product.product)
        # its slice of a GPU cut all-<profile> (the live model's conversion, rounded down to fit the bin)
        milli = slice_milli(profile.compute_slices, profile.compute_slices * profile.max_instances)
        worst = max(worst, milli)
        by_product[product.product] = PodDemand(cpu_milli=cpu, memory_mib=mem, num_gpu=1, gpu_milli=milli,
                                                allowed_models=frozenset({product.product}), name=key)
        layout = "all-" + profile.name.replace("+", ".")
    if not products:
        return None
    return LaunchDemand(key, resource, PodDemand(cpu_milli=cpu, memory_mib=mem, num_gpu=1, gpu_milli=worst,
                                                 allowed_models=frozenset(products), name=key), layout, by_product)


def boot_labels(resource: str, layout: str | None) -> dict[str, str]:
    """Node labels a NodeClaim for pods waiting on `resource` boots with."""
    if resource.startswith(MIG_RESOURCE_PREFIX) and layout:
        return {MIG_CONFIG_LABEL: layout}
    return {}


def group_by_resource(demands: Iterable[LaunchDemand]) -> dict[str, list[LaunchDemand]]:
    """Demands per resource (one layout per launched node), in a stable order."""
    out: dict[str, list[LaunchDemand]] = {}
    for demand in sorted(demands, key=lambda d: (d.resource, d.pod)):
        out.setdefault(demand.resource, []).append(demand)
    return out
