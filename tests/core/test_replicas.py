"""Pods with one decision input get one answer (gpupolicy.admission.replicas, what webhook.memo keys on).

Real: decision_input, pod_shape_error, mutate_pod, validate_pod, the catalog.
Generated: pods (tests/core/test_properties.py) made into replicas of a
StatefulSet, an Indexed Job, a Deployment or nobody, each pair differing in
what their controllers stamp per replica (index label and annotation,
hostname, name, managedFields), under views whose policies may select on an
index label.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupolicy.admission.mutate import mutate_pod, validate_pod
from gpupolicy.admission.replicas import INDEX_KEYS, decision_input
from gpupolicy.admission.shape import pod_shape_error
from tests.core.builders import make_node, make_policy, make_view
from tests.core.test_properties import PRODUCTS, pods

OWNERS = {
    "statefulset": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "u1", "controller": True}],
    "job": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u2", "controller": True}],
    "deployment": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llm-5f7b9c6d8", "uid": "u3",
                    "controller": True}],
    "bare": [],
}


def replica(pod: dict[str, Any], owner: str, index: int, stamp: bool) -> dict[str, Any]:
    """`pod` as its controller would stamp replica `index` (API server fields as at admission)."""
    pod = copy.deepcopy(pod)
    metadata = pod["metadata"]
    if OWNERS[owner]:
        metadata["ownerReferences"] = OWNERS[owner]
    if owner == "deployment":
        metadata.setdefault("labels", {})["pod-template-hash"] = "5f7b9c6d8"
    if stamp:
        for field in ("labels", "annotations"):
            metadata.setdefault(field, {}).update({key: str(index) for key in INDEX_KEYS})
        pod["spec"]["hostname"] = f"web-{index}"
        if owner == "statefulset":
            metadata["name"] = f"web-{index}"
    metadata["managedFields"] = [{"manager": "kube-controller-manager", "time": f"2026-12-03T10:00:0{index}Z"}]
    return pod


@st.composite
def views(draw: Any) -> Any:
    body = draw(st.sampled_from([
        {"sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}},
        {"sharing": {"strategy": "MIG", "migProfile": "2g.20gb"}},
        {"sharing": {"strategy": "TimeSlicing"}},
        {"guardrail": {"maxGpusPerPod": 1}},
        {"packing": {"strategy": "bestfit"}},
    ]))
    selector = draw(st.sampled_from([
        None,
        {"podSelector": {"matchLabels": {"apps.kubernetes.io/pod-index": "0"}}},
        {"podSelector": {"matchExpressions": [{"key": "batch.kubernetes.io/job-completion-index",
                                               "operator": "In", "values": ["1"]}]}},
    ]))
    policy = make_policy("p", mode=draw(st.sampled_from(["Automatic", "Recommend", "Approve"])),
                         approvals=draw(st.sampled_from([["Pod/ml/p"], ["StatefulSet/ml/web"], ["Job/ml/train"]])),
                         selector=selector, scheduler=draw(st.sampled_from([None, "kubeon-gpu-scheduler"])), **body)
    return make_view(policy, nodes=(make_node("n0", draw(st.sampled_from(PRODUCTS))),))


def answers(pod: dict[str, Any], view: Any) -> tuple[Any, ...]:
    ns = pod["metadata"]["namespace"]
    shape = pod_shape_error(pod)
    if shape:
        return (shape,)
    m, v = mutate_pod(pod, view, ns), validate_pod(pod, view, ns)
    return (m.allowed, m.patch, m.warnings, m.decisions, m.message, m.note,
            v.allowed, v.warnings, v.decisions, v.message, v.note)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), owner=st.sampled_from(sorted(OWNERS)), view=views(), stamp=st.booleans(),
       indexes=st.tuples(st.integers(0, 2), st.integers(0, 2)))
def test_replicas_with_one_decision_input_get_one_answer(pod, owner, view, stamp, indexes) -> None:
    a, b = (replica(pod, owner, i, stamp) for i in indexes)
    before = copy.deepcopy(a)
    key_a, key_b = (decision_input(p, p["metadata"]["namespace"], view) for p in (a, b))
    assert a == before, "decision_input must not change the pod"
    if key_a == key_b:
        assert answers(a, view) == answers(b, view)
    assert answers(key_a, view) == answers(a, view)  # the input itself is decided as the pod is


def test_an_indexed_job_and_a_statefulset_are_one_input_a_bare_pod_per_name() -> None:
    view = make_view(make_policy("p"), nodes=(make_node("n0", "NVIDIA-H200"),))
    base = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    for owner in ("statefulset", "job"):
        inputs = {repr(decision_input(replica(base, owner, i, True), "ml", view)) for i in range(5)}
        assert len(inputs) == 1, owner
    bare = [replica(base, "bare", 0, True), replica(base, "bare", 0, True)]
    bare[1]["metadata"]["name"] = "q"  # a bare pod's name is its owner (approvals read it)
    assert decision_input(bare[0], "ml", view) != decision_input(bare[1], "ml", view)


def test_a_policy_that_selects_on_the_index_keeps_it_in_the_input() -> None:
    view = make_view(make_policy("p", selector={"podSelector": {"matchLabels": {"apps.kubernetes.io/pod-index": "0"}}}),
                     nodes=(make_node("n0", "NVIDIA-H200"),))
    base = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    first, second = (replica(base, "job", i, True) for i in (0, 1))
    assert decision_input(first, "ml", view) != decision_input(second, "ml", view)
    assert mutate_pod(first, view, "ml").patch and not mutate_pod(second, view, "ml").patch


def test_an_index_that_is_not_a_string_stays_and_is_refused() -> None:
    view = make_view(make_policy("p"))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"namespace": "ml", "labels": {"apps.kubernetes.io/pod-index": 3}},
           "spec": {"containers": [{"name": "c"}]}}
    assert decision_input(pod, "ml", view)["metadata"]["labels"] == {"apps.kubernetes.io/pod-index": 3}
    assert pod_shape_error(decision_input(pod, "ml", view))


def test_a_malformed_pod_gets_its_input_and_its_shape_error_never_an_exception() -> None:
    view = make_view(make_policy("p"))
    for metadata in ({"name": "x", "ownerReferences": 5}, {"name": "x", "labels": ["a"]},
                     {"name": "x", "ownerReferences": [{"kind": "ReplicaSet", "name": "a-1"}], "labels": "b"},
                     {"name": 7, "annotations": {"apps.kubernetes.io/pod-index": 1}}):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [{"name": "c"}]}}
        key = decision_input(pod, "ml", view)
        assert key["metadata"] == metadata and pod_shape_error(key) == pod_shape_error(pod) != ""
    for pod in ([], "pod", {"metadata": []}, {"metadata": {}, "spec": "s"}):
        decision_input(pod, "ml", view)


SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=3)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)
MAPS = JSON | st.dictionaries(st.sampled_from([*INDEX_KEYS, "pod-template-hash"]), JSON, max_size=2)
OWNERS_ANY = SCALARS | st.lists(st.fixed_dictionaries({"kind": st.sampled_from(["ReplicaSet", "StatefulSet", "Job"]),
                                                      "name": JSON, "controller": JSON}), max_size=2) | JSON


@settings(max_examples=300, deadline=None)
@given(metadata=st.fixed_dictionaries({}, optional={
           "name": st.text(max_size=3), "labels": MAPS | SCALARS, "annotations": MAPS, "ownerReferences": OWNERS_ANY,
           "managedFields": JSON, "namespace": JSON}),
       spec=JSON | st.fixed_dictionaries({}, optional={"hostname": JSON, "containers": JSON}))
def test_any_json_pod_gets_an_input_and_the_same_shape_answer(metadata, spec) -> None:
    """What the webhook keys on is worked out for whatever JSON arrives, before the shape check has looked:
    it never raises, and the input has the pod's own shape error (or none)."""
    view = make_view(make_policy("p"))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    key = decision_input(pod, "ml", view)
    assert pod_shape_error(key) == pod_shape_error(pod)
