"""DRA state as the packing model sees it: ResourceSlices as node capacity, ResourceClaim allocations as held
devices, our claim templates as a pending pod's demand. Pure (docs/designs/dra.md, "The live model").

A node whose NVIDIA DRA driver publishes devices advertises no `nvidia.com/gpu`; the model gives it the
rows the device plugin's resources would: MIG devices as `nvidia.com/mig-<profile>` counts on GPU rows
(one row per `parentUUID`, the layout the most devices of a profile any one GPU has), whole GPUs as rows
of their own. A node publishing both (GPUs not in MIG mode beside MIG ones) is modelled by its MIG devices.

What a claim holds is the scheduler's allocation (`status.allocation.devices.results`, each naming a pool
and a device of a slice), never a guess: each MIG device on the GPU row of its parent, each whole GPU on
its own row. Only devices of NVIDIA's driver are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpupolicy.catalog import GPU_RESOURCE, MIG_RESOURCE_PREFIX, normalise_product_label
from gpupolicy.dra import DRIVER, SHARED_CLAIM_PREFIX, template_request
from gpupolicy.k8s.quantity import QuantityError, parse_bytes_mib, shown
from gpupolicy.packing.nodemodel import MAX_GPUS_PER_NODE, NodeSpec, PodDemand

Obj = Mapping[str, Any]


class SliceError(ValueError):
    """A ResourceSlice or ResourceClaim the model cannot read; the message names the field."""


@dataclass(frozen=True)
class Device:
    """One device of a slice: a whole GPU (`profile` empty) or a MIG device on GPU `parent`."""

    name: str
    parent: str  # the GPU's UUID (a whole GPU's own)
    product: str = ""  # GFD's spelling (`NVIDIA-H200`)
    profile: str = ""
    memory_mib: int = 0


@dataclass(frozen=True)
class NodeDevices:
    """The devices NVIDIA's driver publishes for one node, and the GPU row of each parent UUID."""

    devices: Mapping[str, Device]
    rows: Mapping[str, int]

    @staticmethod
    def of(devices: Iterable[Device]) -> NodeDevices:
        """Rows in the devices' name order (the driver names them `gpu-<index>[-mig-...]`); MIG GPUs only
        when there are any (module doc)."""
        found = {d.name: d for d in sorted(devices, key=lambda d: d.name)}
        mig = any(d.profile for d in found.values())
        kept = {n: d for n, d in found.items() if bool(d.profile) == mig}
        rows: dict[str, int] = {}
        for device in kept.values():
            rows.setdefault(device.parent, len(rows))
        return NodeDevices(kept, rows)

    @property
    def mig(self) -> bool:
        return any(d.profile for d in self.devices.values())


def _attribute(device: Obj, key: str, where: str) -> str:
    value = (device.get("attributes") or {}).get(key)
    if value is None:
        return ""
    if not isinstance(value, Mapping) or not isinstance(value.get("string"), str):
        raise SliceError(f"{where}.attributes.{key}: expected {{string: ...}}, got {shown(value)}")
    return str(value["string"])


def _device(raw: Any, where: str) -> Device | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise SliceError(f"{where}: expected a device with a name, got {shown(raw)}")
    kind = _attribute(raw, "type", where)
    if kind not in ("gpu", "mig"):
        return None  # another kind of device the driver may publish (e.g. a channel): not a GPU row
    memory = ((raw.get("capacity") or {}).get("memory") or {}).get("value", 0)
    try:
        mib = int(parse_bytes_mib(memory))
    except (QuantityError, ValueError, TypeError) as exc:
        raise SliceError(f"{where}.capacity.memory: not a memory quantity: {shown(memory)}") from exc
    profile = _attribute(raw, "profile", where) if kind == "mig" else ""
    if kind == "mig" and not profile:
        raise SliceError(f"{where}.attributes.profile: a MIG device without a profile")
    uuid = _attribute(raw, "uuid", where) or raw["name"]
    parent = _attribute(raw, "parentUUID", where) if kind == "mig" else uuid
    return Device(raw["name"], parent or uuid, normalise_product_label(_attribute(raw, "productName", where)
                                                                       .replace(" ", "-")), profile, mib)


