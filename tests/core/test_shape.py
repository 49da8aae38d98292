"""The one shape check names the field of a wrong-typed object (issue 15, defect 4). Pure: nothing faked."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpupolicy.admission.shape import dry_run_body_error, node_shape_error, object_shape_error, pod_shape_error
from tests.core.builders import make_pod


def _with(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    parent: Any = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


POD = make_pod(2, labels={"app": "x"})


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("metadata",), [], "object.metadata: must be an object, not a list"),
        (("metadata", "labels"), ["a"], "object.metadata.labels: must be a map, not a list"),
        (("metadata", "labels"), {"app": 1}, "object.metadata.labels.app: must be a string, not a number"),
        (("metadata", "ownerReferences"), {"kind": "Job"}, "object.metadata.ownerReferences: must be a list"),
        (("spec", "containers"), {}, "object.spec.containers: must be a list, not an object"),
        (("spec", "containers", 0), "c", "object.spec.containers[0]: must be an object, not a string"),
        (("spec", "containers", 0, "resources"), "2", "object.spec.containers[0].resources: must be an object"),
        (("spec", "containers", 0, "resources", "limits"), ["1"],
         "object.spec.containers[0].resources.limits: must be a map, not a list"),
        (("spec", "containers", 0, "resources", "limits", "memory"), "1e1000000",
         "object.spec.containers[0].resources.limits.memory: '1e1000000' is larger than the largest quantity"),
        (("spec", "containers", 0, "resources", "limits", "cpu"), True,
         "object.spec.containers[0].resources.limits.cpu: True is not a quantity"),
        (("spec", "tolerations"), [None], "object.spec.tolerations[0]: must be an object, not null"),
        (("spec", "nodeSelector"), "gpu", "object.spec.nodeSelector: must be a map, not a string"),
        (("spec", "affinity"), {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "values": "a"}]}]}}},
         "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
         ".matchExpressions[0].values: must be a list, not a string"),
        (("spec", "containers", 0, "resources", "limits", "\ud800x"), "lots",
         "object.spec.containers[0].resources.limits['\\ud800x']: 'lots' is not a quantity"),
    ],
)
def test_wrong_types_name_the_field(path: tuple[Any, ...], value: Any, message: str) -> None:
    error = pod_shape_error(_with(POD, path, value), "object")
    assert error.startswith(message), error
    assert error.isascii()


def test_a_good_pod_and_nulls_pass() -> None:
    assert pod_shape_error(POD) == ""
    assert pod_shape_error(_with(POD, ("metadata", "annotations"), None)) == ""
    assert pod_shape_error(_with(POD, ("spec", "containers", 0, "resources", "requests"), None)) == ""


def test_workload_template_and_levels_above() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": POD["spec"]}}}
    assert object_shape_error(deployment) == ""
    assert object_shape_error(_with(deployment, ("spec",), [])) == "object.spec: must be an object, not a list"
    bad = _with(deployment, ("spec", "template", "spec", "containers", 0, "resources"), [])
    assert object_shape_error(bad).startswith("object.spec.template.spec.containers[0].resources: must be an object")
    cron = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": "x"}}}}
    assert object_shape_error(cron) == "object.spec.jobTemplate.spec.template: must be an object, not a string"


def test_node_quantities_are_checked() -> None:
    node = {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "1e400000"}}}
    assert node_shape_error(node, "Nodes.items[0]").startswith(
        "Nodes.items[0].status.allocatable.nvidia.com/gpu: '1e400000' is larger")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "body: must be a JSON object with an `object` field, not a list"),
        ({}, "object: missing"),
        ({"object": POD, "policies": {}}, "policies: must be a list of GpuPolicy objects, not an object"),
        ({"object": POD, "policies": [{"metadata": []}]}, "policies[0].metadata: must be an object"),
        ({"object": POD, "policies": [None]}, "policies[0]: must be an object, not null"),
        ({"object": POD, "nodes": [{"metadata": {"labels": []}}]}, "nodes[0].metadata.labels: must be a map"),
        ({"object": POD, "namespace": {"name": 3}}, "namespace.name: must be a string, not a number"),
        ({"object": {"kind": ["Pod"]}}, "object.kind: must be a string, not a list"),
    ],
)
def test_dry_run_body(body: Any, message: str) -> None:
    assert dry_run_body_error(body).startswith(message)
