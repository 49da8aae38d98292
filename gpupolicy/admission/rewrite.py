"""Rewrite a GPU pod onto a MIG slice or a time-sliced share, in place on a copy.

What is rewritten: each container (and init container) asking for exactly one
`nvidia.com/gpu` gets `nvidia.com/mig-<profile>: 1` or `nvidia.com/gpu.shared: 1`
in requests and limits instead. `auto` picks the smallest MIG profile (fewest
memory slices, then fewest compute slices, then least memory) whose *real*
memory covers the pod's need, over the allowed products. Every step is an
"ensure" (set only what is missing), which is what makes mutation idempotent:
a rewritten pod asks for MIG/shared resources and is left alone next time.
This module decides; gpupolicy.admission.writes makes the writes (on a copy,
each with its JSON Patch operation). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, NamedTuple

import orjson

from gpupolicy.catalog import (
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    GpuProduct,
    MigProfile,
    normalise_profile_name,
    profile_memory_mib,
)
from gpupolicy.cluster import ClusterView
from gpupolicy.k8s.quantity import QuantityError, parse_bytes_mib, parse_quantity
from gpupolicy.matching import pod_allowed_products
from gpupolicy.model import Proposal, SharingSpec, SharingStrategy, Toleration

ANNOTATION_POLICY = "gpu.kubeon.io/policy"
ANNOTATION_REWRITTEN_FROM = "gpu.kubeon.io/rewritten-from"
ANNOTATION_GPU_MEMORY = "gpu.kubeon.io/gpu-memory"
SKIP_KEY = "gpu.kubeon.io/skip"
CONTAINER_LISTS = ("initContainers", "containers")
OTHER_GPU_PREFIXES = ("amd.com/gpu", "gpu.intel.com/")


_GPU_NAMES = frozenset({GPU_RESOURCE, SHARED_GPU_RESOURCE})
_GPU_PREFIXES = (MIG_RESOURCE_PREFIX, *OTHER_GPU_PREFIXES)


def is_gpu_resource(name: str) -> bool:
    """Whole GPUs, time-sliced shares, MIG slices (and other vendors' GPUs, for guardrails)."""
    return name in _GPU_NAMES or name.startswith(_GPU_PREFIXES)


def is_sliced_resource(name: str) -> bool:
    return name == SHARED_GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def quantity_count(value: Any) -> float:
    """A resource count as a number; unparsable counts are treated as 0 (the API server refuses them)."""
    if (isinstance(value, str) and len(value) <= 64) or (type(value) is int and -10**18 < value < 10**18):
        return _text_count(value)
    return _count(value)


@lru_cache(maxsize=4096, typed=True)
def _text_count(text: str | int) -> float:
    """Counts as written ("1", 8): a cluster repeats a few."""
    return _count(text)


def _count(value: Any) -> float:
    try:
        return float(parse_quantity(value))
    except (QuantityError, TypeError, ValueError):
        return 0.0


def container_gpu_resources(container: Mapping[str, Any]) -> dict[str, float]:
    """GPU resources of one container: limits win, requests fill in (extended resources need equal)."""
    resources = container.get("resources") or {}
    found: dict[str, float] = {}
    for section in ("requests", "limits"):
        for name, value in (resources.get(section) or {}).items():
            name = name if type(name) is str else str(name)  # YAML keys may be numbers (dry-run)
            if is_gpu_resource(name):
                found[name] = quantity_count(value)
    return found


class GpuScan(NamedTuple):
    """Each container's GPU resources (`container_gpu_resources`), read once per review: the scope
    check, the sharing plan and the guardrail all read them."""

    init: list[tuple[dict[str, Any], dict[str, float]]]
    main: list[tuple[dict[str, Any], dict[str, float]]]

    def totals(self) -> dict[str, float]:
        """GPU devices the pod holds at once, per resource, as upstream's PodRequests counts them
        (k8s.io/component-helpers resource): the containers and every native sidecar (an init container
        with `restartPolicy: Always`, which runs for the pod's life) together, or the peak of the init
        phase (an init container beside the sidecars started before it), whichever is larger."""
        total: dict[str, float] = {}
        for _, gpus in self.main:
            for name, count in gpus.items():
                total[name] = total.get(name, 0.0) + count
        sidecars: dict[str, float] = {}
        peak: dict[str, float] = {}
        for container, gpus in self.init:
            if container.get("restartPolicy") == "Always":
                for name, count in gpus.items():
                    sidecars[name] = sidecars.get(name, 0.0) + count
                    total[name] = total.get(name, 0.0) + count
                during = dict(sidecars)
            else:
                during = dict(sidecars)
                for name, count in gpus.items():
                    during[name] = during.get(name, 0.0) + count
            for name, count in during.items():
                peak[name] = max(peak.get(name, 0.0), count)
        for name, count in peak.items():
            total[name] = max(total.get(name, 0.0), count)
        return total


def scan_gpus(pod: Mapping[str, Any]) -> GpuScan:
    spec = pod.get("spec") or {}
    init, main = ([(c, container_gpu_resources(c)) for c in spec.get(key) or [] if isinstance(c, dict)]
                  for key in CONTAINER_LISTS)
    return GpuScan(init, main)


def has_skip_marker(pod: Mapping[str, Any]) -> bool:
    metadata = pod.get("metadata") or {}
    for key in ("labels", "annotations"):
        marked = (metadata.get(key) or {}).get(SKIP_KEY)
        if marked is not None and str(marked).lower() == "true":
            return True
    return False


@dataclass(frozen=True)
class MigChoice:
    product: str  # the product(s) it was chosen on, for the decision's reason
    profile: MigProfile
    memory_mib: int
    pin: str | None = None  # a `nvidia.com/gpu.product` value the pod must be pinned to, when needed


@dataclass(frozen=True)
class SharingPlan:
    """What a sharing policy would do to a pod: a target resource, or why not (`skip_reason`)."""

    resource: str | None
    containers: tuple[str, ...] = ()
    skip_reason: str = ""
    warning: str = ""
    detail: str = ""
    node_selector: Mapping[str, str] | None = None  # added to spec.nodeSelector with the resource
    wanted: str = ""  # the slice it would get once a node offers it (left on whole GPUs for now)


def candidate_products(sharing: SharingSpec, view: ClusterView) -> list[GpuProduct]:
    """gpuModels when given, else MIG-capable products on nodes, else every MIG-capable product."""
    if sharing.gpu_models:
        chosen = [view.catalog.product(m) for m in sharing.gpu_models]
        return [p for p in chosen if p is not None and p.mig_capable]
    on_nodes = [p for p in view.node_products() if p.mig_capable]
    return on_nodes or [p for p in view.catalog.products if p.mig_capable]


def _named(names: frozenset[str], product: GpuProduct, view: ClusterView) -> bool:
    return any(view.catalog.product(name) == product for name in names)


def landing_products(pinned: frozenset[str] | None, sharing: SharingSpec, view: ClusterView,
                     type_fit_models: frozenset[str] | None) -> tuple[list[GpuProduct], str, bool]:
    """The MIG-capable products a pod pinning itself to `pinned` (`pod_allowed_products`) may land on,
    why none when the list is empty, and whether the list is known (False: no node, gpuModels, pin or
    typeFit says; every catalog product).

    The policy's candidates (gpuModels, else what the nodes have), narrowed by
    the pod's own nodeSelector / required node affinity on the product label,
    by an enforced typeFit policy, and by the nodes that exist (when any GPU
    node is known): a slice no such node offers would leave the pod Pending.
    """
    # per view: the pod matters only through `pinned`
    products, why, known = view.remembered(("landing", pinned, type_fit_models), sharing,
                                           lambda: _landing_products(sharing, view, pinned, type_fit_models))
    return list(products), why, known


def _landing_products(sharing: SharingSpec, view: ClusterView, pinned: frozenset[str] | None,
                      type_fit_models: frozenset[str] | None) -> tuple[list[GpuProduct], str, bool]:
    products = candidate_products(sharing, view)
    on_nodes = view.node_products()
    known = bool(sharing.gpu_models or pinned is not None or type_fit_models is not None or on_nodes)
    if pinned is not None:
        products = [p for p in products if _named(pinned, p, view)]
        if not products:
            return [], f"the pod asks for {', '.join(sorted(pinned))}, no MIG-capable product allowed here", known
    if type_fit_models is not None:
        products = [p for p in products if _named(type_fit_models, p, view)]
        if not products:
            return [], "the typeFit policy allows no MIG-capable product the pod may use", known
    if on_nodes:
        products = [p for p in products if p in on_nodes]
        if not products:
            return [], "no node has a MIG-capable product the pod may use", known
    return products, "", known


def _key(profile: MigProfile, memory: int, view: ClusterView) -> tuple[bool, int, int, int, str]:
    """Offered first (ClusterView.offers), then smallest: memory slices, compute slices, real memory."""
    return (not view.offers(profile.resource_name), profile.memory_slices, profile.compute_slices, memory,
            profile.name)


def _fits(profile: MigProfile, memory: int, need_mib: float | None, fixed: str | None) -> bool:
    if profile.media_extensions and fixed is None:
        return False
    if fixed is not None:
        return profile.name == fixed
    return need_mib is not None and memory >= need_mib


def choose_mig_profile(need_mib: float | None, products: list[GpuProduct], view: ClusterView,
                       fixed: str | None = None, pin: bool = True) -> MigChoice | None:
    """The smallest profile (memory slices, compute slices, real memory; one a node offers first) that
    every product has and that holds `need_mib` on each (or the `fixed` one); else the best single
    product's, pinned.

    Media-extension profiles are skipped unless fixed by the policy. Pin: the
    product label value as the nodes offering the profile spell it (`_pin`), else the
    catalog name; `pin=False` (the products are not known, only the catalog):
    the best single product's profile, unpinned. Memoised per view (ClusterView.view_answers): the same
    policy's pods ask the same question, and it was 0.33 ms of a 0.75 ms admission.
    """
    if not products:
        return None
    key = ("mig-choice", need_mib, tuple(p.product for p in products), fixed, pin)
    memo = view.view_answers
    if key not in memo:
        memo[key] = _choose_mig_profile(need_mib, products, view, fixed, pin)
    result: MigChoice | None = memo[key]
    return result


def _choose_mig_profile(need_mib: float | None, products: list[GpuProduct], view: ClusterView,
                        fixed: str | None, pin: bool) -> MigChoice | None:
    """choose_mig_profile without the per-view memo: depends on the view, never on the pod."""
    best: tuple[tuple[bool, int, int, int, str], MigChoice] | None = None
    for profile in products[0].profiles:
        offers = [p.profile(profile.name) for p in products]
        if any(o is None for o in offers):
            continue
        memory = min(profile_memory_mib(o, view.labels_for_product(p))
                     for o, p in zip(offers, products, strict=True) if o is not None)
        if _fits(profile, memory, need_mib, fixed) and (best is None or _key(profile, memory, view) < best[0]):
            best = (_key(profile, memory, view), MigChoice(", ".join(p.product for p in products), profile, memory))
    if best is not None:
        return best[1]
    for product in products:
        labels = view.labels_for_product(product)
        for profile in product.profiles:
            memory = profile_memory_mib(profile, labels)
            if _fits(profile, memory, need_mib, fixed) and (best is None or _key(profile, memory, view) < best[0]):
                pinned = _pin(product, profile, view) if pin else None
                best = (_key(profile, memory, view), MigChoice(product.product, profile, memory, pinned))
    return best[1] if best else None


def _pin(product: GpuProduct, profile: MigProfile, view: ClusterView) -> str:
    """The `nvidia.com/gpu.product` value to pin to: as a node of `product` that offers the profile spells
    it, else the catalog's name (what GFD prints on a whole-GPU or mixed-MIG node). Not the first node of the
    product whatever it offers: GFD suffixes `-SHARED` on a time-sliced node and `-MIG-<profile>` under the
    single strategy, and a pin to such a label value reached only nodes without the slice."""
    for node in view.offering(profile.resource_name):
        if node.gpu_product and view.catalog.product(node.gpu_product) == product:
            return node.gpu_product
    return product.product


def declared_need_mib(text: str | None, sharing: SharingSpec) -> tuple[float | None, str]:
    """The pod's GPU memory need: its annotation's `text`, else the policy's gpuMemory; with where it
    came from.

    Raises QuantityError (naming the annotation) when the annotation is not a quantity.
    """
    if text:
        try:
            return parse_bytes_mib(text), f"annotation {text}"
        except QuantityError as exc:
            raise QuantityError(f"{ANNOTATION_GPU_MEMORY} {text[:40]!r} is not a memory quantity "
                                f"(e.g. 20Gi): {exc}") from exc
    if sharing.gpu_memory:
        return parse_bytes_mib(sharing.gpu_memory), f"policy gpuMemory {sharing.gpu_memory}"
    return None, ""


def time_slice_guarantee_mib(sharing: SharingSpec, view: ClusterView) -> tuple[float, str] | None:
    """The GPU memory a time-sliced share is sure to have: GPU memory / replicas, smallest GPU.

    Time slices share one GPU's memory with no isolation, so a pod can count
    only on its fraction. Replicas: what the time-sliced nodes run
    (ClusterView.shared_replicas), else the policy's (default 2). None when no
    GPU product is known.
    """
    products = ([p for p in (view.catalog.product(m) for m in sharing.gpu_models) if p is not None]
                if sharing.gpu_models else view.node_products())
    if not products:
        return None
    replicas = view.shared_replicas() or sharing.time_slicing_replicas
    smallest = min(products, key=lambda p: p.memory_mib)
    return smallest.memory_mib / replicas, f"{smallest.product} {smallest.memory_mib}Mi / {replicas} replicas"


def _time_slicing_plan(sharing: SharingSpec, view: ClusterView, need: float | None,
                       source: str) -> SharingPlan:
    guarantee = time_slice_guarantee_mib(sharing, view) if need is not None else None
    if need is not None and guarantee is not None and need > guarantee[0]:
        why = f"declares {need:.0f}Mi ({source}), a time-sliced share guarantees {guarantee[0]:.0f}Mi"
        return SharingPlan(None, skip_reason=f"{why} ({guarantee[1]})",
                           warning=f"{why}: pod left on a whole GPU")
    return SharingPlan(SHARED_GPU_RESOURCE, detail="time-sliced share")


def plan_sharing(pod: Mapping[str, Any], sharing: SharingSpec, view: ClusterView,
                 right_sized: Proposal | None = None,
                 type_fit_models: frozenset[str] | None = None, scan: GpuScan | None = None) -> SharingPlan:
    """The target resource for a pod under a sharing policy, if some node offers it (`_plan_sharing`).

    A pod is rewritten only to a resource that a node offers, was told to offer
    (GPU Operator labels) or the layout planner decided to offer (ClusterView.offers);
    otherwise it stays on whole GPUs with a warning, marked with the slice it
    wanted so the planner counts it. A time-sliced share is 1/replicas of a GPU
    with the replicas the nodes run (from the time-slicing ConfigMap).

    Past the pod's containers, the plan depends on the pod only through its
    declared GPU memory (the annotation's text) and the products it pins
    itself to; it is worked out once per view for those
    (`ClusterView.remembered`), as the pods of many workloads ask the same
    question, and the names of the containers asking for one GPU are put in
    after. `scan`: the pod's `scan_gpus`, when the caller has it.
    """
    scanned = _single_gpu_containers(scan if scan is not None else scan_gpus(pod))
    if isinstance(scanned, SharingPlan):
        return scanned
    if right_sized is not None and right_sized.resource and is_sliced_resource(right_sized.resource):
        return _offered(SharingPlan(right_sized.resource, scanned, detail=f"right-sized from measured peak "
                                                                          f"(proposal {right_sized.id} Applied)"),
                        sharing, view)
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GPU_MEMORY)
    need_text = str(text) if text else None
    pinned = pod_allowed_products(pod) if sharing.strategy != SharingStrategy.TIME_SLICING else None
    if len(view.view_answers) >= PLAN_MEMO_LIMIT:  # pods declaring ever new needs: no more memo entries
        plan = _offered(_plan_sharing(need_text, pinned, sharing, view, type_fit_models), sharing, view)
    else:
        key = ("sharing-plan", need_text, pinned, type_fit_models)
        plan = view.remembered(key, sharing, lambda: _offered(
            _plan_sharing(need_text, pinned, sharing, view, type_fit_models), sharing, view))
    if plan.resource is None:
        return plan
    return SharingPlan(plan.resource, scanned, skip_reason=plan.skip_reason, warning=plan.warning,
                       detail=plan.detail, node_selector=plan.node_selector, wanted=plan.wanted)


