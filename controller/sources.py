"""Where the controller reads time and GPU metrics from: two small interfaces, their real implementations.

Kept apart from `controller/context.py` so that the frame's services (the
recorder, the leader elector, the Prometheus source) can name them without
importing the context that holds those services.
"""

from __future__ import annotations

import time
from typing import Protocol

from gpupolicy.scaling.metrics import Sample, Series


class MetricsSource(Protocol):
    """Where GPU metrics come from (controller/metrics_source.py: Prometheus; tests: scripted)."""

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        """Range query; `start`/`end` are unix seconds, `step` seconds. Empty list when no data."""
        ...

    def query(self, promql: str) -> list[Sample]:
        """Instant query at the source's now. Empty list when no data."""
        ...


class Clock(Protocol):
    """Wall-clock seconds since the epoch (a fake in tests where time matters)."""

    def now(self) -> float: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()
