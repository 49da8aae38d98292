"""Right-sizing: what a whole-GPU workload really needs, from its GPU memory and utilisation history. Pure.

For a Deployment or StatefulSet that asks `nvidia.com/gpu: 1`, the controller
queries the DCGM exporter's series for the workload's pods over the policy's
window (spec.sharing.window, default 7d) and hands them here:

- memory: `DCGM_FI_DEV_FB_USED` (MiB), per-step maxima so no peak between
  steps is lost; sized on the peak plus headroom (spec.sharing.headroomPercent,
  default 20%);
- utilisation: `DCGM_FI_DEV_GPU_UTIL` (%), or `DCGM_FI_PROF_GR_ENGINE_ACTIVE`
  x 100 where the GPU is a MIG slice (GPU_UTIL is not reported there); the
  chosen slice's compute share must cover the p95 (no headroom: utilisation
  is the fraction of time a kernel ran, already an upper bound on need).

MIG: the smallest profile of the workload's GPU product whose real memory
(catalog `-lgip` figures or the node's GFD `.memory` label, never the name)
holds the need, excluding the whole-GPU profile. Time-slicing: the policy's
replicas per GPU when need x replicas fits the GPU's memory and compute.

No data for the whole window means no proposal (the reason says what is
missing): a workload that started yesterday has no weekly peak yet.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gpupolicy.catalog import (
    GIB,
    GPU_RESOURCE,
    SHARED_GPU_RESOURCE,
    Catalog,
    GpuProduct,
    MigProfile,
    normalise_profile_name,
    profile_memory_mib,
)
from gpupolicy.k8s.quantity import parse_duration
from gpupolicy.model import SharingSpec, SharingStrategy
from gpupolicy.scaling.metrics import Series

HOURS_PER_MONTH = 730.0
MEMORY_METRIC = "DCGM_FI_DEV_FB_USED"
UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
MIG_UTIL_METRIC = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GROUP_LABELS = "namespace, pod, Hostname, hostname, modelName"
POINTS_PER_WINDOW = 720


# -- queries ---------------------------------------------------------------------
def pod_name_regex(kind: str, name: str) -> str:
    """RE2 for the pods a workload ever had: `<deploy>-<rs hash>-<suffix>` or `<sts>-<ordinal>`."""
    base = re.escape(name)
    if kind == "StatefulSet":
        return f"{base}-[0-9]+"
    return f"{base}-[a-z0-9]+-[a-z0-9]+"


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def query_step(window_seconds: float) -> float:
    """Range-query step for a window: about 720 points, never under a minute."""
    return float(max(60, math.ceil(window_seconds / POINTS_PER_WINDOW / 60) * 60))


@dataclass(frozen=True)
class UsageQueries:
    memory: str
    util: str
    mig_util: str


def usage_queries(kind: str, namespace: str, name: str, step: float) -> UsageQueries:
    """PromQL for a workload's memory peaks and utilisation, one series per pod (and host)."""
    matcher = f'namespace="{_promql_string(namespace)}",pod=~"{_promql_string(pod_name_regex(kind, name))}"'
    rng = f"[{int(step)}s]"
    return UsageQueries(
        memory=f"max by ({GROUP_LABELS}) (max_over_time({MEMORY_METRIC}{{{matcher}}}{rng}))",
        util=f"max by ({GROUP_LABELS}) (avg_over_time({UTIL_METRIC}{{{matcher}}}{rng}))",
        mig_util=f"max by ({GROUP_LABELS}) (avg_over_time({MIG_UTIL_METRIC}{{{matcher}}}{rng})) * 100",
    )


# -- usage -------------------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    """A workload's GPU use over the window, or why it cannot be judged (`missing`)."""

    peak_memory_mib: float = 0.0
    p95_memory_mib: float = 0.0
    peak_util: float = 0.0
    p95_util: float = 0.0
    samples: int = 0
    model_name: str | None = None  # DCGM's modelName label ("NVIDIA A100-SXM4-80GB")
    hosts: tuple[str, ...] = ()
    missing: str | None = None

    @property
    def complete(self) -> bool:
        return self.missing is None


