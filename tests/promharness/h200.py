"""Replays the real H200 NVML trace (vendor/gpu/h200-nvml-trace.csv) as DCGM series.

The trace samples utilisation every 0.5 s. dcgm-exporter's GPU_UTIL is the
share of the last sample period a kernel ran, so the replay serves the mean
of the trace readings in the last `period` seconds (1 s by default). Serving
raw readings instead would alias: in the bursty phase readings alternate
0 and ~100 every 0.5 s, and a 1 s scrape could see only the zeros.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from tests.promharness.exporter import Script

TRACE = Path(__file__).resolve().parents[2] / "vendor" / "gpu" / "h200-nvml-trace.csv"


@dataclass(frozen=True)
class Reading:
    t: float
    util: float
    mem_mib: float


def load_phase(phase: str, path: Path = TRACE) -> list[Reading]:
    """Readings of one phase (idle, busy, bursty, idle_after), times rebased to 0."""
    with path.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["phase"] == phase]
    if not rows:
        raise ValueError(f"phase {phase!r} not in {path}")
    t0 = float(rows[0]["t_s"])
    return [Reading(float(r["t_s"]) - t0, float(r["util_gpu_pct"]), float(r["mem_used_mib"])) for r in rows]


def replay(phase: str, origin: float, *, field: str = "util", period: float = 1.0) -> Script:
    """A script looping the phase from `origin`: the mean over the last `period` seconds."""
    readings = load_phase(phase)
    length = readings[-1].t + 0.5

    def script(t: float) -> float | None:
        at = (t - origin) % length
        window = [r for r in readings if at - period < r.t <= at]
        if not window:  # wrapped around the loop's start: take the nearest reading
            window = [min(readings, key=lambda r: abs(r.t - at))]
        values = [getattr(r, "util" if field == "util" else "mem_mib") for r in window]
        return sum(values) / len(values)

    return script
