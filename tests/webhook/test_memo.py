"""Replicas decided once per view (webhook.memo): every answer still equals the core's own.

Real: the Flask app, the decision core, prometheus counters. The pods are the
API server's (tests/webhook/payloads.py): replicas of one template differ in
the request uid and the managedFields stamp only.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpupolicy.admission.mutate import AdmissionResult, mutate_pod, validate_pod
from gpupolicy.admission.replicas import decision_input
from gpupolicy.cluster import ClusterView
from gpupolicy.model import parse_policy
from tests.webhook.conftest import example_view
from tests.webhook.payloads import GUARD, SHARE, api_pod, review
from webhook.app import create_app
from webhook.memo import AdmissionMemo


class SwitchableView:
    """A view source whose view the test replaces, as a watch event does."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def current(self) -> ClusterView:
        return self.view

    def ready(self) -> bool:
        return True


def replica(stamp: str, **kwargs: Any) -> dict[str, Any]:
    pod = api_pod(**kwargs)
    pod["metadata"]["managedFields"][0]["time"] = stamp
    return pod


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    raw = answer["response"].get("patch")
    return json.loads(base64.b64decode(raw)) if raw else []


def core_answer(pod: dict[str, Any], view: ClusterView, namespace: str) -> tuple[list, list, bool]:
    result = mutate_pod(pod, view, namespace)
    return result.patch, result.warnings, result.allowed


PODS = [
    ("inference", replica("2026-12-03T10:00:00Z")),
    ("inference", replica("2026-12-03T10:00:01Z")),  # a replica created a second later
    ("inference", replica("2026-12-03T10:00:01Z", annotations={"gpu.kubeon.io/gpu-memory": "30Gi"})),
    ("inference", replica("2026-12-03T10:00:02Z", gpus="2")),
    ("inference", replica("2026-12-03T10:00:02Z", labels={"gpu.kubeon.io/skip": "true"})),
    ("research", replica("2026-12-03T10:00:00Z")),  # Recommend: a warning, no patch
    ("training", replica("2026-12-03T10:00:00Z", gpus="4")),
    ("kube-system", replica("2026-12-03T10:00:00Z")),
]


def test_every_answer_equals_the_core_s_own_first_time_and_after() -> None:
    view = example_view()
    client = create_app(SwitchableView(view)).test_client()
    for _ in range(2):  # the second round is answered from the memo
        for namespace, pod in PODS:
            answer = client.post("/mutate", json=review(pod, namespace=namespace)).get_json()
            patch, warnings, allowed = core_answer(pod, view, namespace)
            assert patch_of(answer) == patch
            assert answer["response"].get("warnings", []) == warnings
            assert answer["response"]["allowed"] is allowed


