"""Prometheus metrics of the webhook's decisions, by policy, mode and action.

Requests and latency come from serving.metrics.instrument (same registry).

Collectors live on a registry passed in (one per app), so tests can build
several apps in one process; labels are bounded (paths, status codes, the
cluster's policy names, the core's closed Mode and Action enums).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from gpupolicy.admission.mutate import Decision


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

    def record(self, decisions: list[Decision]) -> None:
        for d in decisions:
            self.decisions.labels(d.policy, str(d.mode), str(d.action), str(d.applied).lower()).inc()
