"""Seed 002's GPU autoscaling chain on real components (issue 43), as one test.

DCGM utilisation (the exporter shim) in the real Prometheus -> real KEDA with the ScaledObject our
autoscale policy made -> kube-controller-manager's HPA -> pending pods -> real Karpenter GPU nodes
(KWOK) placed by our extender -> utilisation drops -> the HPA scales down -> our scale to zero parks
the workload -> our capacity controller removes the empty nodes -> a demand signal wakes it -> the
chain again. tests/cluster/chain.py runs it (and `python -m tests.cluster demo autoscaling`); here
each step is asserted in order, each actor's scale writes counted from kube-apiserver's audit log,
and the final state checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.cluster.chain import CHAIN_CLUSTER, Chain
from tests.promharness import DcgmExporter, PrometheusServer

CLUSTER = CHAIN_CLUSTER
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_the_autoscaling_chain_runs_twice_and_ends_at_zero(
        kube_cluster: Cluster, namespace: str, dcgm_exporter: DcgmExporter,
        prometheus_factory: Callable[..., PrometheusServer]) -> None:
    chain = Chain(kube_cluster, namespace, dcgm_exporter, prometheus_factory())
    try:
        result: dict[str, Any] = chain.run()
    finally:
        chain.close()
    once = ["utilisation rise to first new replica", "pending to node ready (all replicas placed)",
            "utilisation drop to HPA scale-down", "idle to parked at zero", "node empty to node gone"]
    assert [s["name"] for s in result["steps"]] == [
        "first replica ready on a new GPU node", *once, "wake to first ready pod", *once]
    assert result["final"] == {"replicas": 0, "gpu_nodes": 0, "cordoned_nodes": 0, "scaledobjects": [
        {"name": "kubeon-gpu-llm", "policy": f"{namespace}-autoscale", "managed_by": "kubeon-gpu-optimizer"}]}

    writes = result["writes"]
    assert set(writes) == {"hpa", "keda", "kubeon"}, writes
    assert all(w["code"] < 300 for actor in writes.values() for w in actor), writes
    # ours: one park and one wake per round, nothing else
    assert len(writes["kubeon"]) == 3, writes["kubeon"]
    # the HPA: up and down in each round, never while the workload is parked
    parked = [(a["at"], b["at"]) for a, b in zip(writes["kubeon"], writes["kubeon"][1:], strict=False)][:1]
    assert not [w for w in writes["hpa"] for lo, hi in parked if lo < w["at"] < hi], (writes, parked)
