"""`kubeon-gpu dry-run -f examples/dra.yaml`: a `via: DRA` policy's story offline (docs/designs/dra.md).

Real: the CLI in-process (cli.main.main) on the example file, its YAML and text output parsed back.
Faked: nothing; no cluster (the ResourceSlices in the file are skipped with a note).
"""

from __future__ import annotations

import pathlib

import pytest
import yaml

from tests.cli.helpers import EXAMPLES, PROG, dry_run

EXAMPLE = str(EXAMPLES / "dra.yaml")
TEMPLATE = "kubeon-mig-1g.18gb"


def test_the_pod_rewritten_and_its_template_as_an_entry(capsys: pytest.CaptureFixture[str]) -> None:
    run = dry_run(capsys, "-f", EXAMPLE, "-o", "yaml")
    assert run.code == 0 and run.errors() == [], run.err
    assert f"{PROG}note: {EXAMPLE}: skipped 2 ResourceSlice (dry-run evaluates Pod, Deployment, StatefulSet, " \
           "ReplicaSet, DaemonSet, Job, CronJob)" in run.notes()
    pod, template = yaml.safe_load_all(run.out)
    spec = pod["object"]["spec"]
    assert spec["resourceClaims"] == [{"name": "kubeon-claim-0", "resourceClaimTemplateName": TEMPLATE}]
    assert spec["containers"][0]["resources"] == {"limits": {}, "claims": [{"name": "kubeon-claim-0"}]}
    assert [d["action"] for d in pod["decisions"]] == ["UseResourceClaim"] and pod["decisions"][0]["applied"]
    assert pod.get("enforcedBelowRequested") is None  # via: DRA needs no GPU metrics
    obj = template["object"]
    assert (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]) == (
        "ResourceClaimTemplate", "inference", TEMPLATE)
    assert obj["metadata"]["labels"] == {"gpu.kubeon.io/managed-by": "kubeon-gpu-optimizer",
                                         "gpu.kubeon.io/policy": "mig-through-dra"}
    exactly = obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    assert "profile == '1g.18gb'" in exactly["selectors"][0]["cel"]["expression"]


def test_text_output_names_the_template_and_its_selector(capsys: pytest.CaptureFixture[str]) -> None:
    run = dry_run(capsys, "-f", EXAMPLE, "-o", "text")
    assert run.code == 0, run.err
    assert f"UseResourceClaim, applied: claim nvidia.com/gpu through ResourceClaimTemplate {TEMPLATE}" in run.out
    assert f"ResourceClaimTemplate inference/{TEMPLATE}: allowed" in run.out
    assert "request gpu: 1 x mig.nvidia.com" in run.out


SHARED = """\
apiVersion: gpu.kubeon.io/v1alpha1
kind: GpuPolicy
metadata: {name: ts-through-dra}
spec:
  mode: Automatic
  selector: {namespaces: [inference]}
  sharing: {strategy: TimeSlicing, via: DRA, replicas: 4}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: chat, namespace: inference}
spec:
  replicas: 2
  selector: {matchLabels: {app: chat}}
  template:
    metadata: {labels: {app: chat}}
    spec:
      containers:
      - name: server
        image: vllm/vllm-openai:v0.6.3
        resources: {limits: {nvidia.com/gpu: 1}}
"""


def test_a_time_slicing_policy_shows_its_shared_claim_as_an_entry(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    """A TimeSlicing `via: DRA` policy's pod names `kubeon-ts-<policy>-0`; the claim the controller creates
    follows as its own entry: one whole GPU, labelled ours, in the workload's namespace."""
    path = tmp_path / "ts.yaml"
    path.write_text(SHARED)
    run = dry_run(capsys, "-f", str(path), "-o", "yaml")
    assert run.code == 0 and run.errors() == [], run.err
    workload, claim = yaml.safe_load_all(run.out)
    spec = workload["object"]["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "kubeon-claim-0", "resourceClaimName": "kubeon-ts-ts-through-dra-0"}]
    assert [d["action"] for d in workload["decisions"]] == ["UseResourceClaim"] and workload["decisions"][0]["applied"]
    obj = claim["object"]
    assert (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]) == (
        "ResourceClaim", "inference", "kubeon-ts-ts-through-dra-0")
    assert obj["metadata"]["labels"] == {"gpu.kubeon.io/managed-by": "kubeon-gpu-optimizer",
                                         "gpu.kubeon.io/policy": "ts-through-dra"}
    exactly = obj["spec"]["devices"]["requests"][0]["exactly"]
    assert (exactly["deviceClassName"], exactly["count"]) == ("gpu.nvidia.com", 1)
    assert "the pods naming it share its one GPU" in claim["note"]

    text = dry_run(capsys, "-f", str(path), "-o", "text")
    assert text.code == 0, text.err
    assert "ResourceClaim inference/kubeon-ts-ts-through-dra-0: allowed" in text.out
    assert "request gpu: 1 x gpu.nvidia.com" in text.out
