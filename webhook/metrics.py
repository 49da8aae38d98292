"""Prometheus metrics of the webhook's decisions, by policy, mode and action.

Requests and latency come from serving.metrics.instrument (same registry).

Collectors live on a registry passed in (one per app), so tests can build
several apps in one process; labels are bounded (paths, status codes, the
cluster's policy names, the core's closed Mode and Action enums).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from gpupolicy.admission.mutate import Action, Decision
from gpupolicy.model import Mode
from serving.tally import TALLY


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "kubeon_webhook_decisions_total", "Admission decisions by policy, mode and action.",
            ["policy", "mode", "action", "applied"], registry=registry)
        self.errors = Counter(
            "kubeon_webhook_internal_errors_total",
            "Requests answered allowed-unchanged because the decision core raised.", ["path"],
            registry=registry)
        self._children: dict[tuple[str, Mode, Action, bool], Any] = {}

    def children(self, decisions: list[Decision]) -> tuple[Any, ...]:
        """The labelled counters `decisions` increment, looked up once per label set (`.labels()` costs
        more than the increment; the label values are bounded, see above). webhook.app keeps them with
        a remembered answer and `count`s them for every request it answers."""
        found = []
        for d in decisions:
            key = (d.policy, d.mode, d.action, d.applied)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self.decisions.labels(d.policy, str(d.mode), str(d.action),
                                                                    str(d.applied).lower())
            found.append(child)
        return tuple(found)

    @staticmethod
    def count(children: tuple[Any, ...]) -> None:
        TALLY.count(children)
