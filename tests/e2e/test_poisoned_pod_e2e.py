"""Issue 37 end to end: a pod asking `cpu: 10P` no longer turns GPU packing off for the whole cluster.

Before the fix, the pod's CPU in millicores overflowed NumPy's int64 when the
extender next refreshed its typical pod mix (every 30 s); from then on every
/filter answered an internal error and kube-scheduler (the extender is
`ignorable`) placed GPU pods unpacked, until a restart. Here the pod arrives
every way it can: pending through the scheduler, sent to /filter directly (as
the issue's tester did: kube-scheduler's own filters drop every node first, so
it never asks), and bound directly with spec.nodeName (seen only through the
watch). After the mix refresh, a normal GPU pod is still placed by the
extender on the node it prefers: the partly used one, where the stock
scheduler's LeastAllocated would pick the empty one.

Real: the test API server and its loops (tests/kubeapi/cluster.py), the
scheduler stand-in calling `kubeon-gpu extender` (a real gunicorn process
watching the cluster) with the chart's KubeSchedulerConfiguration, binding
through the API (the `extender` fixture of tests/e2e/conftest.py, as
tests/e2e/test_extender_e2e.py). Faked: the kubelet/device plugin.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from extender.cache import DEFAULT_MIX_REFRESH_SECONDS
from tests.e2e.conftest import Process
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_node, make_pod

A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture(scope="module")
def cluster(e2e_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    c = e2e_cluster
    c.create(make_node("b-used", A100, 8))
    c.create(make_node("victim", A100, 8))
    load = make_pod("used-load", "e2e-pinned", gpus=6)
    load["spec"]["nodeName"] = "b-used"
    c.ensure_namespace("e2e-pinned")
    c.create(load)
    c.wait_for(lambda: c.pods("e2e-pinned", bound=True), message="pinned load stored")
    extender: Process = request.getfixturevalue("extender")
    c.use_extenders([extender.config])
    yield c


def test_a_huge_cpu_pod_leaves_gpu_packing_working_past_the_mix_refresh(cluster: Cluster,
                                                                       extender: Process) -> None:
    cluster.ensure_namespace("e2e-poison")
    cluster.create(make_pod("huge-pending", "e2e-poison", gpus=1, cpu="10P"))
    bound = make_pod("huge-bound", "e2e-poison", gpus=1, cpu="10P")
    bound["spec"]["nodeName"] = "victim"
    cluster.create(bound)
    direct = {"Pod": make_pod("huge-direct", "e2e-poison", gpus=1, cpu="9223372036854775807"), "Nodes": None,
              "NodeNames": ["b-used", "a100-whole-0"]}
    direct["Pod"]["metadata"]["uid"] = "huge-direct-uid"
    answer = requests.post(f"{extender.url}/filter", json=direct, timeout=10).json()
    assert answer["Error"] == "" and answer["NodeNames"] == []
    assert set(answer["FailedAndUnresolvableNodes"].values()) == {"kubeon-gpu: insufficient cpu"}

    time.sleep(DEFAULT_MIX_REFRESH_SECONDS + 1)  # past the refresh that used to overflow

    cluster.ensure_namespace("e2e-after")
    before = len(cluster.scheduler.extenders[0].calls)
    cluster.create(make_pod("normal", "e2e-after", gpus=1))
    [pod] = cluster.wait_for(lambda: cluster.pods("e2e-after", bound=True), timeout=20, message="normal pod bound")
    assert pod["spec"]["nodeName"] == "b-used"  # the extender's pick: fill the partly used node first
    calls = cluster.scheduler.extenders[0].calls[before:]
    assert [verb for verb, _ in calls if verb == "bind"] == ["bind"]  # the extender bound it, no error on the way
    assert [p["metadata"]["name"] for p in cluster.pods("e2e-poison", bound=False)] == ["huge-pending"]  # fits nowhere
    metrics = requests.get(f"{extender.url}/metrics", timeout=10).text
    assert "kubeon_extender_internal_errors_total{" not in metrics, extender.log_tail()
    assert 'kubeon_gpu_objects_ignored_total{reason="out-of-range"}' in metrics
