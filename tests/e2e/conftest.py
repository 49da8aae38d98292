"""End to end on the real control plane (tests/cluster): what the e2e modules share.

A module sets `CLUSTER = {"kubeon": True, ...}` and gets, from `kube_cluster`, the optimizer as
the Helm chart renders it: webhook, extender, the second kube-scheduler and controller, each with
its chart ServiceAccount, kube-apiserver calling the webhook through the chart's webhook
configurations and kube-scheduler calling the extender through the chart's
KubeSchedulerConfiguration. Nothing here starts a component of its own.
"""

from __future__ import annotations

import time
from typing import Any

import requests

from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import NAMESPACE as RELEASE_NAMESPACE
from tests.cluster.objects import make_node

__all__ = ["A100", "RELEASE_NAMESPACE", "group_nodes", "in_group", "wait_for_policy", "webhook_dry_run"]

A100 = "NVIDIA-A100-SXM4-80GB"
GROUP_LABEL = "kubeon-test/group"


def in_group(namespace: str) -> dict[str, str]:
    """The nodeSelector that keeps a test's pods on the nodes `group_nodes` made for it."""
    return {GROUP_LABEL: namespace}


def group_nodes(cluster: Cluster, namespace: str) -> tuple[str, str]:
    """Two A100-80GB KWOK nodes for one test: one partitioned 7x 1g.10gb per GPU and tainted per MIG
    resource (only a rewritten pod tolerates it), one with 8 whole GPUs. Returns (mig, whole)."""
    mig, whole = f"{namespace}-mig"[-63:], f"{namespace}-whole"[-63:]
    cluster.create(make_node(mig, A100, 8, mig={"1g.10gb": 7}, gpu_taint=True, labels=in_group(namespace)))
    cluster.create(make_node(whole, A100, 8, labels=in_group(namespace)))
    return mig, whole


def webhook_dry_run(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The webhook's own /dry-run answer for `pod` (what it would decide, with the policies it holds)."""
    assert cluster.kubeon is not None, "the module's CLUSTER has no kubeon"
    response = requests.post(f"{cluster.kubeon.webhook_url}/dry-run", json={"object": pod},
                             verify=str(cluster.kubeon.tls / "ca.crt"), timeout=10)
    response.raise_for_status()
    return dict(response.json())


def wait_for_policy(cluster: Cluster, policy: str, probe_pod: dict[str, Any], timeout: float = 30.0) -> None:
    """Wait until the webhook's watch cache holds `policy`: its dry-run of `probe_pod` names the policy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = webhook_dry_run(cluster, probe_pod)
        if any(d.get("policy") == policy for d in last.get("decisions", [])):
            return
        time.sleep(0.1)
    raise AssertionError(f"webhook never saw GpuPolicy {policy}; last dry-run answer: {last}")
