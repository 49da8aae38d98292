"""Timed pods for the capacity benchmark: an openb pod list with arrivals and run times.

Every row is a request (pod_phase ignored, no resampling): it arrives at
`creation_time / F` and, once bound, runs `max(1, deletion_time -
creation_time)` seconds (durations are kept at every compression). Errors
name the file, the row and the column (the CLI prints one line, exit 2).

Bounds (so the benchmark's loop ends, and soon): times are finite, from 0
to `MAX_TIME_SECONDS` (10^10 s, past any Unix time of this century); a
run lasts at most `MAX_RUN_SECONDS` (10^8 s, about 3 years: a node that
Karpenter expires every 30 days is replaced about 40 times under it); F
is from `MIN_COMPRESS` to `MAX_COMPRESS`, so arrivals stay below 10^13 s,
where a float still counts the 10 s loops exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gpupolicy.capacity.csvtable import read_rows
from gpupolicy.packing.nodemodel import PodDemand
from simulator.trace import TraceError, load_pods

TIME_COLUMNS = ("creation_time", "deletion_time")
MAX_TIME_SECONDS = 1e10
MAX_RUN_SECONDS = 1e8
MIN_COMPRESS = 1e-3
MAX_COMPRESS = 1e6


@dataclass(frozen=True)
class TimedPod:
    """One pod request: its demand, when it arrives and how long it runs once bound (seconds)."""

    key: str
    demand: PodDemand
    arrival: float
    duration: float


def compress_problem(compress: float) -> str | None:
    """Why `compress` cannot be used (a sentence naming --compress), or None."""
    if not MIN_COMPRESS <= compress <= MAX_COMPRESS:  # NaN fails too
        return f"--compress must be positive, from {MIN_COMPRESS:g} to {MAX_COMPRESS:g}, got {compress}"
    return None


def load_timed_pods(path: str | Path, compress: float) -> list[TimedPod]:
    """The pods of an openb pod list in file order, arrivals compressed by `compress`."""
    problem = compress_problem(compress)
    if problem:
        raise TraceError(problem)
    p = Path(path)
    demands = load_pods(p)
    try:
        rows = read_rows(p, TIME_COLUMNS)
    except ValueError as exc:  # the capacity benchmark needs the times the plain replay ignores
        raise TraceError(str(exc)) from None
    out = []
    seen: set[str] = set()
    for line, (row, demand) in enumerate(zip(rows, demands, strict=True), start=2):
        times = []
        for column in TIME_COLUMNS:
            text = (row.get(column) or "").strip()
            try:
                value = float(text)
            except ValueError:
                raise TraceError(f"{p}:{line}: column {column!r} is not a number: {text[:40]!r}") from None
            if not math.isfinite(value):
                raise TraceError(f"{p}:{line}: column {column!r} is not a finite number: {text[:40]!r}")
            if value < 0:
                raise TraceError(f"{p}:{line}: column {column!r} is negative: {text[:40]}")
            if value > MAX_TIME_SECONDS:
                raise TraceError(f"{p}:{line}: column {column!r} is above {MAX_TIME_SECONDS:g} s: {text[:40]}")
            times.append(value)
        if times[1] - times[0] > MAX_RUN_SECONDS:
            raise TraceError(f"{p}:{line}: column 'deletion_time' is more than {MAX_RUN_SECONDS:g} s after "
                             f"creation_time: {times[1] - times[0]:g} s")
        if demand.name in seen:
            raise TraceError(f"{p}:{line}: column 'name' repeats {demand.name!r}")
        seen.add(demand.name)
        out.append(TimedPod(demand.name, demand, times[0] / compress, max(1.0, times[1] - times[0])))
    return out
