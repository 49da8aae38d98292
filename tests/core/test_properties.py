"""Property tests (hypothesis): mutation is idempotent and the patch differ agrees with jsonpatch.

Real: gpupolicy.admission.mutate_pod, gpupolicy.admission.patch.diff, the catalog; the
`jsonpatch` library applies patches. Generated: pods (containers, GPU
counts and resources, requests, tolerations, annotations, labels), policies
(strategy, mode, memory need, scheduler) and nodes.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupolicy.admission.mutate import mutate_pod
from gpupolicy.admission.patch import diff
from tests.core.builders import apply, make_node, make_policy, make_view

RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared", "cpu"]
PRODUCTS = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H200", "NVIDIA-A30", "Tesla-T4", "NVIDIA-H100-80GB-HBM3"]
keys = st.sampled_from(["a", "b/c", "x~y", "gpu.kubeon.io/skip", "app"])


@st.composite
def containers(draw):
    resource = draw(st.sampled_from(RESOURCES))
    count = draw(st.sampled_from(["0", "1", "1", "2", 1]))
    resources = {"limits": {resource: count}}
    if draw(st.booleans()):
        resources["requests"] = {resource: count}
    return {"name": draw(st.text("abc", min_size=1, max_size=3)), "resources": resources}


@st.composite
def pods(draw):
    metadata = {"name": "p", "namespace": draw(st.sampled_from(["ml", "web", "kube-system"]))}
    if draw(st.booleans()):
        metadata["labels"] = draw(st.dictionaries(keys, st.sampled_from(["true", "llm", ""]), max_size=3))
    if draw(st.booleans()):
        metadata["annotations"] = draw(st.dictionaries(
            st.sampled_from(["gpu.kubeon.io/gpu-memory", "note", "gpu.kubeon.io/policy"]),
            st.sampled_from(["8Gi", "17Gi", "500Gi", "junk", "x"]), max_size=2))
    spec = {"containers": draw(st.lists(containers(), min_size=1, max_size=3))}
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "volcano"]))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@st.composite
def views(draw):
    policies = []
    for i in range(draw(st.integers(1, 3))):
        body = draw(st.sampled_from([
            {"sharing": {"strategy": "MIG", "gpuMemory": "8Gi"}},
            {"sharing": {"strategy": "MIG", "gpuMemory": "20Gi", "gpuModels": ["NVIDIA-H200"]}},
            {"sharing": {"strategy": "MIG", "migProfile": "2g.20gb"}},
            {"sharing": {"strategy": "MIG"}},
            {"sharing": {"strategy": "TimeSlicing"}},
            {"guardrail": {"maxGpusPerPod": 1}},
            {"packing": {"strategy": "bestfit"}},
        ]))
        policies.append(make_policy(
            f"p{i}", mode=draw(st.sampled_from(["Automatic", "Recommend", "Approve", None])),
            priority=draw(st.integers(0, 2)), approvals=["Pod/ml/p"],
            scheduler=draw(st.sampled_from([None, "kubeon-gpu-scheduler"])),
            tolerations=draw(st.sampled_from([None, [{"key": "pool", "operator": "Exists"}]])), **body))
    nodes = tuple(make_node(f"n{i}", p) for i, p in enumerate(draw(st.lists(st.sampled_from(PRODUCTS),
                                                                             max_size=2))))
    return make_view(*policies, nodes=nodes, default_mode=draw(st.sampled_from(["Automatic", "Recommend"])))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), views())
def test_mutation_is_idempotent(pod, view) -> None:
    original = copy.deepcopy(pod)
    first = mutate_pod(pod, view)
    assert pod == original, "mutate_pod must not change its input"
    after = apply(pod, first.patch)
    assert after == first.object
    assert mutate_pod(after, view).patch == []
    assert all(len(w) < 120 for w in first.warnings)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text("ab/~", max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab/~", max_size=3), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text("ab/~", max_size=3), json_values, max_size=4),
       st.dictionaries(st.text("ab/~", max_size=3), json_values, max_size=4))
def test_diff_applies_with_jsonpatch(old, new) -> None:
    assert apply(old, diff(old, new)) == new