GENERATED_PODS = st.builds(
    lambda gpus, resource, memory, labels, scheduler: (
        replica("2026-12-03T10:00:00Z", gpus=gpus, resource=resource, labels=labels,
                annotations={"gpu.kubeon.io/gpu-memory": memory} if memory else None), scheduler),
    # few values each, so that a batch often holds pods that differ in one field only
    st.sampled_from(["0", "1", "2"]), st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpu.shared"]),
    st.sampled_from([None, "20Gi", "200Gi"]), st.sampled_from([None, {"gpu.kubeon.io/skip": "true"}]),
    st.sampled_from(["default-scheduler", "other-scheduler"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["inference", "research", "training"]), GENERATED_PODS),
                min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_generated_pods_answered_as_the_core_answers_in_any_order(batch: list, rnd: Any) -> None:
    view = example_view()
    client = create_app(SwitchableView(view)).test_client()
    sends = batch * 2
    rnd.shuffle(sends)
    for i, (namespace, (pod, scheduler)) in enumerate(sends):
        pod = json.loads(json.dumps(pod))
        pod["spec"]["schedulerName"] = scheduler
        pod["metadata"]["managedFields"][0]["time"] = f"2026-12-03T10:00:{i % 60:02d}Z"
        for path, decide in (("/mutate", mutate_pod), ("/validate", validate_pod)):
            answer = client.post(path, json=review(pod, namespace=namespace)).get_json()["response"]
            result = decide(pod, view, namespace)
            assert patch_of({"response": answer}) == result.patch
            assert answer.get("warnings", []) == result.warnings and answer["allowed"] is result.allowed


def test_replicas_share_a_decision_and_each_answer_carries_its_own_uid() -> None:
    client = create_app(SwitchableView(example_view())).test_client()
    bodies = [review(replica(f"2026-12-03T10:00:0{i}Z"), uid=f"uid-{i}") for i in range(3)]
    answers = [client.post("/mutate", json=b).get_json()["response"] for b in bodies]
    assert [a["uid"] for a in answers] == ["uid-0", "uid-1", "uid-2"]
    assert answers[0]["patch"] == answers[1]["patch"] == answers[2]["patch"]
    assert {op["value"] for op in patch_of({"response": answers[0]}) if op["path"] == "/spec/schedulerName"} \
        == {"kubeon-gpu-scheduler"}


def test_decisions_are_counted_per_request_not_per_computation() -> None:
    registry = CollectorRegistry()
    client = create_app(SwitchableView(example_view()), registry).test_client()
    for i in range(5):
        client.post("/mutate", json=review(replica(f"2026-12-03T10:00:0{i}Z")))
    counted = registry.get_sample_value("kubeon_webhook_decisions_total", {
        "policy": "share-inference", "mode": "Automatic", "action": "UseMIG", "applied": "true"})
    assert counted == 5


def test_a_policy_change_answers_the_next_replica_under_the_new_view() -> None:
    source = SwitchableView(example_view())
    client = create_app(source).test_client()
    first = client.post("/mutate", json=review(replica("2026-12-03T10:00:00Z"))).get_json()["response"]
    assert "patch" in first
    recommend = {**SHARE, "spec": {**SHARE["spec"], "mode": "Recommend"}}
    source.view = replace(source.view, policies=(parse_policy(recommend), parse_policy(GUARD)))
    second = client.post("/mutate", json=review(replica("2026-12-03T10:00:01Z"))).get_json()["response"]
    assert "patch" not in second and any("share-inference" in w for w in second["warnings"])


def test_validate_is_remembered_apart_from_mutate() -> None:
    view = example_view()
    client = create_app(SwitchableView(view)).test_client()
    pod = replica("2026-12-03T10:00:00Z", gpus="4")
    for path in ("/mutate", "/validate", "/validate"):
        answer = client.post(path, json=review(pod, namespace="training")).get_json()["response"]
    assert answer["allowed"] is False  # max-two denies 4 GPUs at /validate (mutate allowed it)
    assert answer["status"]["message"] == validate_pod(pod, view, "training").message


def test_a_pod_of_the_wrong_shape_is_refused_every_time() -> None:
    client = create_app(SwitchableView(example_view())).test_client()
    pod = replica("2026-12-03T10:00:00Z")
    pod["spec"]["containers"] = "not a list"
    for _ in range(2):
        resp = client.post("/mutate", json=review(pod))
        assert resp.status_code == 400 and "containers" in resp.get_json()["error"]
    named = replica("2026-12-03T10:00:00Z")  # a name, and owners of the wrong type: the key reads both
    named["metadata"].update(name="llm-0", ownerReferences=5)
    for path in ("/mutate", "/validate"):
        resp = client.post(path, json=review(named))
        assert resp.status_code == 400 and "ownerReferences" in resp.get_json()["error"]


def test_the_table_is_bounded_and_the_oldest_entry_leaves_first() -> None:
    memo: AdmissionMemo[str] = AdmissionMemo(limit=2)
    view = example_view()
    calls: list[int] = []

    def build(i: int) -> str:
        calls.append(i)
        return f"answer {i}"

    for i in (0, 1, 2, 1, 0, 0, 2):
        assert memo.result(view, ("/mutate", "ns"), {"n": i}, lambda i=i: build(i)) == f"answer {i}"  # type: ignore[misc]
        assert len(memo._state[1]) <= 2
    # 2 pushed 0 out (the oldest) and kept 1; 0 came back once, pushing 1 out, and stayed; 2 was still there
    assert calls == [0, 1, 2, 0]


def test_the_app_keeps_the_encoded_answer_never_the_pod() -> None:
    app = create_app(SwitchableView(example_view()))  # type: ignore[arg-type]
    client = app.test_client()
    pod = replica("2026-12-03T10:00:00Z")
    assert client.post("/mutate", json=review(pod, namespace="inference")).status_code == 200
    memo = app.extensions["kubeon_memo"]
    (kept,) = memo._state[1].values()
    assert kept.patch and not any(isinstance(v, (dict, list)) for v in kept)  # encoded: nothing to walk
    assert patch_of({"response": {"patch": kept.patch}}) == mutate_pod(pod, example_view(), "inference").patch


def test_an_indexed_job_s_pods_are_decided_once_each_answered_as_the_core_answers() -> None:
    app = create_app(SwitchableView(example_view()))  # type: ignore[arg-type]
    client = app.test_client()
    index = "batch.kubernetes.io/job-completion-index"
    for i in range(5):
        pod = replica(f"2026-12-03T10:00:0{i}Z", labels={index: str(i)}, annotations={index: str(i)})
        pod["spec"]["hostname"] = f"train-{i}"
        got = client.post("/mutate", json=review(pod, namespace="inference", uid=f"u{i}")).get_json()
        assert got["response"]["uid"] == f"u{i}"
        assert patch_of(got) == mutate_pod(pod, example_view(), "inference").patch != []
    assert len(app.extensions["kubeon_memo"]._state[1]) == 1


def test_the_table_holds_at_most_max_bytes_of_keys() -> None:
    memo: AdmissionMemo[AdmissionResult] = AdmissionMemo(max_bytes=3000)
    view = example_view()
    calls: list[int] = []
    big = {"env": "x" * 1400}
    for i in (0, 1, 0, 2, 2, 1):  # two keys fit in 3,000 bytes: 2 pushes 0 out, 1 stays
        memo.result(view, ("/mutate", "ns"), {**big, "n": i}, lambda: calls.append(1) or AdmissionResult())
        assert sum(len(k[1]) for k in memo._state[1]) <= 3000
    assert len(calls) == 3
    huge = {"env": "x" * 5000}  # larger than the whole table: decided every time, never kept
    for _ in range(2):
        memo.result(view, ("/mutate", "ns"), huge, lambda: calls.append(1) or AdmissionResult())
    assert len(calls) == 5 and len(memo._state[1]) == 2  # and the table kept what it held


def test_replicas_a_second_apart_are_one_entry_other_pods_their_own() -> None:
    memo, view = AdmissionMemo(), example_view()
    calls: list[str] = []
    pods = [replica("2026-12-03T10:00:00Z"), replica("2026-12-03T10:00:01Z"),
            replica("2026-12-03T10:00:01Z", gpus="2")]
    for pod in pods:
        memo.result(view, ("/mutate", "inference"), decision_input(pod, "inference", view),
                    lambda: calls.append("built") or AdmissionResult())
    assert len(calls) == 2
    memo.result(view, ("/mutate", "research"), decision_input(pods[0], "research", view),
                lambda: calls.append("built") or AdmissionResult())
    assert len(calls) == 3


def test_an_object_too_deep_to_key_is_decided_every_time() -> None:
    memo, view = AdmissionMemo(), example_view()
    nested: Any = {}
    for _ in range(300):  # orjson writes at most 254 levels
        nested = {"x": nested}
    calls: list[int] = []
    for _ in range(2):
        assert memo.result(view, ("/mutate", "ns"), nested, lambda: calls.append(1) or AdmissionResult()).allowed
    assert len(calls) == 2
