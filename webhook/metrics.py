"""Prometheus metrics of the webhook: requests, latency, decisions by policy/mode/action.

Collectors live on a registry passed in (one per app), so tests can build
several apps in one process; labels are bounded (paths, status codes, the
cluster's policy names, the core's closed Mode and Action enums).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from gpupolicy.admission import Decision

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "kubeon_webhook_requests_total", "Webhook HTTP requests by path and status code.",
            ["path", "code"], registry=registry)
        self.latency = Histogram(
            "kubeon_webhook_request_duration_seconds", "Time to answer a webhook request.",
            ["path"], buckets=LATENCY_BUCKETS, registry=registry)
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