PLAN_MEMO_LIMIT = 4096  # per-view memo entries past which sharing plans are worked out every time


def _offered(plan: SharingPlan, sharing: SharingSpec, view: ClusterView) -> SharingPlan:
    """`plan` if a node offers its resource; else stay on whole GPUs, marked with the slice wanted."""
    if plan.resource is None:
        return plan
    if not view.offers(plan.resource):
        return SharingPlan(None, skip_reason=f"no node offers {plan.resource} yet", wanted=plan.resource,
                           warning=f"no node offers {plan.resource} yet: pod left on whole GPUs")
    if plan.resource == SHARED_GPU_RESOURCE:
        replicas = view.shared_replicas() or sharing.time_slicing_replicas
        return replace(plan, detail=f"{plan.detail} (1/{replicas} of a GPU)")
    return plan


def _single_gpu_containers(scan: GpuScan) -> tuple[str, ...] | SharingPlan:
    """The names of the containers asking for exactly one whole GPU, or why the pod is not a candidate."""
    single: list[str] = []
    multi: list[str] = []
    for container, gpus in (*scan.init, *scan.main):
        if any(is_sliced_resource(name) for name in gpus):
            return SharingPlan(None, skip_reason="already asks for a MIG slice or a shared GPU")
        count = gpus.get(GPU_RESOURCE, 0.0)
        if count == 1:
            single.append(str(container.get("name", "")))
        elif count > 1:
            multi.append(str(container.get("name", "")))
    if not single:
        if multi:
            return SharingPlan(None, skip_reason=f"container {multi[0]} asks for more than one GPU")
        return SharingPlan(None, skip_reason="no container asks for nvidia.com/gpu: 1")
    return tuple(single)