def read_slice(obj: Obj) -> tuple[str, str, list[Device]]:
    """(node, pool, GPU devices) of a ResourceSlice of NVIDIA's driver; ("", "", []) for any other slice
    (another driver, or a slice for no one node). SliceError naming the field."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise SliceError("spec: missing")
    node, pool = spec.get("nodeName"), (spec.get("pool") or {}).get("name") if isinstance(spec.get("pool"),
                                                                                          Mapping) else None
    if spec.get("driver") != DRIVER or not isinstance(node, str) or not node:
        return "", "", []
    raw = spec.get("devices") or []
    if not isinstance(raw, list):
        raise SliceError(f"spec.devices: expected a list, got {shown(raw)}")
    devices = [d for i, r in enumerate(raw) if (d := _device(r, f"spec.devices[{i}]")) is not None]
    return node, str(pool or node), devices


def dra_node_spec(spec: NodeSpec, devices: NodeDevices) -> NodeSpec:
    """`spec` (the Node's own capacity) with the GPU rows its driver's devices make (module doc)."""
    if not devices.devices:
        return spec
    if len(devices.rows) > MAX_GPUS_PER_NODE:
        raise SliceError(f"node {spec.name}: {len(devices.rows)} GPUs, more than {MAX_GPUS_PER_NODE}")
    first = next(iter(devices.devices.values()))
    model, memory = spec.model or first.product, spec.gpu_memory_mib
    if not devices.mig:
        return replace(spec, gpu_count=len(devices.rows), model=model, exclusive=True,
                       gpu_memory_mib=memory or max(d.memory_mib for d in devices.devices.values()))
    counts = device_counts(devices)
    per_gpu: dict[tuple[str, str], int] = {}
    for device in devices.devices.values():
        resource = mig_resource(device.profile)
        per_gpu[device.parent, resource] = per_gpu.get((device.parent, resource), 0) + 1
    layout: dict[str, int] = {}
    for (_, resource), count in per_gpu.items():
        layout[resource] = max(layout.get(resource, 0), count)
    return replace(spec, gpu_count=len(devices.rows), model=model, mig=counts, mig_per_gpu=layout, exclusive=False,
                   shared=0)


def mig_resource(profile: str) -> str:
    """The device plugin's resource name for a MIG profile: what the model's MIG rows and counts are keyed by."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def device_counts(devices: NodeDevices) -> dict[str, int]:
    """The node's devices as the device plugin would advertise them: `nvidia.com/mig-<profile>` counts, or
    `nvidia.com/gpu` for whole GPUs (the capacity planner's offers, `gpupolicy.capacity.layout`)."""
    counts: dict[str, int] = {}
    for device in devices.devices.values():
        resource = mig_resource(device.profile) if device.profile else GPU_RESOURCE
        counts[resource] = counts.get(resource, 0) + 1
    return counts


def node_devices(slices: Iterable[Obj]) -> dict[str, NodeDevices]:
    """Each node's devices from a list of ResourceSlices (those that cannot be read are left out)."""
    found: dict[str, list[Device]] = {}
    for obj in slices:
        try:
            node, _, devices = read_slice(obj)
        except SliceError:
            continue
        if node:
            found.setdefault(node, []).extend(devices)
    return {node: NodeDevices.of(devices) for node, devices in found.items() if devices}


def allocation(claim: Obj) -> tuple[str, list[tuple[str, str]]]:
    """(node, [(pool, device)]) of an allocated ResourceClaim's devices of NVIDIA's driver; ("", []) when it
    is not allocated. The node is the allocation's nodeSelector (`metadata.name`), else the pool's."""
    alloc = (claim.get("status") or {}).get("allocation") if isinstance(claim.get("status"), Mapping) else None
    if not isinstance(alloc, Mapping):
        return "", []
    results = (alloc.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise SliceError(f"status.allocation.devices.results: expected a list, got {shown(results)}")
    held = [(str(r.get("pool", "")), str(r.get("device", ""))) for r in results
            if isinstance(r, Mapping) and r.get("driver") == DRIVER]
    return _selected_node(alloc.get("nodeSelector")), held


def _selected_node(selector: Any) -> str:
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
    for term in terms if isinstance(terms, list) else []:
        for field in (term.get("matchFields") or []) if isinstance(term, Mapping) else []:
            values = field.get("values") if isinstance(field, Mapping) else None
            if field.get("key") == "metadata.name" and isinstance(values, list) and len(values) == 1:
                return str(values[0])
    return ""


def held_by_claim(devices: NodeDevices, names: Iterable[str], name: str = "") -> tuple[PodDemand, tuple[int, ...]]:
    """What an allocation holds on its node, as a demand and its GPU rows (`kubemodel.occupy`'s order: whole
    GPUs first, then one row per MIG device, resources in name order). Devices the node's slices do not
    list (a slice being republished) hold nothing."""
    whole, mig = [], []
    for device in (devices.devices.get(n) for n in names):
        if device is None:
            continue
        if device.profile:
            mig.append((mig_resource(device.profile), devices.rows[device.parent]))
        else:
            whole.append(devices.rows[device.parent])
    counts: dict[str, int] = {}
    for resource, _ in mig:
        counts[resource] = counts.get(resource, 0) + 1
    rows = (*whole, *(row for _, row in sorted(mig)))
    return PodDemand(num_gpu=len(whole), gpu_milli=1000 if whole else 0, mig=counts, name=name), rows


def claimed_templates(pod: Obj) -> list[str]:
    """The templates of ours a pod's `spec.resourceClaims` name, one per claim (a claim is per container)."""
    spec = pod.get("spec")
    claims = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    return [str(c["resourceClaimTemplateName"]) for c in claims if isinstance(c, Mapping)
            and template_request(str(c.get("resourceClaimTemplateName") or "")) is not None] \
        if isinstance(claims, list) else []


def shared_claims(pod: Obj) -> list[str]:
    """The shared claims of ours (`kubeon-ts-<policy>-<i>`, time-slicing through DRA) a pod's
    `spec.resourceClaims` name, as `namespace/name` (the key a claim watch uses)."""
    spec = pod.get("spec")
    claims = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    meta = pod.get("metadata")
    namespace = str(meta.get("namespace") or "default") if isinstance(meta, Mapping) else "default"
    return [f"{namespace}/{c['resourceClaimName']}" for c in claims if isinstance(c, Mapping)
            and str(c.get("resourceClaimName") or "").startswith(SHARED_CLAIM_PREFIX)] \
        if isinstance(claims, list) else []


def is_claim_based(pod: Obj) -> bool:
    """Whether the pod's GPU comes through claims of ours (a template's or a shared claim), which Karpenter
    cannot provision for (karpenter #1231, #3228)."""
    return bool(claimed_templates(pod) or shared_claims(pod))


def claims_demand(pod: Obj, shared: bool = True) -> tuple[int, dict[str, int]]:
    """(whole GPUs, MIG devices per resource) the pod's claims on our templates will hold once allocated:
    the demand of a pending claim-based pod. A shared claim takes one whole GPU (its `replicas` pods
    time-slice it); `shared=False` for a pod whose shared claim another pod already counts
    (`shared_claim_takers`), so that N pods of one claim ask for one GPU, not N."""
    gpus, mig = len(shared_claims(pod)) if shared else 0, dict[str, int]()
    for name in claimed_templates(pod):
        request = template_request(name)
        assert request is not None
        gpus += request.count
        if request.mig_resource:
            mig[request.mig_resource] = mig.get(request.mig_resource, 0) + 1
    return gpus, mig


def shared_claim_takers(pods: Iterable[Obj]) -> set[str]:
    """The pods (`namespace/name`) that count the GPU of their shared claims, one per claim among the live
    `pods`: a bound one if any (its claim is allocated on its node: the pods still pending on it are pinned
    there and ask for nothing more), else the first pending one (the claim's GPU, asked for once for the
    burst). A reader without the claims themselves (the controller) counts a claim allocated once a pod
    naming it is bound; the scheduler allocates it just before binding its first pod."""
    pending: dict[str, str] = {}
    bound: dict[str, str] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        if not spec.get("resourceClaims"):
            continue  # most pods: no claim at all
        status = pod.get("status")
        if isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
            continue
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") and not spec.get("nodeName"):
            continue  # never to run: another pending pod of its claim asks for the GPU
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        for claim in shared_claims(pod):
            (bound if spec.get("nodeName") else pending).setdefault(claim, key)
    return {*bound.values(), *(key for claim, key in pending.items() if claim not in bound)}
