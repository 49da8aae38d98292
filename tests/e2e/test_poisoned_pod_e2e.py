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

Real: the control plane (tests/cluster): kube-apiserver calling our webhook,
the chart's second kube-scheduler calling our extender (binding through it),
KWOK running the nodes. Stand-in: the GPU Operator (no GPUs here).
"""

from __future__ import annotations

import time

import requests

from extender.cache import DEFAULT_MIX_REFRESH_SECONDS
from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_node, make_pod
from tests.e2e.test_real_cluster import extender_count, policy, wait_for_webhook_routing

CLUSTER = {"kubeon": True}
A100 = "NVIDIA-A100-SXM4-80GB"
GROUP = "kubeon-test/group"


def test_a_huge_cpu_pod_leaves_gpu_packing_working_past_the_mix_refresh(kube_cluster: Cluster,
                                                                       namespace: str) -> None:
    c = kube_cluster
    assert c.kubeon is not None
    used, victim = f"{namespace}-used"[-50:], f"{namespace}-victim"[-50:]
    for node in (used, victim):
        c.create(make_node(node, A100, 8, labels={GROUP: namespace}))
    load = make_pod("used-load", namespace, gpus=6, cpu="48", memory="512Gi")  # default plugins prefer victim
    load["spec"]["nodeName"] = used
    c.create(load)
    c.create(policy(f"{namespace}-pack", namespace, {
        "mode": "Automatic", "schedulerName": "kubeon-gpu-scheduler", "packing": {"strategy": "default"}}))
    wait_for_webhook_routing(c, namespace)
    in_group = {GROUP: namespace}
    c.create(make_pod("huge-pending", namespace, gpus=1, cpu="10P", scheduler_name=None, node_selector=in_group))
    bound = make_pod("huge-bound", namespace, gpus=1, cpu="10P", scheduler_name=None)
    bound["spec"]["nodeName"] = victim
    c.create(bound)
    direct = {"Pod": make_pod("huge-direct", namespace, gpus=1, cpu="9223372036854775807"), "Nodes": None,
              "NodeNames": [used, victim]}
    direct["Pod"]["metadata"]["uid"] = "huge-direct-uid"
    answer = requests.post(f"{c.kubeon.extender_url}/filter", json=direct, timeout=10).json()
    assert answer["Error"] == "" and answer["NodeNames"] == []
    assert set(answer["FailedAndUnresolvableNodes"].values()) == {"kubeon-gpu: insufficient cpu"}

    time.sleep(DEFAULT_MIX_REFRESH_SECONDS + 1)  # past the refresh that used to overflow

    binds = extender_count(c, "bind")
    c.create(make_pod("normal", namespace, gpus=1, scheduler_name=None, node_selector=in_group))
    pod = c.wait_for(lambda: next((p for p in c.pods(namespace, bound=True) if p["metadata"]["name"] == "normal"),
                                  None), timeout=30, message="normal pod bound")
    assert pod["spec"]["nodeName"] == used  # the extender's pick: fill the partly used node first
    assert extender_count(c, "bind") == binds + 1  # the extender bound it, no error on the way
    pending = [p["metadata"]["name"] for p in c.pods(namespace, bound=False)]
    assert pending == ["huge-pending"]  # fits nowhere
    metrics = requests.get(f"{c.kubeon.extender_url}/metrics", timeout=10).text
    assert "kubeon_extender_internal_errors_total{" not in metrics
    assert 'kubeon_gpu_objects_ignored_total{reason="out-of-range"}' in metrics
