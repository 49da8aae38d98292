"""The dry-run's out-of-scope fast path answers exactly what the full path (mutate, validate, diff) answers.

Two thirds of a cluster export ask for no GPU: `dry_run` answers those (and
pods in protected namespaces or marked to skip) from `out_of_scope` alone.
The reference is the same call with the fast path switched off. Real: the
core, bench/dryrun.py's generator (70% Pods, 30% Deployments, a third asking
for GPUs), the example policies and nodes, plus hand-made edge cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.dryrun import generate
from gpupolicy.admission import dryrun
from gpupolicy.admission.dryrun import dry_run
from gpupolicy.admission.validation import check_policy
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.cluster import ClusterView, node_from_object
from tests.cli.helpers import EXAMPLES

EDGES = [
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "no-spec", "namespace": "inference"},
     "spec": {"template": {"metadata": {"labels": {"app": "llm"}}}}},
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "null-spec", "namespace": "inference"},
     "spec": {"template": {"metadata": None, "spec": None}}},
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sys", "namespace": "kube-system"},
     "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "skip", "namespace": "inference",
                                                     "annotations": {"gpu.kubeon.io/skip": "true"}},
     "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
    {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cpu", "namespace": "batch"},
     "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}}}},
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "zero", "namespace": "inference"},
     "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "0"}}}]}},
]


def example_view() -> ClusterView:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "policies.yaml").read_text()) if d]
    policies = [check_policy(d, DEFAULT_CATALOG)[0] for d in docs if d["kind"] == "GpuPolicy"]
    namespaces = {d["metadata"]["name"]: d["metadata"].get("labels", {}) for d in docs if d["kind"] == "Namespace"}
    nodes = [d for d in yaml.safe_load_all((EXAMPLES / "nodes.yaml").read_text()) if d]
    return ClusterView(policies=tuple(policies), namespace_labels=namespaces,
                       nodes=tuple(node_from_object(n) for n in nodes))


def test_fast_path_answers_what_the_full_path_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "objects.yaml"
    generate(path, 1_500)
    objects = [d for d in yaml.load_all(path.read_bytes(), Loader=yaml.CSafeLoader) if d] + EDGES
    view = example_view()
    fast = [dry_run(obj, view).to_wire() for obj in objects]
    monkeypatch.setattr(dryrun, "out_of_scope", lambda *_: "")  # the full path for every object
    full = [dry_run(obj, view).to_wire() for obj in objects]
    assert fast == full
    skipped = sum(1 for answer in fast if answer.get("note") and not answer["patch"] and not answer["decisions"])
    assert skipped > len(objects) // 2  # the fast path really answered most of them