def coverage_gap(times: Iterable[float], start: float, end: float, step: float) -> str | None:
    """Why `times` do not cover [start, end] (None when they do). Tolerates a few missed steps."""
    ordered = sorted(set(times))
    if not ordered:
        return "no GPU metrics for the workload's pods in the window"
    tolerance = max(3 * step, 0.01 * (end - start))
    if ordered[0] > start + tolerance:
        return "metrics do not cover the start of the window yet (need the whole window)"
    if ordered[-1] < end - tolerance:
        return "no recent metrics (pods not running or not exported)"
    widest = max((b - a for a, b in itertools.pairwise(ordered)), default=0.0)
    if widest > tolerance:
        return "a gap in the metrics inside the window"
    return None


def summarise_usage(memory: list[Series], util: list[Series], start: float, end: float,
                    step: float) -> Usage:
    """Peaks and p95s pooled over the workload's pods (each value is one pod's GPU)."""
    mem_values = [v for s in memory for t, v in s.points if start <= t <= end and math.isfinite(v)]
    util_values = [v for s in util for t, v in s.points if start <= t <= end and math.isfinite(v)]
    missing = coverage_gap((t for s in memory for t, _ in s.points), start, end, step)
    if missing is None and not util_values:
        missing = "no GPU utilisation metrics for the workload's pods in the window"
    elif missing is None:
        gap = coverage_gap((t for s in util for t, _ in s.points), start, end, step)
        missing = f"utilisation: {gap}" if gap else None
    model = next((s.label("modelName") for s in memory + util if s.label("modelName")), None)
    hosts = sorted({h for s in memory + util if (h := s.label("Hostname", "hostname"))})
    if not mem_values:
        return Usage(missing=missing, model_name=model, hosts=tuple(hosts))
    return Usage(
        peak_memory_mib=float(max(mem_values)),
        p95_memory_mib=float(np.percentile(mem_values, 95)),
        peak_util=float(max(util_values, default=0.0)),
        p95_util=float(np.percentile(util_values, 95)) if util_values else 0.0,
        samples=len(mem_values),
        model_name=model,
        hosts=tuple(hosts),
        missing=missing,
    )


