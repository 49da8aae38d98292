"""`kubeon-gpu dry-run` offers the KEDA ScaledObject a ScaleToZero policy with `autoscale` wants (`scaledObjects`).

Real: the command line in-process (cli.main), examples/scale-to-zero.yaml, the KEDA ScaledObject CRD's
openAPIV3Schema (vendor/crds/keda.sh_scaledobjects.yaml) checked with jsonschema. Faked: nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.cli.helpers import EXAMPLES, ROOT, dry_run

EXAMPLE = str(EXAMPLES / "scale-to-zero.yaml")
KEDA_CRD = ROOT / "vendor" / "crds" / "keda.sh_scaledobjects.yaml"


def _keda_schema() -> dict[str, Any]:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    return dict(next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")["schema"]["openAPIV3Schema"])


def _by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["object"]["metadata"]["name"]: e for e in entries}


@pytest.mark.parametrize("output", ["json", "yaml", "jsonl"])
def test_selected_workload_gets_its_scaled_object_as_yaml(capsys: pytest.CaptureFixture[str], output: str) -> None:
    run = dry_run(capsys, "-f", EXAMPLE, "-o", output, "--prometheus-url", "http://prom.monitoring:9090")
    assert run.code == 0, run.err
    if output == "json":
        entries = json.loads(run.out)
    elif output == "yaml":
        entries = list(yaml.safe_load_all(run.out))
    else:
        entries = [json.loads(line) for line in run.out.splitlines()]
    found = _by_name(entries)
    [offer] = found["llm-chat"]["scaledObjects"]
    assert (offer["policy"], offer["name"]) == ("idle-research", "kubeon-gpu-llm-chat")
    scaled = yaml.safe_load(offer["yaml"])
    jsonschema.validate(scaled, _keda_schema())
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-chat"}
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 4)
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["metadata"]["serverAddress"] == "http://prom.monitoring:9090"
    assert trigger["metadata"]["threshold"] == "60"
    assert "&id" not in offer["yaml"] and "*id" not in offer["yaml"]
    assert "scaledObjects" not in found["nightly-eval"], "workloadSelector tier=interactive does not select it"


def test_text_output_shows_the_recommendation(capsys: pytest.CaptureFixture[str]) -> None:
    run = dry_run(capsys, "-f", EXAMPLE, "-o", "text")
    assert run.code == 0, run.err
    assert "idle-research recommends KEDA ScaledObject kubeon-gpu-llm-chat" in run.out
    assert "keda.enabled=true" in run.out and "kind: ScaledObject" in run.out
    assert "serverAddress: http://prometheus.invalid:9090" in run.out, "no --prometheus-url: a visible placeholder"


def test_a_higher_priority_policy_without_autoscale_claims_the_workload(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    """One workload, one ScaleToZero policy (the controller's claim): the first by priority decides."""
    docs = list(yaml.safe_load_all(Path(EXAMPLE).read_text()))
    first = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "park-only"},
             "spec": {"priority": 50, "scaleToZero": {"namespaces": ["research"], "idleFor": "1h"}}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([first, *docs]))
    run = dry_run(capsys, "-f", str(path), "-o", "json")
    assert run.code == 0, run.err
    assert all("scaledObjects" not in e for e in json.loads(run.out))


def test_pods_and_other_namespaces_get_none(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all(Path(EXAMPLE).read_text()))
    deployment = docs[1]
    elsewhere = {**deployment, "metadata": {**deployment["metadata"], "namespace": "inference"}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "research", "labels": {"tier": "interactive"}},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    path = tmp_path / "others.yaml"
    path.write_text(yaml.safe_dump_all([docs[0], elsewhere, pod]))
    run = dry_run(capsys, "-f", str(path), "-o", "json")
    assert run.code == 0, run.err
    assert [("scaledObjects" in e) for e in json.loads(run.out)] == [False, False]
