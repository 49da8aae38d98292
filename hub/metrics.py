"""The hub's own Prometheus metrics, read from its database at each scrape.

A collector, not counters in process memory: `hub serve` runs several gunicorn
workers, and a scrape reaches one of them; the database is what they share, so
every worker answers the same figures. Served at `/metrics` to the admin
credential (bearer), since the figures name clusters and their cost.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hub import summaries
from hub.store import Hub

STATES = ("connected", "disconnected", "never polled", "not polling")


class HubCollector(Collector):
    """Clusters by state, and each cluster's newest summary figures."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self.hub.clusters()
        states = GaugeMetricFamily("kubeon_hub_clusters", "Clusters by connection state", labels=["state"])
        for state in STATES:
            states.add_metric([state], sum(1 for r in rows if r.state == state))
        yield states
        families = {
            "gpus": GaugeMetricFamily("kubeon_hub_cluster_gpus", "GPUs in the newest summary", labels=["cluster"]),
            "allocated": GaugeMetricFamily("kubeon_hub_cluster_gpus_allocated", "GPUs held by pods",
                                           labels=["cluster"]),
            "idle": GaugeMetricFamily("kubeon_hub_cluster_gpus_idle", "GPUs idle by DCGM (clusters with Prometheus)",
                                      labels=["cluster"]),
            "pending": GaugeMetricFamily("kubeon_hub_cluster_pending_gpu_pods", "GPU pods waiting for a node",
                                         labels=["cluster"]),
            "cost": GaugeMetricFamily("kubeon_hub_cluster_cost_per_hour", "Estimated cost of the GPU nodes per hour",
                                      labels=["cluster"]),
            "savings": GaugeMetricFamily("kubeon_hub_cluster_savings_per_hour",
                                         "Estimated savings per hour of every action reported", labels=["cluster"]),
            "last": GaugeMetricFamily("kubeon_hub_cluster_last_summary_timestamp_seconds",
                                      "When the newest summary was made", labels=["cluster"]),
        }
        for row in rows:
            points = summaries.history(self.hub, row.name, limit=1)
            if not points:
                continue
            p = points[-1]
            for key, value in (("gpus", p.gpus), ("allocated", p.allocated), ("idle", p.idle),
                               ("pending", p.pending), ("cost", p.cost_per_hour), ("savings", p.savings_rate),
                               ("last", p.time)):
                if value is not None:
                    families[key].add_metric([row.name], float(value))
        yield from families.values()


def exposition(hub: Hub) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(hub))
    return generate_latest(registry)
