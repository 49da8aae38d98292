"""The CRD's CEL rules (x-kubernetes-validations) agree with the model that they describe.

Real: the CRD as generated from the model, installed on the real kube-apiserver v1.35.4
(tests/cluster), which compiles its rules with Kubernetes' own CEL libraries (the quantity library
included) and runs them on a server-side dry-run create of each policy; and the model's own
validation. Nothing is faked.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from gpupolicy.crd import build_crd
from gpupolicy.model import parse_policy
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import apply_objects

CLUSTER = {"gpu_operator": False}


def rules(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    for rule in node.get("x-kubernetes-validations") or []:
        yield path, rule
    for name, sub in (node.get("properties") or {}).items():
        yield from rules(sub, (*path, name))


CRD = build_crd()
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
RULES = list(rules(SCHEMA))


@pytest.fixture(scope="module")
def crd_cluster(kube_cluster: Cluster) -> Cluster:
    """The cluster with the generated CRD installed and served."""
    apply_objects(kube_cluster.api_client, [CRD])
    kube_cluster.wait_for(lambda: _served(kube_cluster), timeout=30, message="GpuPolicy CRD served")
    return kube_cluster


def _served(cluster: Cluster) -> bool:
    return cluster.kubectl("get", "gpupolicies", check=False).returncode == 0


def refusal(cluster: Cluster, policy: dict[str, Any]) -> str:
    """What kube-apiserver says to a server-side dry-run create of `policy` ('' when it accepts)."""
    try:
        cluster.custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", policy,
                                                    dry_run="All", _preload_content=False)
    except ApiException as error:
        assert error.status == 422, (error.status, error.body)
        return str(json.loads(error.body)["message"])
    return ""


BASE = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
        "spec": {"mode": "Automatic", "sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}}}


def _spec(**changes: Any) -> dict[str, Any]:
    policy = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            policy["spec"].pop(key, None)
        else:
            policy["spec"][key] = value
    return policy


CASES = {
    "valid": (BASE, None),
    "huge-gpu-memory": (_spec(sharing={"strategy": "MIG", "gpuMemory": "1e1000000"}), "between 0 and 2^63-1"),
    "negative-gpu-memory": (_spec(sharing={"strategy": "MIG", "gpuMemory": "-1Gi"}), "between 0 and 2^63-1"),
    "largest-gpu-memory": (_spec(sharing={"strategy": "MIG", "gpuMemory": "9223372036854775807"}), None),
    "two-bodies": (_spec(guardrail={"maxGpusPerPod": 2}), "exactly one of"),
    "no-body": (_spec(sharing=None), "exactly one of"),
    "restart-without-namespaces": (_spec(sharing={"strategy": "MIG", "rollout": "Restart"}), "rollout Restart"),
    "restart-with-namespaces": (_spec(sharing={"strategy": "MIG", "rollout": "Restart"},
                                      selector={"namespaces": ["a"]}), None),
    "time-slicing-via-dra": (_spec(sharing={"strategy": "TimeSlicing", "via": "DRA"}), None),
    "mig-via-dra": (_spec(sharing={"strategy": "MIG", "via": "DRA"}), None),
    "autoscale-max-below-min": (_spec(sharing=None, scaleToZero={"namespaces": ["a"], "autoscale": {
        "targetUtilizationPercent": 50, "min": 3, "max": 2}}), "max must be >= min"),
    "autoscale-fine": (_spec(sharing=None, scaleToZero={"namespaces": ["a"], "autoscale": {
        "targetUtilizationPercent": 50, "max": 2}}), None),
}


def test_every_rule_is_exercised() -> None:
    messages = {rule["message"] for _, rule in RULES}
    expected = {needle for _, needle in CASES.values() if needle}
    assert all(any(needle in m for m in messages) for needle in expected)
    assert len(messages) == len(expected)


@pytest.mark.parametrize("name", list(CASES))
def test_rules_refuse_what_the_model_refuses(crd_cluster: Cluster, name: str) -> None:
    policy, needle = CASES[name]
    refused = refusal(crd_cluster, policy)
    try:
        parse_policy(policy)
        model_ok = True
    except ValidationError:
        model_ok = False
    if needle is None:
        assert refused == "" and model_ok, refused
    else:
        assert needle in refused, refused
        assert not model_ok
