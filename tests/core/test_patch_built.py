"""The admission patch walks only what the rewrite wrote, and equals the whole-object diff (property test).

mutate_pod builds its JSON Patch with `patch.diff` over the writable copy,
whose untouched values are shared with the pod: the walk follows only the
paths the rewrite wrote. The reference is the diff of two independent deep
copies (every key of every level compared). For generated pods and
policies, one test per rewrite kind (MIG auto and fixed, time-slicing,
the wanted-resource annotation when no node offers the slice, injected
tolerations and schedulerName, Recommend/Approve: no patch), both patches
are the same operations and, applied with jsonpatch (an independent RFC 6902
implementation), give the same object: the mutated pod.

Real: mutate_pod, the catalog, patch.diff, jsonpatch. Generated: pods and views.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupolicy.admission.mutate import Action, mutate_pod
from gpupolicy.patch import diff
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
    "inject": ({"packing": {"strategy": "binpack"}}, {}, Action.INJECT),
}


def check_same_patch(pod: dict, view) -> object:
    original = copy.deepcopy(pod)
    result = mutate_pod(pod, view)
    assert pod == original, "mutate_pod must not change its input"
    whole = diff(copy.deepcopy(original), copy.deepcopy(result.object))  # every level compared
    assert result.patch == whole
    assert apply(original, result.patch) == apply(original, whole) == result.object
    return result


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), product=st.sampled_from(PRODUCTS), mode=st.sampled_from(["Automatic", "Recommend", "Approve"]),
       inject=st.booleans())
def test_built_patch_equals_whole_object_diff(kind, pod, product, mode, inject) -> None:
    body, node_options, _ = KINDS[kind]
    extra = ({"scheduler": "kubeon-gpu-scheduler", "tolerations": [{"key": "pool", "operator": "Exists"}]}
             if inject or kind == "inject" else {})
    view = make_view(make_policy("p", mode=mode, approvals=["Pod/ml/p"], **extra, **body),
                     nodes=(make_node("n0", product, **node_options),))
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
        view = make_view(make_policy("p", **extra, **body), nodes=(make_node("n0", product, **node_options),))
        result = check_same_patch(copy.deepcopy(pod), view)
        assert result.patch, kind
        assert action in [d.action for d in result.decisions], kind
        if kind == "wanted-resource":
            assert any(op["path"].startswith("/metadata") for op in result.patch)