def _plan_sharing(need_text: str | None, pinned: frozenset[str] | None, sharing: SharingSpec, view: ClusterView,
                  type_fit_models: frozenset[str] | None = None) -> SharingPlan:
    """Decide the target resource for a pod under a sharing policy (no change made here), from what the
    plan reads of the pod: the gpu-memory annotation's text and the products it pins
    (`pod_allowed_products`); `plan_sharing` names the containers. `type_fit_models`: the products an
    enforced typeFit policy allows the pod (None: no such policy). (A right-sizing proposal's resource
    wins over all of this: `plan_sharing`.)"""
    try:
        need, source = declared_need_mib(need_text, sharing)
    except QuantityError as exc:
        return SharingPlan(None, skip_reason=str(exc), warning=f"{exc}: pod left unchanged")
    if sharing.strategy == SharingStrategy.TIME_SLICING:
        return _time_slicing_plan(sharing, view, need, source)
    fixed = None if sharing.mig_profile == "auto" else normalise_profile_name(sharing.mig_profile)
    if fixed is None and need is None:
        return SharingPlan(None, skip_reason="no GPU memory need (gpu.kubeon.io/gpu-memory or gpuMemory)",
                           warning="no GPU memory need declared: set gpu.kubeon.io/gpu-memory")
    products, why_none, known = landing_products(pinned, sharing, view, type_fit_models)
    if not products:
        return SharingPlan(None, skip_reason=why_none, warning=f"{why_none}: pod left on whole GPUs")
    choice = choose_mig_profile(need, products, view, fixed, pin=known)
    if choice is None:
        what = f"profile {fixed} is offered" if fixed else f"MIG profile holds {need:.0f}Mi"
        where = ", ".join(p.product for p in products)
        return SharingPlan(None, skip_reason=f"no {what} on {where}",
                           warning=f"no {what} on the GPUs the pod may use: pod left on whole GPUs")
    if fixed is not None:
        detail = f"profile {fixed} (fixed by policy) on {choice.product}"
    else:
        detail = (f"{choice.profile.name} on {choice.product} holds {choice.memory_mib}Mi "
                  f">= {need:.0f}Mi ({source})")
    selector = None
    if choice.pin is not None:
        selector = {PRODUCT_LABEL: choice.pin}
        detail += f"; pinned to {PRODUCT_LABEL}={choice.pin} (no one profile fits every GPU it may use)"
    return SharingPlan(choice.profile.resource_name, detail=detail, node_selector=selector)


