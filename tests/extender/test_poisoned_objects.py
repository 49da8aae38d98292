"""Issue 37: no watched or scheduled object, however extreme or malformed, changes the answers about others.

One GPU pod asking `cpu: 10P` used to make every later /filter answer
"internal error (OverflowError)" once the typical mix was refreshed, until a
restart. The property: after any poisoned pod (sent to /filter, or bound to a
node through the watch) or poisoned node (through the watch), and a clock
past the mix refresh, valid pods get byte-for-byte the /filter and
/prioritize answers they get on a clean state, and nothing answers an
internal error. Poisons: quantities beyond the model's bound (saturated: the
pod fits nowhere, so it is not learned into the mix), negative, fractional
device counts, exponent forms, garbage, and missing or mistyped fields.

Real: the Flask app, ExtenderService, ClusterCache (the node model, the
typical mix, `kube.ignored`), the quantity parser and the shape check.
Faked: the watch (ClusterCache.on_node / on_pod, the Reflectors' on_change,
called with the objects), the clock (the harness's) and the transport
(Flask's test client). tests/extender/test_watch_cache.py has the bound pod
through the real Reflectors and the test API server.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.cache import DEFAULT_MIX_REFRESH_SECONDS
from tests.cluster.objects import make_node
from tests.extender.payloads import Harness, bound, wire_pod

A100 = "NVIDIA-A100-SXM4-80GB"
SHARED, MIG = "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"
NODES = [make_node("a100-0", A100, 8), make_node("a100-1", A100, 8), make_node("mig-0", A100, 2, mig={"1g.10gb": 7}),
         make_node("t4-0", "Tesla-T4", 2, shared_replicas=4), make_node("cpu-0", None, 0),
         make_node("victim", A100, 8)]
ASKED = ["a100-0", "a100-1", "mig-0", "t4-0", "cpu-0"]  # never "victim", where poisoned pods are bound
LOAD = [bound(wire_pod(f"load-{i}", gpus=2), "a100-1") for i in range(2)]
VALID = [wire_pod("whole", gpus=1), wire_pod("cpu", cpu="2"), wire_pod("mig", gpus=1, gpu_resource=MIG),
         wire_pod("share", gpus=1, gpu_resource=SHARED, annotations={"gpu.kubeon.io/gpu-memory": "4Gi"})]
EXAMPLES = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

HUGE = ["9223372036854775807", "10P", "8E", "7Ei", "1e19", "9e18", "5E", "99999999999999999999", "1e30",
        9223372036854775807, 10**30, 1e300]
NEGATIVE = ["-1", "-10P", "-0.5", "-1e3", "-9223372036854775808", -1]
FRACTION = ["0.5", "2.5", "1e-3", "5e-1", "100m", 0.5]  # of a device: the API server refuses them
GARBAGE = ["", "abc", "1..2", "Gi", "1Gib", "0x10", "1_000", "NaN", "inf", "1e999990", None, True, [], {},
           ["8"], {"value": "8"}]
AMOUNT = st.sampled_from(HUGE + NEGATIVE + GARBAGE)
COUNT = st.sampled_from(HUGE + NEGATIVE + FRACTION + GARBAGE)
MISTYPED = st.sampled_from([None, "x", 5, [], ["x"], {}, [None], [1]])


def answers(h: Harness) -> list[Any]:
    """What kube-scheduler would hear about each valid pod, in turn (each pick is assumed, as it would be)."""
    out: list[Any] = []
    for pod in VALID:
        result = h.filter(pod, ASKED)
        assert "internal error" not in result["Error"], result["Error"]
        passed = result["NodeNames"] or []
        out.append((result, h.prioritize(pod, passed) if passed else {}))
    return out


def harness() -> Harness:
    return Harness(NODES, LOAD)


def past_the_mix_refresh(h: Harness) -> Harness:
    h.now += DEFAULT_MIX_REFRESH_SECONDS + 1
    return h


CLEAN = answers(past_the_mix_refresh(harness()))


def set_at(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `obj` with `value` at `path` (missing levels made; a None value deletes the key)."""
    out = copy.deepcopy(obj)
    parent: Any = out
    for key in path[:-1]:
        if isinstance(parent, dict):
            parent = parent.setdefault(key, {})
        elif isinstance(parent, list) and isinstance(key, int) and key < len(parent):
            parent = parent[key]
        else:
            return out
    if isinstance(parent, dict):
        if value is None:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    return out


