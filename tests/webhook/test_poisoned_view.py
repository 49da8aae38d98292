"""Issue 37: a GpuPolicy, Namespace or Node the view cannot read is left out of it, and said once.

The watched view (kube/views.py) is what the webhook and the extender answer
from. Property: whatever one more GpuPolicy (for another namespace), Namespace
or Node (of another name) holds, extreme quantities or durations, mistyped or
missing fields, /mutate and /validate answer the webhook's pods and /filter
and /prioritize the extender's exactly as without it, and the view is built
(an unreadable object used to stop the rebuild for everyone). Named cases:
an unreadable policy is said once, counted in
`kubeon_gpu_objects_ignored_total`, and forgotten when fixed.

Real: `WatchedView` and its Reflectors' event handling (`Reflector._apply`,
what every watch event goes through: trim, key, on_change), view_from_objects,
`kube.ignored`, the webhook's Flask app and the extender's service and node
model. Faked: the API server (no list or watch runs: the events are handed
to the Reflectors), the transport (Flask's test client).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.cache import ClusterCache
from extender.service import ExtenderService
from kube.reflector import Reflector
from kube.views import WatchedView
from tests.cluster.objects import make_node
from tests.extender.payloads import wire_pod
from tests.extender.test_poisoned_objects import AMOUNT, COUNT, MISTYPED, set_at
from tests.webhook.payloads import GUARD, SHARE, api_pod, policy_review, review
from webhook.app import create_app

A100 = "NVIDIA-A100-SXM4-80GB"
PACK = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "pack-inference"},
        "spec": {"mode": "Automatic", "selector": {"namespaces": ["inference"]}, "packing": {"strategy": "fgd"}}}
IDLE = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "idle"},
        "spec": {"mode": "Recommend", "selector": {"namespaces": ["elsewhere"]},
                 "scaleToZero": {"idleAfter": "30m"}}}
POLICIES = [SHARE, GUARD, PACK]
NAMESPACES = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": {"team": n}}}
              for n in ("inference", "training")]
NODES = [make_node("a100-0", A100, 8), make_node("a100-1", A100, 8), make_node("mig-0", A100, 2, mig={"1g.10gb": 7})]
NAMES = [n["metadata"]["name"] for n in NODES]
REVIEWS = [("/mutate", review(api_pod(), uid="u1")), ("/validate", review(api_pod("4"), namespace="training",
                                                                          uid="u2"))]
SCHEDULED = [wire_pod("packed", "inference", gpus=1), wire_pod("plain", "default", gpus=2)]
EXAMPLES = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def deliver(reflector: Reflector | None, obj: Any) -> None:
    assert reflector is not None
    reflector._apply({"type": "ADDED", "object": copy.deepcopy(obj)})


def watched(policies: Sequence[Any] = (), namespaces: Sequence[Any] = (), nodes: Sequence[Any] = ()) -> WatchedView:
    """A view whose Reflectors were handed these objects as watch events (never started: no API server)."""
    view = WatchedView(None, with_nodes=True)
    for obj in [*POLICIES, *policies]:
        deliver(view.policies, obj)
    for obj in [*NAMESPACES, *namespaces]:
        deliver(view.namespaces, obj)
    for obj in [*NODES, *nodes]:
        deliver(view.nodes, obj)
    return view


def answers(view: WatchedView) -> list[Any]:
    """The webhook's answers to its reviews and the extender's to its pods, from `view`."""
    client = create_app(view).test_client()
    out: list[Any] = [client.post(path, json=body).get_json() for path, body in REVIEWS]
    cache = ClusterCache(clock=lambda: 0.0)
    for node in NODES:
        cache.on_node("ADDED", node)
    service = ExtenderService(cache, view)
    for pod in SCHEDULED:
        passed = service.filter(pod, NAMES)
        out.append((passed.body(), service.prioritize(pod, passed.passed).body() if passed.passed else b""))
    return out


CLEAN = answers(watched())


@st.composite
def poisoned_policies(draw: st.DrawFn) -> dict[str, Any]:
    """A policy for the namespace `elsewhere` (valid, it changes no answer asked here) with one poison."""
    base = copy.deepcopy(draw(st.sampled_from([SHARE, GUARD, PACK, IDLE])))
    base["metadata"]["name"] = "poison"
    base["spec"]["selector"] = {"namespaces": ["elsewhere"]}
    which = draw(st.sampled_from(["quantity", "duration", "field", "metadata"]))
    if which == "quantity":
        return set_at(base, ("spec", "sharing", "gpuMemory"), draw(AMOUNT))
    if which == "duration":
        value = draw(st.sampled_from(["1e30s", "-1s", "99999999999999999999h", "x", 10**30, -1, None]))
        return set_at(base, ("spec", "scaleToZero", "idleAfter"), value)
    if which == "field":
        path = draw(st.sampled_from([("spec",), ("spec", "priority"), ("spec", "mode"), ("spec", "sharing"),
                                     ("spec", "guardrail", "maxGpusPerPod"), ("spec", "selector"),
                                     ("spec", "packing", "strategy"), ("spec", "approvals")]))
        value = draw(st.one_of(MISTYPED, st.sampled_from([10**30, -(10**30), 1.5, "high"])))
        return set_at(base, path, value)
    path = draw(st.sampled_from([("metadata", "labels"), ("metadata", "annotations"), ("kind",), ("apiVersion",)]))
    return set_at(base, path, draw(MISTYPED.filter(lambda v: v is not None and v != {})))


@st.composite
def poisoned_namespaces(draw: st.DrawFn) -> dict[str, Any]:
    base = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere", "labels": {"team": "x"}}}
    path = draw(st.sampled_from([("metadata", "labels"), ("metadata", "labels", "team"), ("metadata", "annotations"),
                                 ("kind",)]))
    return set_at(base, path, draw(MISTYPED.filter(lambda v: v is not None and v != {} and not isinstance(v, str))))


@st.composite
def poisoned_nodes(draw: st.DrawFn) -> dict[str, Any]:
    base = make_node("intruder", A100, 2, mig={"1g.10gb": 7})
    which = draw(st.sampled_from(["amount", "count", "field"]))
    if which == "amount":
        return set_at(base, ("status", "allocatable", draw(st.sampled_from(["cpu", "memory"]))), draw(AMOUNT))
    if which == "count":
        key = draw(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"]))
        return set_at(base, ("status", "allocatable", key), draw(COUNT))
    path = draw(st.sampled_from([("metadata", "labels"), ("metadata", "labels", "nvidia.com/gpu.product"),
                                 ("status",), ("status", "allocatable"), ("spec",), ("spec", "taints")]))
    return set_at(base, path, draw(MISTYPED.filter(lambda v: v is not None)))


@EXAMPLES
@given(poisoned_policies())
def test_a_poisoned_policy_changes_no_other_answer(policy: dict[str, Any]) -> None:
    assert answers(watched(policies=[policy])) == CLEAN


@EXAMPLES
@given(poisoned_namespaces())
def test_a_poisoned_namespace_changes_no_other_answer(namespace: dict[str, Any]) -> None:
    view = watched(namespaces=[namespace])
    assert answers(view) == CLEAN
    assert set(view.ignored.current("Namespace")) == {"elsewhere"}


@EXAMPLES
@given(poisoned_nodes())
def test_a_poisoned_node_changes_no_admission_or_placement_answer(node: dict[str, Any]) -> None:
    assert answers(watched(nodes=[node])) == CLEAN


def test_an_unreadable_policy_is_left_out_said_once_and_forgotten_when_fixed() -> None:
    """A stored policy whose labels are a list (it predates the validating webhook) no longer stops every
    rebuild of the view; it is counted once however often the view is rebuilt."""
    poison = set_at({**PACK, "metadata": {"name": "poison"}}, ("metadata", "labels"), ["hub"])
    view = watched(policies=[poison])
    client = create_app(view, ignored=view.ignored).test_client()
    assert [p.name for p in view.current().policies] == ["share-inference", "max-two", "pack-inference"]
    deliver(view.namespaces, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "new"}})
    assert len(view.current().policies) == 3  # rebuilt, the same policy not said again
    assert view.ignored.current("GpuPolicy") == {"poison": "gpupolicy.metadata.labels: must be a map, not a list"}
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'kubeon_gpu_objects_ignored_total{reason="malformed"} 1.0' in metrics
    deliver(view.policies, {**PACK, "metadata": {"name": "poison"}})  # fixed
    assert len(view.current().policies) == 4 and view.ignored.current("GpuPolicy") == {}


def test_an_invalid_policy_is_counted_as_such() -> None:
    poison = set_at({**PACK, "metadata": {"name": "poison"}}, ("spec", "mode"), "automatic")
    view = watched(policies=[poison])
    view.current()
    view.current()
    assert view.ignored.counts == {"invalid-policy": 1} and "poison" in view.ignored.current("GpuPolicy")


def test_validate_of_an_update_reads_any_old_object_and_names_the_kind() -> None:
    """Issue 37, smaller: a GpuPolicy UPDATE whose oldObject.metadata is a string, or whose labels are a list,
    is answered (no hub-managed warning: nothing says the hub manages it), never as an internal error."""
    client = create_app(watched()).test_client()
    for old in ({**SHARE, "metadata": "x"}, {**SHARE, "metadata": {"name": "s", "labels": ["hub"]}}):
        body = policy_review(SHARE, operation="UPDATE")
        body["request"]["oldObject"] = old
        answer = client.post("/validate", json=body).get_json()["response"]
        assert answer["allowed"] is True and not answer.get("warnings"), answer
