"""`kubectl logs` and `kubectl rollout status` against the cluster stand-ins.

Real: kubectl 1.35 (its typed clients ask for protobuf: deployment, pod list, pod), the test
API server, the workload controller, scheduler and kubelet stand-ins making the Deployment's
pods Running and Ready. Faked: no container runs, so a pod's log is what the test writes for it
(`api.logs.write`); that is all `kubectl logs` is shown to work with here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import DEFAULT_SCHEDULER, make_deployment, make_node


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=[make_node("cpu-0", gpus=0)], karpenter=False) as running:
        yield running


def test_rollout_status_and_logs_of_a_deployment(cluster: Cluster) -> None:
    cluster.create(make_deployment("web", replicas=2, gpus=0))
    done = cluster.kubectl("rollout", "status", "deploy/web", "--timeout=30s")
    assert 'deployment "web" successfully rolled out' in done.stdout
    pods = cluster.pods("default", "app=web")
    assert len(pods) == 2
    for pod in pods:
        cluster.api.logs.write("default", pod["metadata"]["name"], f"hello from {pod['metadata']['name']}\nbye\n")
    out = cluster.kubectl("logs", "deploy/web")
    assert out.stdout.startswith("hello from web-") and out.stdout.endswith("bye\n")
    tail = cluster.kubectl("logs", pods[0]["metadata"]["name"], "--tail=1")
    assert tail.stdout == "bye\n"
    missing = cluster.kubectl("logs", "nope", check=False)
    assert missing.returncode != 0 and 'pods "nope" not found' in missing.stderr


def test_logs_of_a_multi_container_pod_name_the_containers(cluster: Cluster) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two", "namespace": "default"},
           "spec": {"schedulerName": DEFAULT_SCHEDULER,
                    "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}}
    cluster.create(pod)
    cluster.wait_for(lambda: cluster.pods("default", bound=True), message="pod bound")
    cluster.wait_for(lambda: cluster.pods("default")[0]["status"].get("phase") == "Running", message="running")
    cluster.api.logs.write("default", "two", "from b\n", container="b")
    assert cluster.kubectl("logs", "two", "-c", "b").stdout == "from b\n"
    assert cluster.kubectl("logs", "two", "-c", "a").stdout == ""