# -- sizing --------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """A whole-GPU workload as right-sizing sees it."""

    kind: str
    namespace: str
    name: str
    replicas: int
    product_label: str | None  # nvidia.com/gpu.product of its pods' nodes (or DCGM modelName)
    node_labels: Mapping[str, str] | None = None  # one of its nodes' labels (GFD .memory wins)

    @property
    def target(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Sizing:
    """The right size, or why there is none (`proposal` False, `reason` says why)."""

    proposal: bool
    reason: str
    action: str = ""
    resource: str = ""
    profile: MigProfile | None = None
    need_mib: float = 0.0
    gpu_hours_per_month: float = 0.0


def short_product(label: str) -> str:
    """`NVIDIA-A100-SXM4-80GB` -> `A100-80GB` for proposal text."""
    name = label.removeprefix("NVIDIA-").removeprefix("Tesla-")
    return re.sub(r"-(SXM\d?|PCIE|PCIe)(?=-|$)", "", name)


def product_label_from_model_name(model_name: str) -> str:
    """DCGM's `modelName` ("NVIDIA A100-SXM4-80GB") as GFD would label it."""
    return model_name.strip().replace(" ", "-")


def _headline(w: Workload, product: GpuProduct | None, usage: Usage) -> str:
    gpu = short_product(product.product) if product else (w.product_label or "unknown GPU")
    return (f"{GPU_RESOURCE}=1 ({gpu}, peak {usage.peak_memory_mib / GIB:.1f} GiB, "
            f"p95 util {usage.p95_util:.0f}%)")


def _mig_candidates(product: GpuProduct, spec: SharingSpec) -> list[MigProfile]:
    profiles = [p for p in product.profiles if not p.media_extensions and p.compute_slices < product.compute_slices]
    if spec.mig_profile != "auto":
        wanted = normalise_profile_name(spec.mig_profile)
        profiles = [p for p in profiles if p.name == wanted]
    return profiles


def size_workload(w: Workload, usage: Usage, spec: SharingSpec, catalog: Catalog) -> Sizing:
    """The proposal for one workload under a sharing spec. Pure."""
    window = spec.window
    if not usage.complete:
        return Sizing(False, f"{w.target}: no proposal, {usage.missing} (window {window})")
    label = w.product_label or (product_label_from_model_name(usage.model_name) if usage.model_name else None)
    product = catalog.product(label) if label else None
    if product is None:
        return Sizing(False, f"{w.target}: no proposal, GPU product {label or 'unknown'} is not in the catalog")
    if spec.gpu_models and not any(catalog.product(m) == product for m in spec.gpu_models):
        return Sizing(False, f"{w.target}: no proposal, {product.product} is not among the policy's gpuModels")
    need = usage.peak_memory_mib * (1 + spec.headroom_percent / 100)
    headline = _headline(w, product, usage)
    if spec.strategy is SharingStrategy.MIG:
        return _size_mig(w, usage, spec, product, need, headline)
    return _size_time_slice(w, usage, spec, product, need, headline)


def _size_mig(w: Workload, usage: Usage, spec: SharingSpec, product: GpuProduct, need: float,
              headline: str) -> Sizing:
    if not product.mig_capable:
        return Sizing(False, f"{w.target}: no proposal, {product.product} does not support MIG")
    fits = [
        p for p in _mig_candidates(product, spec)
        if profile_memory_mib(p, w.node_labels) >= need
        and p.compute_slices / product.compute_slices * 100 >= usage.p95_util
    ]
    if not fits:
        return Sizing(False, f"{w.target}: no proposal, {headline} needs "
                             f"{need / GIB:.1f} GiB with {spec.headroom_percent}% headroom: no smaller MIG "
                             f"profile fits", need_mib=need)
    best = min(fits, key=lambda p: (profile_memory_mib(p, w.node_labels), p.compute_slices, p.name))
    saved = w.replicas * (1 - best.compute_slices / product.compute_slices) * HOURS_PER_MONTH
    action = f"{GPU_RESOURCE}=1 → {best.resource_name}"
    reason = (f"{w.target}: {headline} → {best.resource_name} "
              f"({profile_memory_mib(best, w.node_labels) / GIB:.2f} GiB real, need {need / GIB:.1f} GiB "
              f"with {spec.headroom_percent}% headroom over {spec.window})")
    return Sizing(True, reason, action, best.resource_name, best, need, saved)


def _size_time_slice(w: Workload, usage: Usage, spec: SharingSpec, product: GpuProduct, need: float,
                     headline: str) -> Sizing:
    replicas = spec.time_slicing_replicas
    if need * replicas > product.memory_mib or usage.p95_util * replicas > 100:
        return Sizing(False, f"{w.target}: no proposal, {headline}: {replicas} time-sliced replicas "
                             f"would not fit its memory or compute", need_mib=need)
    saved = w.replicas * (1 - 1 / replicas) * HOURS_PER_MONTH
    action = f"{GPU_RESOURCE}=1 → {SHARED_GPU_RESOURCE}"
    reason = (f"{w.target}: {headline} → {SHARED_GPU_RESOURCE} (1/{replicas} of a GPU, need "
              f"{need / GIB:.1f} GiB with {spec.headroom_percent}% headroom over {spec.window})")
    return Sizing(True, reason, action, SHARED_GPU_RESOURCE, None, need, saved)


def window_seconds(spec: SharingSpec) -> float:
    return parse_duration(spec.window)


# -- which workloads ---------------------------------------------------------------------
def whole_gpu_request(template_spec: Mapping[str, object]) -> int:
    """nvidia.com/gpu the pod template asks for (sum over containers; limits win over requests)."""
    total = 0
    containers = template_spec.get("containers") or []
    if not isinstance(containers, list):
        return 0
    for container in containers:
        if not isinstance(container, Mapping):
            continue
        resources = container.get("resources") or {}
        if not isinstance(resources, Mapping):
            continue
        for part in ("limits", "requests"):
            values = resources.get(part) or {}
            if isinstance(values, Mapping) and GPU_RESOURCE in values:
                with contextlib.suppress(ValueError):
                    total += int(str(values[GPU_RESOURCE]))
                break
    return total
