"""The Node watch caches keep only what the core reads (kube/trim.py): the core reads the same from a
trimmed node as from the whole one, for every reader, on generated nodes with real nodes' bulk.

Real: the core's readers (admission's node_from_object; packing's node_spec and node_schedulable, which
the extender's cache calls); nodes built as tests/cluster/objects.py builds them, plus what kubelets add.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupolicy.cluster import node_from_object
from gpupolicy.packing.kubemodel import ObjectError, demand_from_pod, gpu_indices_from_pod, node_schedulable, node_spec
from gpupolicy.packing.scheduling import pod_key
from kube.trim import LAST_APPLIED, node_fields, pod_fields
from tests.cluster.objects import make_node, make_pod, required_node_affinity

KUBELET_BULK = {
    "images": [{"names": [f"registry.example/image-{i}@sha256:{i:064d}"], "sizeBytes": 10**9} for i in range(40)],
    "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
}


def with_bulk(node: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(node)
    node["status"].update(copy.deepcopy(KUBELET_BULK))
    node["metadata"].update({"annotations": {"node.alpha.kubernetes.io/ttl": "0"}, "resourceVersion": "42",
                             "uid": "u-1", "managedFields": [{"manager": "kubelet", "fieldsV1": {}}]})
    return node


def readings(node: dict[str, Any]) -> tuple[Any, ...]:
    """Everything the core reads of one node (an ObjectError's message where it refuses the node); the
    extender's cache reads it through node_spec and node_schedulable."""
    try:
        spec: Any = node_spec(node)
    except ObjectError as exc:
        spec = str(exc)
    return node_from_object(node), spec, node_schedulable(node)


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Any]:
    product = draw(st.sampled_from([None, "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-T4"]))
    mig = draw(st.sampled_from([None, {"1g.10gb": 7}, {"3g.40gb": 2}])) if product == "NVIDIA-A100-SXM4-80GB" \
        else None
    replicas = 1 if mig else draw(st.sampled_from([1, 4]))
    labels = draw(st.dictionaries(st.sampled_from(["nvidia.com/mig.config", "nvidia.com/gpu.count", "team",
                                                   "gpu.kubeon.io/draining"]),
                                  st.sampled_from(["all-1g.10gb", "2", "true"]), max_size=3))
    taints = draw(st.sampled_from([(), ({"key": "gpu.kubeon.io/draining", "effect": "NoSchedule"},),
                                   ({"key": "nvidia.com/gpu", "effect": "NoSchedule"},)]))
    return with_bulk(make_node("n-1", product, draw(st.integers(0, 8)), mig=mig, shared_replicas=replicas,
                               unschedulable=draw(st.booleans()), labels=labels, taints=taints))


@settings(max_examples=150, deadline=None)
@given(nodes())
def test_the_core_reads_the_same_of_a_trimmed_node(node: dict[str, Any]) -> None:
    trimmed = node_fields(node)
    assert readings(trimmed) == readings(node)
    assert trimmed["metadata"]["resourceVersion"] == "42" and "images" not in trimmed["status"]


@pytest.mark.parametrize("broken", [
    {"metadata": "not a mapping"},
    {"metadata": {"name": "n"}, "status": "not a mapping"},
    {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "many"}}},
    {"metadata": {"name": "n"}},
])
def test_an_object_of_the_wrong_shape_is_refused_as_the_whole_one_is(broken: dict[str, Any]) -> None:
    def outcome(node: dict[str, Any]) -> str:
        try:
            return repr((node_spec(node), node_schedulable(node)))
        except (ObjectError, AttributeError, TypeError) as exc:
            return type(exc).__name__ + str(exc)

    assert outcome(node_fields(broken)) == outcome(broken)


def test_a_real_sized_node_shrinks_to_what_is_read() -> None:
    node = with_bulk(make_node("n-1", "NVIDIA-A100-SXM4-80GB", 8))
    whole, kept = len(json.dumps(node)), len(json.dumps(node_fields(node)))
    assert kept < whole / 5, (kept, whole)


def pod_readings(pod: dict[str, Any]) -> tuple[Any, ...]:
    """What the extender's cache reads of a bound pod (cache.on_pod): key, node, phase, demand, GPU indices."""
    try:
        demand: Any = demand_from_pod(pod)
    except ObjectError as exc:
        demand = str(exc)
    return (pod_key(pod), pod["spec"].get("nodeName"), (pod.get("status") or {}).get("phase"), demand,
            gpu_indices_from_pod(pod))


@st.composite
def bound_pods(draw: st.DrawFn) -> dict[str, Any]:
    resource = draw(st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"]))
    annotations = draw(st.dictionaries(
        st.sampled_from(["gpu.kubeon.io/gpu-index", "gpu.kubeon.io/gpu-memory", "gpu.kubeon.io/gpu-share",
                         LAST_APPLIED]), st.sampled_from(["0,1", "20Gi", "250", "{}", "bad"]), max_size=3))
    pod = make_pod("p-1", "team", gpus=draw(st.integers(0, 2)), gpu_resource=resource,
                   annotations=annotations or None,
                   node_selector=draw(st.sampled_from([None, {"nvidia.com/gpu.product": "Tesla-T4"}])),
                   affinity=draw(st.sampled_from([None, required_node_affinity(
                       {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]})])))
    pod["spec"]["nodeName"] = "n-1"
    main = pod["spec"]["containers"][0]
    main.update({"env": [{"name": f"V{i}", "value": "x" * 50} for i in range(30)],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}], "livenessProbe": {"exec": {}}})
    if draw(st.booleans()):
        pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "restartPolicy": "Always",
                                          "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod["metadata"].update({"resourceVersion": "7", "uid": "u-7", "managedFields": [{"manager": "kubectl"}],
                            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}]})
    pod["status"] = {"phase": draw(st.sampled_from(["Pending", "Running", "Succeeded"])),
                     "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [{"name": "main"}]}
    return pod


@settings(max_examples=150, deadline=None)
@given(bound_pods())
def test_the_core_reads_the_same_of_a_trimmed_pod(pod: dict[str, Any]) -> None:
    trimmed = pod_fields(pod)
    assert pod_readings(trimmed) == pod_readings(pod)
    assert "env" not in trimmed["spec"]["containers"][0] and "volumes" not in trimmed["spec"]
    assert LAST_APPLIED not in (trimmed["metadata"].get("annotations") or {})
