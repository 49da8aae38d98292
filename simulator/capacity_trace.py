"""Timed pods for the capacity benchmark: an openb pod list with arrivals and run times.

Every row is a request (pod_phase ignored, no resampling): it arrives at
`creation_time / F` and, once bound, runs `max(1, deletion_time -
creation_time)` seconds (durations are kept at every compression). Errors
name the file, the row and the column (the CLI prints one line, exit 2).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gpupolicy.packing.nodemodel import PodDemand
from simulator.trace import TraceError, load_pods

TIME_COLUMNS = ("creation_time", "deletion_time")


@dataclass(frozen=True)
class TimedPod:
    """One pod request: its demand, when it arrives and how long it runs once bound (seconds)."""

    key: str
    demand: PodDemand
    arrival: float
    duration: float


def load_timed_pods(path: str | Path, compress: float) -> list[TimedPod]:
    """The pods of an openb pod list in file order, arrivals compressed by `compress`."""
    if not compress > 0:
        raise TraceError(f"--compress must be positive, got {compress}")
    p = Path(path)
    demands = load_pods(p)
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in TIME_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{p}: missing column {missing[0]!r} (the capacity benchmark needs "
                             f"{', '.join(TIME_COLUMNS)})")
        rows = list(reader)
    out = []
    seen: set[str] = set()
    for line, (row, demand) in enumerate(zip(rows, demands, strict=True), start=2):
        times = []
        for column in TIME_COLUMNS:
            text = (row.get(column) or "").strip()
            try:
                value = float(text)
            except ValueError:
                raise TraceError(f"{p}:{line}: column {column!r} is not a number: {text!r}") from None
            if value < 0:
                raise TraceError(f"{p}:{line}: column {column!r} is negative: {text}")
            times.append(value)
        if demand.name in seen:
            raise TraceError(f"{p}:{line}: column 'name' repeats {demand.name!r}")
        seen.add(demand.name)
        out.append(TimedPod(demand.name, demand, times[0] / compress, max(1.0, times[1] - times[0])))
    return out