RESOURCES = ("spec", "containers", 0, "resources")


@st.composite
def poisoned_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A GPU, MIG or share pod with one poisoned value or field."""
    base = draw(st.sampled_from([wire_pod("poison", gpus=1), wire_pod("poison", gpus=1, gpu_resource=MIG),
                                 wire_pod("poison", gpus=1, gpu_resource=SHARED)]))
    which = draw(st.sampled_from(["amount", "count", "field", "annotation"]))
    if which == "amount":
        side = draw(st.sampled_from(["requests", "limits"]))
        return set_at(base, (*RESOURCES, side, draw(st.sampled_from(["cpu", "memory"]))), draw(AMOUNT))
    if which == "count":
        resource = draw(st.sampled_from(["nvidia.com/gpu", SHARED, MIG]))
        value = draw(COUNT)
        pod = set_at(base, (*RESOURCES, "requests", resource), value)
        return set_at(pod, (*RESOURCES, "limits", resource), value)
    if which == "annotation":
        key = draw(st.sampled_from(["gpu.kubeon.io/gpu-memory", "gpu.kubeon.io/gpu-share"]))
        return set_at(base, ("metadata", "annotations", key), draw(st.sampled_from(HUGE + NEGATIVE + GARBAGE[:9])))
    path = draw(st.sampled_from([("spec", "containers"), RESOURCES, (*RESOURCES, "requests"),
                                 ("metadata", "annotations"), ("metadata", "labels"), ("spec", "nodeSelector"),
                                 ("spec", "affinity"), ("spec", "affinity", "nodeAffinity"), ("status",),
                                 ("spec", "initContainers"), ("spec", "tolerations")]))
    value = draw(MISTYPED.filter(lambda v: v is not None and v != {}))
    return set_at(base, path, value)


@st.composite
def poisoned_nodes(draw: st.DrawFn) -> dict[str, Any]:
    """A GPU, MIG or time-sliced node named `intruder` with one poisoned value or field."""
    base = draw(st.sampled_from([make_node("intruder", A100, 8), make_node("intruder", A100, 2, mig={"1g.10gb": 7}),
                                 make_node("intruder", "Tesla-T4", 2, shared_replicas=4)]))
    which = draw(st.sampled_from(["amount", "count", "label", "field"]))
    if which == "amount":
        return set_at(base, ("status", "allocatable", draw(st.sampled_from(["cpu", "memory"]))), draw(AMOUNT))
    if which == "count":
        resource = draw(st.sampled_from(["nvidia.com/gpu", SHARED, MIG]))
        return set_at(base, ("status", "allocatable", resource), draw(COUNT))
    if which == "label":
        key = draw(st.sampled_from(["nvidia.com/gpu.count", "nvidia.com/gpu.memory", "nvidia.com/gpu.replicas"]))
        text = draw(st.sampled_from(["99999999999", "99999999999999999999999", "\u00b2", "-1", "1e3", "0", "x"]))
        return set_at(base, ("metadata", "labels", key), text)
    path = draw(st.sampled_from([("metadata", "labels"), ("status",), ("status", "allocatable"), ("spec",),
                                 ("spec", "taints"), ("spec", "unschedulable")]))
    return set_at(base, path, draw(MISTYPED.filter(lambda v: v is not None)))


@EXAMPLES
@given(poisoned_pods())
def test_a_poisoned_pod_sent_to_filter_changes_no_other_answer(pod: dict[str, Any]) -> None:
    h = harness()
    result = h.client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ASKED}).get_json()
    assert "internal error" not in result["Error"], result["Error"]
    assert answers(past_the_mix_refresh(h)) == CLEAN


@EXAMPLES
@given(poisoned_pods())
def test_a_poisoned_pod_bound_through_the_watch_changes_no_other_answer(pod: dict[str, Any]) -> None:
    h = harness()
    h.cache.on_pod("ADDED", bound(pod, "victim") if isinstance(pod.get("spec"), dict) else pod)
    assert answers(past_the_mix_refresh(h)) == CLEAN


@EXAMPLES
@given(poisoned_nodes())
def test_a_poisoned_node_changes_no_other_answer(node: dict[str, Any]) -> None:
    h = harness()
    h.cache.on_node("ADDED", node)
    assert answers(past_the_mix_refresh(h)) == CLEAN


# ---- the issue's reproducers, by name ------------------------------------------------------------------------

@pytest.mark.parametrize("cpu", ["9223372036854775807", "10P"])
def test_issue_37_huge_cpu_pod_through_filter_leaves_the_extender_working(cpu: str) -> None:
    """Step 1-3 of the issue: the pod's own answer is 'insufficient cpu' everywhere; after the mix refresh
    every valid pod is answered as before, and the pod is said once as left out of the mix."""
    h = harness()
    huge = wire_pod("huge", gpus=1, cpu=cpu)
    result = h.filter(huge, ASKED)
    assert result["NodeNames"] == [] and result["Error"] == ""
    assert result["FailedAndUnresolvableNodes"] == dict.fromkeys(ASKED, "kubeon-gpu: insufficient cpu")
    h.filter(huge, ASKED)  # kube-scheduler retries it: still said once
    assert answers(past_the_mix_refresh(h)) == CLEAN
    assert h.cache.ignored.counts == {"out-of-range": 1}
    metrics = h.client.get("/metrics").get_data(as_text=True)
    assert 'kubeon_gpu_objects_ignored_total{reason="out-of-range"} 1.0' in metrics
    assert "kubeon_extender_internal_errors_total{" not in metrics  # no internal error was answered


def test_issue_37_huge_cpu_pod_bound_through_the_watch_leaves_the_extender_working() -> None:
    """The same pod bound directly (spec.nodeName), seen only through the watch: it fills its node's CPU (as
    it would, were the kubelet to run it), nothing else changes."""
    h = harness()
    h.cache.on_pod("ADDED", bound(wire_pod("huge", gpus=1, cpu="10P"), "victim"))
    assert answers(past_the_mix_refresh(h)) == CLEAN
    assert h.filter(VALID[1], ["victim"])["FailedNodes"] == {"victim": "kubeon-gpu: insufficient cpu"}
    assert h.cache.ignored.current("pod") == {
        "default/huge": "asks more than any node has: not learned into the typical mix"}


def test_an_unreadable_node_is_said_once_and_counted_until_it_is_fixed() -> None:
    h = harness()
    broken = set_at(make_node("intruder", A100, 8), ("status", "allocatable", "nvidia.com/gpu"), "-1")
    h.cache.on_node("ADDED", broken)
    h.cache.on_node("MODIFIED", copy.deepcopy(broken))  # a status report: not said again
    result = h.filter(VALID[0], ["a100-0", "intruder"])
    assert result["FailedNodes"] == {"intruder": "kubeon-gpu: node not known to the optimizer"}
    assert h.cache.ignored.counts == {"out-of-range": 1}
    assert "intruder" in h.cache.ignored.current("node")
    h.cache.on_node("MODIFIED", make_node("intruder", A100, 8))  # fixed: in the model, forgotten as left out
    assert h.filter(VALID[0], ["intruder"])["NodeNames"] == ["intruder"]
    assert h.cache.ignored.current("node") == {}
