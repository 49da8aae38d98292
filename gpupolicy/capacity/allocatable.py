"""What a launched node of an instance type offers: its allocatable, read from the nodes and NodeClaims seen. Pure.

The catalog gives an instance type's capacity, but pods get a node's
allocatable: capacity less what the kubelet and the provider keep (Karpenter's
KWOK provider keeps 100m CPU and 10Mi, EKS hundreds of MiB and some CPU). A pod
asking a type's whole CPU does not fit a node of it, and a launching NodeClaim
counted at capacity serves pods its node cannot hold. So each pass reads what
the registered nodes (their `node.kubernetes.io/instance-type`) and Karpenter's
launched NodeClaims (`status.allocatable`, set at launch) report, and plans new
nodes, replacements and launching claims with the least CPU and memory seen per
type (`offered`); the catalog's capacity stands for a type never seen launched.

The sharing-layout planner matches pending shared-GPU pods to nodes by
devices alone; `held_nowhere` adds what it does not see: a pod whose CPU or
memory no node has free (a registered node's allocatable less its pods'
requests, a launching NodeClaim's offer) is not served, whatever the devices.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpupolicy.capacity.demand import milli_requests
from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.nodepool import INSTANCE_TYPE_LABEL
from gpupolicy.capacity.provider import CapacityNode
from gpupolicy.packing.kubemodel import ObjectError, cpu_milli_of, memory_mib_of

Allocatable = tuple[int, int]  # CPU milli, memory MiB


def _read(allocatable: Mapping[str, Any]) -> Allocatable | None:
    """CPU milli and memory MiB of an allocatable map; None when either is missing or unreadable."""
    cpu, memory = allocatable.get("cpu"), allocatable.get("memory")
    if cpu is None or memory is None:
        return None
    try:
        return cpu_milli_of(cpu, "allocatable.cpu"), memory_mib_of(memory, "allocatable.memory")
    except ObjectError:
        return None


def observed(nodes: Iterable[Mapping[str, Any]], claims: Iterable[CapacityNode],
             types: Container[str]) -> dict[str, Allocatable]:
    """Per instance type of `types` (the catalog's), the least CPU and memory a registered node or a launched
    NodeClaim of it reports allocatable. A node or claim of another type or none, or with an unreadable
    allocatable, says nothing."""
    seen: list[tuple[str, Allocatable | None]] = []
    for node in nodes:
        kind = str(((node.get("metadata") or {}).get("labels") or {}).get(INSTANCE_TYPE_LABEL) or "")
        if kind in types:
            seen.append((kind, _read((node.get("status") or {}).get("allocatable") or {})))
    seen += [(claim.instance_type, _read(claim.allocatable)) for claim in claims
             if claim.allocatable and claim.instance_type in types]
    out: dict[str, Allocatable] = {}
    for kind, value in seen:
        if value is not None:
            old = out.get(kind)
            out[kind] = value if old is None else (min(old[0], value[0]), min(old[1], value[1]))
    return out


def offered(instances: Sequence[InstanceType], allocatable: Mapping[str, Allocatable]) -> list[InstanceType]:
    """The catalog as nodes of it offer: each type's CPU and memory lowered to `allocatable`'s, where known."""
    out = []
    for kind in instances:
        seen = allocatable.get(kind.name)
        if seen is None:
            out.append(kind)
            continue
        cpu, memory = max(1, min(kind.cpu_milli, seen[0])), max(1, min(kind.memory_mib, seen[1]))
        out.append(kind if (cpu, memory) == (kind.cpu_milli, kind.memory_mib)
                   else replace(kind, cpu_milli=cpu, memory_mib=memory))
    return out


def free_on(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> Allocatable | None:
    """A node's free CPU and memory: its allocatable less the requests of `pods` (those it runs); None when
    its allocatable is unreadable."""
    free = _read((node.get("status") or {}).get("allocatable") or {})
    if free is None:
        return None
    cpu, memory = free
    for pod in pods:
        asked = milli_requests(pod)
        cpu, memory = cpu - asked[0], memory - asked[1]
    return cpu, memory


def held_nowhere(pod: Mapping[str, Any], rooms: Iterable[Allocatable]) -> bool:
    """No room has the pod's CPU and memory requests free."""
    cpu, memory = milli_requests(pod)
    return not any(cpu <= free_cpu and memory <= free_memory for free_cpu, free_memory in rooms)
