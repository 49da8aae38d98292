"""Wire payloads as kube-scheduler sends them, and a cache fed with real Node/Pod dicts.

ExtenderArgs (k8s.io/kube-scheduler/extender/v1) has no json tags, so its
keys are Go field names; the Pod inside is a full v1.Pod in its own
(json-tagged, camelCase) form, with the defaults the API server fills in
and the status of a pending pod, the way the scheduler's informer holds it.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from extender.app import create_app
from extender.cache import ClusterCache
from extender.service import ExtenderService
from gpupolicy.cluster import ClusterView
from gpupolicy.model import parse_policy
from kube.views import StaticView
from tests.cluster.objects import make_pod


def wire_pod(name: str, namespace: str = "default", **kwargs: Any) -> dict[str, Any]:
    """A pending v1.Pod as the scheduler's cache holds it (uid, defaults, PodScheduled=False)."""
    pod = make_pod(name, namespace, **kwargs)
    meta = pod["metadata"]
    meta.update(uid=str(uuid.uuid4()), resourceVersion="1234", creationTimestamp="2026-01-01T00:00:00Z")
    spec = pod["spec"]
    spec.update(restartPolicy="Always", terminationGracePeriodSeconds=30, dnsPolicy="ClusterFirst",
                serviceAccountName="default", securityContext={}, priority=0, enableServiceLinks=True,
                preemptionPolicy="PreemptLowerPriority")
    spec.setdefault("tolerations", []).extend([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300}])
    for c in spec["containers"]:
        c.update(terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File",
                 imagePullPolicy="IfNotPresent")
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [
        {"type": "PodScheduled", "status": "False", "lastProbeTime": None,
         "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "Unschedulable"}]}
    return pod


def bound(pod: Mapping[str, Any], node: str) -> dict[str, Any]:
    """The pod as the watch shows it once bound and running on `node`."""
    out = copy.deepcopy(dict(pod))
    out["spec"]["nodeName"] = node
    out["status"] = {"phase": "Running"}
    return out


def args(pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """ExtenderArgs with nodeCacheCapable: true."""
    return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}


def policy(name: str, body: Mapping[str, Any], *, mode: str | None = "Automatic", priority: int = 0,
           selector: Mapping[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"priority": priority, "selector": dict(selector or {}), **body}
    if mode:
        spec["mode"] = mode
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


class Harness:
    """A ClusterCache fed by hand with Node/Pod dicts, a static policy view, the real Flask app."""

    def __init__(self, nodes: Sequence[Mapping[str, Any]] = (), pods: Sequence[Mapping[str, Any]] = (),
                 policies: Sequence[Mapping[str, Any]] = (), default_strategy: str | None = None,
                 scheduler_weight: int = 0) -> None:
        self.now = 0.0
        self.cache = ClusterCache(clock=lambda: self.now)
        for node in nodes:
            self.cache.on_node("ADDED", node)
        for pod in pods:
            self.cache.on_pod("ADDED", pod)
        self.source = StaticView(ClusterView(policies=tuple(parse_policy(dict(p)) for p in policies)))
        kwargs = {"default_strategy": default_strategy} if default_strategy else {}
        self.service = ExtenderService(self.cache, self.source, scheduler_weight=scheduler_weight, **kwargs)
        self.app = create_app(self.service)
        self.client = self.app.test_client()

    def filter(self, pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
        resp = self.client.post("/filter", json=args(pod, names))
        assert resp.status_code == 200, resp.get_data(as_text=True)
        result: dict[str, Any] = resp.get_json()
        resp.close()  # as a WSGI server does once the answer is sent: /prioritize's decision is worked out
        return result

    def prioritize(self, pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, int]:
        resp = self.client.post("/prioritize", json=args(pod, names))
        assert resp.status_code == 200, resp.get_data(as_text=True)
        body = resp.get_json()
        assert isinstance(body, list)
        listed = {entry["Host"]: entry["Score"] for entry in body}
        assert set(listed) <= set(names) and len(listed) == len(body)  # each host once, only hosts sent
        # kube-scheduler adds nothing for a host the answer leaves out: the same as a listed 0
        return {**dict.fromkeys(names, 0), **listed}

    def schedule(self, pod: Mapping[str, Any], names: Sequence[str]) -> str:
        """What kube-scheduler does with the answers: filter, prioritize the survivors, take the top."""
        passed = self.filter(pod, names)["NodeNames"]
        assert passed, "no node passed the filter"
        scores = self.prioritize(pod, passed)
        top = max(scores.values())
        winners = [n for n, s in scores.items() if s == top]
        assert len(winners) == 1, f"tie at the top: {scores}"
        return winners[0]