def rewritten_from_json(original: Mapping[str, Any]) -> str:
    """Compact JSON, keys sorted: orjson's bytes when they are ASCII (then the same as json.dumps'),
    else json.dumps, which escapes other characters as \\uXXXX."""
    try:
        data = orjson.dumps(original, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        data = b"\x80"
    if data.isascii():
        return data.decode()
    return json.dumps(original, sort_keys=True, separators=(",", ":"))


def toleration_dict(toleration: Toleration) -> dict[str, Any]:
    return toleration.model_dump(by_alias=True, exclude_none=True, mode="json")


def would_add_tolerations(pod: Mapping[str, Any], wanted: Iterable[Mapping[str, Any]]) -> bool:
    """Whether `PodWrites.tolerate(wanted)` would add something (the pod is not touched)."""
    spec = pod.get("spec")
    current = spec.get("tolerations") if isinstance(spec, dict) else None
    existing = current if isinstance(current, list) else []
    return any(dict(toleration) not in existing for toleration in wanted)


def resource_toleration(resource: str) -> dict[str, Any]:
    """What ExtendedResourceToleration would add for a resource (added here so every cluster gets it)."""
    return {"key": resource, "operator": "Exists", "effect": "NoSchedule"}


def would_set_scheduler(pod: Mapping[str, Any], scheduler: str) -> bool:
    """Whether `PodWrites.schedule_with(scheduler)` would set it (the pod is not touched)."""
    spec = pod.get("spec")
    current = spec.get("schedulerName") if isinstance(spec, dict) else None
    return current in (None, "", "default-scheduler") and current != scheduler
