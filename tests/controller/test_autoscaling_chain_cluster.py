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
from itertools import pairwise
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

    # Nothing fights over nodes: no GPU node goes while a replica waits for one, before and after (found: our
    # emptiness took a node Karpenter had just launched for a pending replica, before kube-scheduler bound it
    # there). A node whose removal began before the wake may finish going as the first woken replica appears.
    timeline = result["timeline"]
    gone_while_waiting = [(a, b) for a, b in pairwise(timeline)
                          if b["gpu_nodes"] < a["gpu_nodes"] and a["pending"] and b["pending"]]
    assert not gone_while_waiting, gone_while_waiting

    # Nothing fights: each actor's writes to the Deployment's scale (kube-apiserver's audit log), each
    # where it belongs and nowhere else.
    parks = [t for name, t in result["step_times"] if name == "idle to parked at zero"]
    at = {"parked 1": parks[0], "woken": dict(result["step_times"])["wake to first ready pod"], "parked 2": parks[1]}
    writes = result["writes"]
    assert set(writes) == {"hpa", "keda", "kubeon"}, writes
    # a write refused 409 Conflict (written against a resourceVersion another actor had changed)
    # changed nothing; any other refusal fails, and only accepted writes count below
    refused = {actor: [w for w in actor_writes if w["code"] != 200] for actor, actor_writes in writes.items()}
    assert all(w["code"] == 409 for ws in refused.values() for w in ws), refused
    writes = {actor: [w for w in actor_writes if w["code"] == 200] for actor, actor_writes in writes.items()}
    # ours: the one wake (parking a KEDA-managed workload is a pause of its ScaledObject, not a scale write)
    [wake] = writes["kubeon"]
    assert at["parked 1"] < wake["at"] < at["woken"], (wake, at)
    # KEDA: the two parks (paused-replicas 0), each just before the workload read as parked
    assert len(writes["keda"]) == 2, writes["keda"]
    for write, parked in zip(writes["keda"], (at["parked 1"], at["parked 2"]), strict=True):
        assert parked - 15 < write["at"] <= parked + 1, (write, at)
    # the HPA: up and down in each round (at least twice each), never while the workload is parked
    hpa = [w["at"] for w in writes["hpa"]]
    assert len([t for t in hpa if t < at["parked 1"]]) >= 2 and len([t for t in hpa if t > wake["at"]]) >= 2, hpa
    assert not [t for t in hpa if at["parked 1"] - 1 < t < wake["at"] or t > at["parked 2"]], (hpa, at)
