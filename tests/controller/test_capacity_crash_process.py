"""Capacity drains survive a real process kill: `kubeon-gpu controller` dies right after an eviction, a fresh one
finishes the drain.

Real: the controller command (`python -m cli.main controller`) in subprocesses with its Lease (2 s, renew every
0.4 s), policy sync and every reconciler, authenticated as the chart's ServiceAccount; the real control plane
with real Karpenter, the chart's second kube-scheduler and extender, KWOK (tests/cluster, the cluster of
tests/controller/test_capacity_cluster.py). The kill is real: the test hook
`KUBEON_GPU_CRASH_AT=capacity:evicted` makes the process `os._exit(137)` right after the eviction, before the
drain record notes it (and before the eviction is counted in status.evictions), the Events and the policy status;
the dead process never releases its lease. Faked: nothing else (no Prometheus: request-based consolidation).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controller.crashpoints import CRASH_ENV, CRASH_EXIT_CODE, crash_point
from gpupolicy.capacity.drain import DRAINING_ANNOTATION
from tests.cluster.kubeon import RELEASE
from tests.controller.test_capacity_cluster import (  # noqa: F401 (make_world, time_slicing_config: fixtures)
    CLUSTER,
    World,
    annotations,
    capacity_policy,
    make_world,
    time_slicing_config,
    two_nodes_one_pod_each,
)
from tests.loopback import wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def controller(kubeconfig: str, identity: str, tmp: Path, crash_at: str | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    env["PYTHONPATH"] = str(REPO)
    if crash_at:
        env[CRASH_ENV] = crash_point("capacity", crash_at)
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "controller", "--kubeconfig", kubeconfig, "--identity", identity,
         "--namespace", "kubeon-gpu", "--capacity-provider", "karpenter",
         "--health-port", "0", "--health-bind", "127.0.0.1", "--lease-duration-seconds", "2",
         "--renew-seconds", "0.4", "--resync-seconds", "1"],
        cwd=REPO, env=env, stdout=(tmp / f"{identity}.log").open("w"), stderr=subprocess.STDOUT)


def test_kill_after_an_eviction_then_a_fresh_controller_finishes_the_drain(
        make_world: Any, tmp_path: Path) -> None:  # noqa: F811 (the fixture imported above)
    world: World = make_world()
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    originals = {p["metadata"]["uid"] for p in world.cluster.pods(world.ns)}
    assert world.cluster.kubeon is not None
    kubeconfig = str(world.cluster.kubeon.kubeconfig_of(world.cluster.api_client, RELEASE))  # the chart's identity
    first = controller(kubeconfig, "first", tmp_path, crash_at="evicted")
    try:
        code = first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert code == CRASH_EXIT_CODE, (tmp_path / "first.log").read_text()
    cordoned = [n for n, v in world.nodes().items() if v["spec"].get("unschedulable")]
    assert len(cordoned) == 1
    [victim] = cordoned
    assert DRAINING_ANNOTATION in annotations(world.nodes()[victim])
    second = controller(kubeconfig, "second", tmp_path)
    try:
        wait_for(lambda: victim not in world.claims() and victim not in world.nodes(), timeout=60,
                 what="the next controller to finish the drain")
        wait_for(lambda: len(world.cluster.pods(world.ns)) == 2 and all(p["spec"].get("nodeName")
                                                                  for p in world.cluster.pods(world.ns)),
                 what="both pods running")
    finally:
        second.terminate()
        second.wait(timeout=20)
    replaced = [p for p in world.cluster.pods(world.ns) if p["metadata"]["uid"] not in originals]
    assert len(replaced) == 1  # evicted once for the plan, replaced once
    assert not any(v["spec"].get("unschedulable") for v in world.nodes().values())
    # the kill came between the eviction and its count: the next leader counted it, once
    records = world.status().get("evictions") or {}
    assert [(r["count"], r["pending"]) for r in records.values()] == [(1, [])], records
