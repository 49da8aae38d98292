"""The admission patch is built from the writes and equals the whole-object diff (property test).

mutate_pod builds its JSON Patch from its writes (gpupolicy.admission.writes:
each write appends the operation it makes), diffing nothing. The reference
is the diff of two independent deep copies of the pod before and after
(every key of every level compared). For generated pods and policies, one
test per rewrite kind (MIG auto and fixed, time-slicing, the
wanted-resource annotation when no node offers the slice, injected
tolerations and schedulerName, Recommend/Approve: no patch), both patches
are the same operations and, applied with jsonpatch (an independent RFC 6902
implementation), give the same object: the mutated pod.

The built patch lists its operations in the order of the writes, the diff in
the order of the object's keys. The operations at different paths touch
disjoint parts of the pod (no path lies inside another, checked), so any
order of them gives the same object; operations at one path (appended
tolerations) keep one order in both.

Real: mutate_pod, the catalog, patch.diff, jsonpatch. Generated: pods and views.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupolicy.admission.mutate import Action, mutate_pod
from gpupolicy.admission.patch import diff
from tests.core.builders import apply, make_node, make_policy, make_view
from tests.core.test_properties import PRODUCTS, pods

KINDS = {
    "mig-auto": ({"sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}}, {}, Action.USE_MIG),
    "mig-models": ({"sharing": {"strategy": "MIG", "gpuMemory": "20Gi", "gpuModels": ["NVIDIA-H200"]}}, {},
                   Action.USE_MIG),
    "mig-fixed": ({"sharing": {"strategy": "MIG", "migProfile": "2g.20gb"}}, {}, Action.USE_MIG),
    "time-slicing": ({"sharing": {"strategy": "TimeSlicing"}}, {}, Action.USE_TIME_SLICING),
    "wanted-resource": ({"sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}}, {"offers_slices": False},
                        Action.SKIP),
    "inject": ({"packing": {"strategy": "bestfit"}}, {}, Action.INJECT),
    # Nodes of two models with no profile in common: the pod is pinned (spec.nodeSelector written).
    "mig-pinned": ({"sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}}, {}, Action.USE_MIG),
    # `via: DRA`: spec.resourceClaims and containers' resources.claims written, nvidia.com/gpu removed
    "dra-mig": ({"sharing": {"strategy": "MIG", "via": "DRA", "gpuMemory": "8Gi"}}, {}, Action.USE_CLAIM),
    "dra-whole": ({"sharing": {"strategy": "MIG", "via": "DRA"}}, {}, Action.USE_CLAIM),
}
PINNED_NODES = (make_node("a", "NVIDIA-A100-SXM4-80GB"), make_node("h", "NVIDIA-H200"))
ABSENT = object()


@st.composite
def shaped_pods(draw):
    """`pods()` with the levels the writes make or merge into absent, null or already there (the
    generated pods always have metadata and spec, and never null ones)."""
    pod = draw(pods())
    levels = [(pod, "metadata", [ABSENT, None]), (pod["metadata"], "annotations", [None]),
              (pod["spec"], "tolerations", [None, []]), (pod["spec"], "schedulerName", [None, ""]),
              (pod["spec"], "nodeSelector", [None, {"kubernetes.io/os": "linux"}, {"a/b": "1", "c~d": "2"}])]
    for parent, key, shapes in levels:
        if draw(st.booleans()):
            shape = draw(st.sampled_from(shapes))
            if shape is ABSENT:
                parent.pop(key, None)
            else:
                parent[key] = copy.deepcopy(shape)
    return pod


def check_same_patch(pod: dict, view) -> object:
    original = copy.deepcopy(pod)
    result = mutate_pod(pod, view)
    assert pod == original, "mutate_pod must not change its input"
    whole = diff(copy.deepcopy(original), copy.deepcopy(result.object))  # every level compared
    assert by_path(result.patch) == by_path(whole)
    paths = sorted({op["path"] for op in result.patch})
    assert not [(p, q) for p in paths for q in paths if q.startswith(p + "/")], "operations overlap"
    assert apply(original, result.patch) == apply(original, whole) == result.object
    return result


def by_path(patch: list[dict]) -> list[dict]:
    """The operations sorted by path; those at one path keep their order (a stable sort)."""
    return sorted(patch, key=lambda op: op["path"])


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=shaped_pods(), product=st.sampled_from(PRODUCTS),
       mode=st.sampled_from(["Automatic", "Recommend", "Approve"]), inject=st.booleans())
def test_built_patch_equals_whole_object_diff(kind, pod, product, mode, inject) -> None:
    body, node_options, _ = KINDS[kind]
    extra = ({"scheduler": "kubeon-gpu-scheduler", "tolerations": [{"key": "pool", "operator": "Exists"}]}
             if inject or kind == "inject" else {})
    nodes = PINNED_NODES if kind == "mig-pinned" else (make_node("n0", product, **node_options),)
    view = make_view(make_policy("p", mode=mode, approvals=["Pod/ml/p", "Pod/default/p"], **extra, **body),
                     nodes=nodes)
    result = check_same_patch(pod, view)
    applied = [d.action for d in result.decisions if d.applied]
    if result.patch:
        assert applied or kind == "wanted-resource"


def test_every_rewrite_kind_is_reached() -> None:
    """The generated cases above really rewrite: one hand-made pod per kind gets its action applied."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    for kind, (body, node_options, action) in KINDS.items():
        extra = {"scheduler": "kubeon-gpu-scheduler"} if kind == "inject" else {}
        product = "NVIDIA-H200" if kind == "mig-models" else "NVIDIA-A100-SXM4-80GB"
        nodes = PINNED_NODES if kind == "mig-pinned" else (make_node("n0", product, **node_options),)
        view = make_view(make_policy("p", **extra, **body), nodes=nodes)
        result = check_same_patch(copy.deepcopy(pod), view)
        assert result.patch, kind
        assert action in [d.action for d in result.decisions], kind
        if kind == "wanted-resource":
            assert any(op["path"].startswith("/metadata") for op in result.patch)
        if kind == "mig-pinned":
            assert any(op["path"] == "/spec/nodeSelector" for op in result.patch)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_shape_of_the_written_levels(kind) -> None:
    """One rewritable pod per shape of each level the writes make or merge into (absent, null, empty,
    already there), for every rewrite kind: the same operations as the diff, applied the same."""
    body, node_options, _ = KINDS[kind]
    extra = {"scheduler": "kubeon-gpu-scheduler", "tolerations": [{"key": "pool", "operator": "Exists"}]}
    nodes = PINNED_NODES if kind == "mig-pinned" else (make_node("n0", "NVIDIA-A100-SXM4-80GB", **node_options),)
    view = make_view(make_policy("p", **extra, **body), nodes=nodes)
    base = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "annotations": {}},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "tolerations": [{"key": "x", "operator": "Exists"}], "schedulerName": "default-scheduler",
                     "nodeSelector": {"kubernetes.io/os": "linux"}}}
    assert check_same_patch(copy.deepcopy(base), view).patch
    for level, shapes in {"metadata": [ABSENT, None], "annotations": [ABSENT, None, {"note": "x"}],
                          "tolerations": [ABSENT, None, []], "schedulerName": [ABSENT, None, ""],
                          "nodeSelector": [ABSENT, None, {}]}.items():
        for shape in shapes:
            pod = copy.deepcopy(base)
            parent = pod if level == "metadata" else pod["metadata"] if level == "annotations" else pod["spec"]
            if shape is ABSENT:
                del parent[level]
            else:
                parent[level] = copy.deepcopy(shape)
            result = check_same_patch(pod, view)
            assert result.patch, (kind, level, shape)

