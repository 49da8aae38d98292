"""The benchmark's `kubeon` adapter (simulator/capacity_kubeon.py) on hand-made runs: what it passes the core.

Real: the simulator's engine and cluster, the capacity core and the packing
engine. Nothing is faked; the clusters are small so each rule shows alone.
"""

from __future__ import annotations

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.packing.nodemodel import PodDemand
from simulator.capacity import Cluster, PodRun, run
from simulator.capacity_kubeon import Kubeon
from simulator.capacity_trace import TimedPod

T4X4 = InstanceType("t4x4", "T4", 4, 96000, 393216, 2.696)
HOUR = 3600.0


def pod(name: str, at: float, seconds: float, gpus: int = 1) -> TimedPod:
    return TimedPod(name, PodDemand(cpu_milli=4000, memory_mib=8192, num_gpu=gpus, gpu_milli=1000, name=name),
                    at, seconds)


def test_deleted_nodes_do_not_count_against_the_gpu_limit() -> None:
    # a 4-GPU limit: "a" gets a T4x4 that is deleted after it; "b" later needs a new T4x4, which the limit
    # allows (the deleted node's row, kept by the simulator for reuse, is no node)
    pods = [pod("a", 0, HOUR, gpus=4), pod("b", 3 * HOUR, HOUR, gpus=4)]
    figures = run(pods, [T4X4], Kubeon(pods, [T4X4], max_gpus=4))
    assert figures.pods_never_placed == 0 and figures.peak_nodes == 1


def test_a_node_planned_for_a_pending_pod_is_no_candidate() -> None:
    # an empty ready node and a pod that just became pending (an eviction within the loop): the plan puts
    # the pod on that node, so the empty node is not deleted from under it
    waiting = pod("waiting", 0, HOUR)
    cluster = Cluster([T4X4], 180.0, None)
    row = cluster.launch(T4X4, 0.0)
    cluster.make_ready(row, 180.0)
    runs = PodRun(waiting, HOUR)
    cluster.pending[waiting.key] = runs
    kubeon = Kubeon([waiting], [T4X4])
    assert kubeon.provision(cluster, [runs], 200.0) == []  # no launch: it fits on the empty node
    assert kubeon.disrupt(cluster, 200.0) == []
    del cluster.pending[waiting.key]  # once it is bound elsewhere (or gone), the empty node may go
    cluster.version += 1
    assert [d.rows for d in kubeon.disrupt(cluster, 210.0)] == [(row,)]
