"""The optimizer in a cluster of 1,000 GPU nodes (bench/cluster_scale.py, shortened): after start-up its
controller reads Nodes and Pods from its watches, never by a LIST, and its memory stays within the large
run's bound scaled to this size.

Real: etcd, kube-apiserver (its audit log counts every request by who sent it), kube-controller-manager,
the default kube-scheduler, KWOK running the 1,000 nodes, Karpenter with its KWOK provider; our webhook,
extender, the chart's second scheduler and our controller as the chart renders them, with a GpuPolicy of
every kind in Automatic. Stand-in: none but the GPUs the nodes advertise (the GPU Operator's shim is off).
"""

from __future__ import annotations

import argparse

import pytest

from bench.cluster_scale import ScaleRun

NODES, PODS = 1000, 600
LARGE_RSS_MIB, LARGE_NODES, LARGE_PODS = 1536, 5000, 50000  # the bound at the large run


@pytest.mark.first  # the suite's second longest (about 80 s)
def test_a_thousand_node_cluster_under_churn_is_read_from_watches() -> None:
    """30 s of churn: the layout's 20 s period puts at least one of its passes inside it."""
    args = argparse.Namespace(nodes=NODES, pods=PODS, minutes=0.5, churn_per_s=5.0, scheduled_share=0.1,
                              gpu_fill=0.8, seed=42, threads=8, karpenter=True, keep_state=False,
                              probe_per_s=4.0)
    line = ScaleRun(args, log=lambda text: None).run()
    controller = line["components"]["controller"]
    assert line["nodes"] == NODES and line["churn_errors"] == 0, line
    for component in ("controller", "webhook", "extender"):
        assert line["components"][component]["lists_after_start"] == 0, (component, line["components"][component])
    assert controller["requests_per_min"] <= 2 * line["kube_controller_manager"]["requests_per_min"], line
    bound = LARGE_RSS_MIB * max(NODES / LARGE_NODES, PODS / LARGE_PODS)  # linear in the cluster's size
    assert controller["rss_mib_steady"] <= bound, (controller, bound)
    passes = line["passes"]
    assert {"capacity", "layout"} <= passes.keys() and all(p["p99_s"] < p["period_s"] for p in passes.values()), passes
    # each pass's own CPU beside its wall time (kubeon_gpu_reconcile_cpu_seconds): never more than the wall time
    assert all(p["cpu_p99_s"] is not None and p["cpu_p50_s"] <= p["p50_s"] for p in passes.values()), passes
    # kube-scheduler's side of /filter in the same churn, to the extender and to its two limits (the bare server
    # in our stack, Go's net/http): every call answered 200, with the names kube-scheduler sends at this size
    # (numFeasibleNodesToFind: the adaptive 50 - 1000/125 = 42 % of 1,000 nodes)
    probe = line["answer_probe"]
    assert probe["names"] == 420 and probe["samples"] >= 100, probe
    assert all(probe[who]["p50_ms"] > 0 for who in ("ours", "bare", "floor")), probe
