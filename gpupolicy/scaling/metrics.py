"""Metric values as the decision core sees them: label sets with points or one sample.

The controller's metrics source (Prometheus over HTTP) turns query answers into
these plain values so the core can size and judge idleness without knowing
where the numbers came from. Pure types, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Series:
    """One range-query result: a label set and its (unix seconds, value) points in time order."""

    labels: dict[str, str] = field(default_factory=dict)
    points: list[tuple[float, float]] = field(default_factory=list)

    def label(self, *names: str) -> str | None:
        """First present label among `names` (DCGM renames `Hostname` to `hostname`)."""
        for name in names:
            if name in self.labels:
                return self.labels[name]
        return None


@dataclass(frozen=True)
class Sample:
    """One instant-query result: a label set and its value."""

    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0

    def label(self, *names: str) -> str | None:
        """First present label among `names`."""
        for name in names:
            if name in self.labels:
                return self.labels[name]
        return None
