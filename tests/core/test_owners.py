"""Owner resolution for Approve mode: the real gpupolicy.k8s.owners on built pods; nothing faked."""

from __future__ import annotations

import pytest

from gpupolicy.k8s.owners import approval_covers, pod_owner
from tests.core.builders import make_pod, owner_ref


@pytest.mark.parametrize(
    ("owner", "labels", "expected"),
    [
        (owner_ref("ReplicaSet", "llm-7d9f8c6b5"), {"pod-template-hash": "7d9f8c6b5"}, "Deployment/ml/llm"),
        (owner_ref("ReplicaSet", "my-app-v2-5b6c"), {"pod-template-hash": "5b6c"}, "Deployment/ml/my-app-v2"),
        (owner_ref("ReplicaSet", "bare-rs"), {}, "Pod/ml/p"),
        (owner_ref("ReplicaSet", "llm-abc"), {"pod-template-hash": "zzz"}, "Pod/ml/p"),
        (owner_ref("StatefulSet", "db"), {}, "StatefulSet/ml/db"),
        (owner_ref("Job", "train-1", "batch/v1"), {}, "Job/ml/train-1"),
        (owner_ref("DaemonSet", "dcgm"), {}, "Pod/ml/p"),
        (None, {}, "Pod/ml/p"),
    ],
    ids=["deployment", "deployment-dashed-name", "bare-replicaset", "hash-mismatch", "statefulset", "job",
         "daemonset-is-pod", "bare-pod"],
)
def test_pod_owner(owner: dict | None, labels: dict, expected: str) -> None:
    assert pod_owner(make_pod(labels=labels, owner=owner), "ml") == expected


def test_generate_name_pod_without_name_uses_generate_name() -> None:
    pod = make_pod()
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "web-"
    assert pod_owner(pod, "ml") == "Pod/ml/web-"


@pytest.mark.parametrize(
    ("approval", "owner", "expected"),
    [
        ("Deployment/ml/llm", "Deployment/ml/llm", True),
        ("Deployment/ml/llm", "Deployment/other/llm", False),
        ("Deployment/llm", "Deployment/any/llm", True),
        ("StatefulSet/ml/llm", "Deployment/ml/llm", False),
        ("CronJob/ml/nightly", "Job/ml/nightly-29012345", True),
        ("CronJob/ml/nightly", "Job/ml/nightly-manual", False),
    ],
    ids=["exact", "other-namespace", "two-part-any-namespace", "other-kind", "cronjob-covers-its-jobs",
         "cronjob-not-manual-job"],
)
def test_approval_covers(approval: str, owner: str, expected: bool) -> None:
    assert approval_covers(approval, owner) is expected
