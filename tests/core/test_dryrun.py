"""Dry-run over Pods and workloads (core) and the `kubeon-gpu dry-run` CLI.

Real: gpupolicy.admission.dryrun, the CLI entry point (cli.main.main) run in-process on
real YAML files in a temp directory, the embedded examples; patches applied
with the `jsonpatch` library. Faked: nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli.main import main
from gpupolicy.admission.dryrun import DryRunError, dry_run, view_for_request
from tests.core.builders import apply, make_pod, make_policy, make_view

CONTAINER = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
TEMPLATE = {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": [CONTAINER]}}
WORKLOADS = {
    "Deployment": ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": "ml"},
                    "spec": {"template": TEMPLATE}}, "/spec/template/spec/containers/0"),
    "StatefulSet": ({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "llm", "namespace": "ml"},
                     "spec": {"template": TEMPLATE}}, "/spec/template/spec/containers/0"),
    "Job": ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llm", "namespace": "ml"},
             "spec": {"template": {"spec": {"containers": [CONTAINER]}}}}, "/spec/template/spec/containers/0"),
    "CronJob": ({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "llm", "namespace": "ml"},
                 "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": TEMPLATE}}}},
                "/spec/jobTemplate/spec/template/spec/containers/0"),
    "Pod": (make_pod(), "/spec/containers/0"),
}


@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_workloads_patched_through_pod_template(kind: str) -> None:
    obj, container_path = WORKLOADS[kind]
    view = make_view(make_policy())
    result = dry_run(obj, view)
    assert result.allowed
    assert f"{container_path}/resources/limits/nvidia.com~1gpu" in [op["path"] for op in result.patch]
    after = apply(obj, result.patch)
    assert after == result.object
    assert dry_run(after, view).patch == []


@pytest.mark.parametrize("owner_kind", ["Deployment", "CronJob"])
def test_workload_is_the_owner_for_approvals(owner_kind: str) -> None:
    obj, _ = WORKLOADS[owner_kind]
    approved = make_view(make_policy(mode="Approve", approvals=[f"{owner_kind}/ml/llm"]))
    other = make_view(make_policy(mode="Approve", approvals=["Deployment/ml/other"]))
    assert dry_run(obj, approved).patch
    assert dry_run(obj, other).patch == []


def test_guardrail_runs_on_mutated_pod() -> None:
    view = make_view(make_policy(), make_policy("guard", guardrail={"allowedGpuResources": ["nvidia.com/gpu"]}))
    result = dry_run(make_pod(), view)
    assert not result.allowed and "nvidia.com/mig-1g.10gb is not in allowedGpuResources" in result.message


@pytest.mark.parametrize(
    ("obj", "message"),
    [("pod", "object: must be"), ({"kind": "ConfigMap"}, "object.kind: 'ConfigMap'"),
     ({"kind": "Deployment", "metadata": {"name": "x"}, "spec": {}}, "object.spec.template: missing")],
    ids=["not-object", "unsupported-kind", "no-template"],
)
def test_bad_objects(obj, message: str) -> None:
    with pytest.raises(DryRunError, match=message.replace("(", r"\(").replace("[", r"\[")):
        dry_run(obj, make_view())


def test_request_view_overrides() -> None:
    body = {"policies": [make_policy("from-body").to_wire()],
            "namespace": {"name": "ml", "labels": {"team": "a"}},
            "nodes": [{"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}]}
    view = view_for_request(body, make_view(make_policy("base")))
    assert [p.name for p in view.policies] == ["from-body"]
    assert view.labels_of_namespace("ml")["team"] == "a"
    assert view.node_products()[0].product == "NVIDIA-H200"
    with pytest.raises(DryRunError, match=r"policies\[0\]\.spec\.mode"):
        view_for_request({"policies": [{"metadata": {"name": "x"}, "spec": {"mode": "No", "guardrail": {}}}]},
                         make_view())


def write(tmp_path: Path, name: str, docs: list) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return str(path)


def test_cli_example_is_readable(capsys) -> None:
    assert main(["dry-run", "--example"]) == 0
    out = capsys.readouterr().out
    assert "Deployment inference/llm-small: allowed" in out
    assert "[Automatic] UseMIG, applied" in out
    assert "[Recommend] UseTimeSlicing, not applied" in out
    assert "approve CronJob/batch/nightly-eval" in out


def test_cli_file_json_output(tmp_path: Path, capsys) -> None:
    pods = write(tmp_path, "pod.yaml", [make_pod()])
    policies = write(tmp_path, "policies.yaml", [make_policy().to_wire()])
    assert main(["dry-run", "-f", pods, "--policies", policies, "-o", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert set(answer) >= {"allowed", "object", "patch", "warnings", "decisions"}
    assert answer["decisions"][0] == {"policy": "share", "mode": "Automatic", "action": "UseMIG",
                                      "applied": True, "reason": answer["decisions"][0]["reason"]}


def test_cli_yaml_output_and_nodes(tmp_path: Path, capsys) -> None:
    pods = write(tmp_path, "pod.yaml", [make_pod(annotations={"gpu.kubeon.io/gpu-memory": "17Gi"})])
    policies = write(tmp_path, "p.yaml", [make_policy().to_wire()])
    nodes = write(tmp_path, "n.yaml", [{"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "h", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/mig.config": "all-1g.35gb"}}}])
    assert main(["dry-run", "-f", pods, "--policies", policies, "--nodes", nodes]) == 0
    answer = yaml.safe_load(capsys.readouterr().out)
    assert "nvidia.com/mig-1g.35gb" in answer["object"]["spec"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"pod.yaml": "a: [1"}, "pod.yaml: line 1 not valid YAML"),
        ({"pod.yaml": "- 1\n"}, "pod.yaml: document 1 is not a Kubernetes object"),
        ({"pod.yaml": None}, "pod.yaml: No such file"),
        ({"pod.yaml": "kind: ConfigMap\nmetadata: {name: c}\n"}, "object.kind: 'ConfigMap'"),
        ({"pod.yaml": yaml.safe_dump(make_pod()),
          "policies.yaml": "kind: GpuPolicy\nmetadata: {name: bad}\nspec: {mode: Often, guardrail: {}}\n"},
         "policies.yaml: GpuPolicy bad: spec.mode: Input should be"),
    ],
    ids=["yaml-syntax", "not-object", "missing-file", "unsupported-kind", "bad-policy"],
)
def test_cli_bad_files_one_line_exit_2(tmp_path: Path, capsys, files: dict, message: str) -> None:
    args = ["dry-run"]
    for name, text in files.items():
        if text is not None:
            (tmp_path / name).write_text(text, encoding="utf-8")
        args += ["-f" if name == "pod.yaml" else "--policies", str(tmp_path / name)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
