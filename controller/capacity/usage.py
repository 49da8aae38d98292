"""GPU utilisation per node over the consolidation window, from dcgm-exporter's series in Prometheus.

One range query for every node: per step, the highest utilisation of any
GPU of the node (`DCGM_FI_DEV_GPU_UTIL`, or `DCGM_FI_PROF_GR_ENGINE_ACTIVE`
x 100 for MIG slices, which report no GPU_UTIL), each point the max of the
raw samples in its step (`max_over_time(..[step])`) so that a hole in the
samples is a missing point, as in controller/metrics_source.py. A node's
usage is the highest point in the window, and only when the window is
covered (first point within three steps of its start, no hole longer than
three steps, last point within three steps of now); otherwise None: not
known idle, never a candidate (gpupolicy/capacity/disruption/underused.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from controller.context import ControllerContext
from controller.metrics_source import HOST_LABELS, MAX_POINTS, MetricsError, _step_text, gpu_host
from controller.sources import MetricsSource

log = logging.getLogger(__name__)


@dataclass
class Usage:
    """Each node's highest GPU utilisation over one window (None: not known); `error` when the query failed."""

    by_node: dict[str, float | None]
    error: str = ""


def usage(ctx: ControllerContext, names: Sequence[str], window: float, step_seconds: float) -> Usage:
    """Each node's highest GPU utilisation over the last `window` seconds: the policy's own `for`, so the
    number its proposal shows ("GPU util 3% for 2h") is the peak over exactly that window."""
    if ctx.metrics is None or not ctx.prometheus_configured:
        return Usage(dict.fromkeys(names))
    now = ctx.clock.now()
    try:
        return Usage(node_usage(ctx.metrics, names, start=now - window, end=now, step=step_seconds))
    except MetricsError as exc:
        log.warning("capacity: GPU utilisation unavailable: %s", exc)
        return Usage(dict.fromkeys(names), str(exc)[:300])


def node_usage_query(step: float) -> str:
    by = ", ".join(HOST_LABELS)
    s = _step_text(step)
    return (f"max by ({by}) (max_over_time(DCGM_FI_DEV_GPU_UTIL[{s}]) or "
            f"(max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[{s}]) * 100))")


def covered(points: list[tuple[float, float]], start: float, end: float, step: float) -> bool:
    """The points cover [start, end] with no hole longer than three steps."""
    if not points:
        return False
    gap = 3 * step + 1e-6
    times = [t for t, _ in points]
    if times[0] - start > gap or end - times[-1] > gap:
        return False
    return all(b - a <= gap for a, b in pairwise(times))


def node_usage(source: MetricsSource, nodes: Iterable[str], *, start: float, end: float,
               step: float) -> dict[str, float | None]:
    """Highest GPU utilisation (%) per node over [start, end]; None where the window is not covered."""
    step = max(step, (end - start) / MAX_POINTS)
    merged: dict[str, dict[float, float]] = {}
    for series in source.query_range(node_usage_query(step), start, end, step):
        host = gpu_host(series.labels)
        if host is None:
            continue
        points = merged.setdefault(host, {})
        for t, v in series.points:
            points[t] = max(v, points.get(t, v))
    out: dict[str, float | None] = {}
    for node in nodes:
        found = sorted(merged.get(node, {}).items())
        out[node] = max(v for _, v in found) if covered(found, start, end, step) else None
    return out
