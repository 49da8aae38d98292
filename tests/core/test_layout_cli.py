"""`kubeon-gpu layout`: the planner's answer offline, and clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.main import main
from tests.cluster.gpu_operator import parse_plugin_config, shared_replicas
from tests.cluster.objects import make_node, make_pod


def test_example_plans_a_new_key_and_a_mig_layout(capsys) -> None:
    assert main(["layout", "--example"]) == 0
    answer = yaml.safe_load(capsys.readouterr().out)
    ((key, text),) = answer["configMap"]["add"].items()
    assert shared_replicas(parse_plugin_config(text)) == (2, True)
    nodes = {n["name"]: n for n in answer["nodes"]}
    assert nodes["gpu-l4-1"]["labels"] == {"nvidia.com/device-plugin.config": key}
    assert nodes["gpu-l4-1"]["applies"] is False  # its policy is Recommend
    assert nodes["gpu-a100-2"]["labels"] == {"nvidia.com/mig.config": "all-2g.20gb"}
    assert nodes["gpu-a100-2"]["steps"][0] == "cordon" and answer["matchedOnCurrentLayout"] == 8


def test_files_and_approve(tmp_path: Path, capsys) -> None:
    pods = [make_pod(f"p{i}", "ml", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb") for i in range(3)]
    policy = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "mig"},
              "spec": {"mode": "Approve", "sharing": {"strategy": "MIG", "migProfile": "1g.10gb"}}}
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(make_node("gpu-7", gpus=1)))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump_all(pods))
    (tmp_path / "pol.yaml").write_text(yaml.safe_dump(policy))
    assert main(["layout", "--nodes", str(tmp_path / "n.yaml"), "--pods", str(tmp_path / "p.yaml"),
                 "--policies", str(tmp_path / "pol.yaml")]) == 0
    (node,) = yaml.safe_load(capsys.readouterr().out)["nodes"]
    assert node["reason"] == "node gpu-7: MIG all-1g.10gb serves 3 pending 1g.10gb pods; node is empty"
    assert node["applies"] is False and node["approve"] == "add 'Node/gpu-7' to spec.approvals"


def test_bad_input_names_the_file_and_exits_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "pol.yaml"
    bad.write_text("apiVersion: gpu.kubeon.io/v1alpha1\nkind: GpuPolicy\nmetadata: {name: x}\n"
                   "spec: {sharing: {strategy: Nope}}\n")
    empty = tmp_path / "e.yaml"
    empty.write_text("")
    assert main(["layout", "--nodes", str(empty), "--pods", str(empty), "--policies", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert f"kubeon-gpu layout: {empty}: empty file: no Kubernetes objects" in err
    assert any(line.startswith(f"kubeon-gpu layout: {bad}, document 1: spec.sharing.strategy") for line in err), err
    assert main(["layout", "--nodes", str(empty)]) == 2
    assert "give --nodes FILE, --pods FILE and --policies FILE" in capsys.readouterr().err


def _pod_with(change: str) -> dict:
    pod = make_pod("p0", "ml", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb")
    if change == "limits-list":
        pod["spec"]["containers"][0]["resources"]["limits"] = [1, 2]
    elif change == "quantity":
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "abc"
    elif change == "spec-list":
        pod["spec"] = [1]
    else:
        pod["metadata"] = [1]
    return pod


@pytest.mark.parametrize(("change", "field"), [
    ("limits-list", "spec.containers[0].resources.limits: must be a map, not a list"),
    ("quantity", "spec.containers[0].resources.limits.nvidia.com/mig-1g.10gb: 'abc' is not a quantity"),
    ("spec-list", "spec: must be an object, not a list"),
    ("metadata-list", "metadata: must be an object, not a list"),
])
def test_a_pod_of_the_wrong_shape_is_named_as_dry_run_names_it(tmp_path: Path, capsys, change: str,
                                                                field: str) -> None:
    """--pods were not checked: a list where a map belongs was an AttributeError traceback, "abc" as a
    quantity passed with exit 0."""
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(make_node("gpu-7", gpus=1)))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(_pod_with(change)))
    assert main(["layout", "--nodes", str(tmp_path / "n.yaml"), "--pods", str(tmp_path / "p.yaml"),
                 "--policies", "examples/policies.yaml"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"kubeon-gpu layout: {tmp_path / 'p.yaml'}, document 1: {field}"), err


@pytest.mark.parametrize("count", ["1e400", "NaN", "inf"])
def test_a_gpu_count_label_that_is_no_number_reads_as_unknown(tmp_path: Path, capsys, count: str) -> None:
    """`nvidia.com/gpu.count: "1e400"` was an OverflowError (and "NaN" a ValueError) in the planner, which
    the controller's layout pass runs on live Nodes too; such a label is no count."""
    node = make_node("gpu-7", gpus=1)
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = count
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(node))
    assert main(["layout", "--nodes", str(tmp_path / "n.yaml"), "--pods", "examples/pods.yaml",
                 "--policies", "examples/policies.yaml"]) == 0
    assert "nodes" in yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize(("value", "why"), [
    ("foo", "give NAMESPACE/NAME"),
    ("/", "namespace: label '' is not a DNS label"),
    ("gpu-operator/", "name: label '' is not a DNS label"),
    ("a/b/c", "name: label 'b/c' is not a DNS label"),
    ("gpu.operator/x", "namespace: a namespace has no dots"),
    ("gpu-operator/Time_Slicing", "name: label 'Time_Slicing' is not a DNS label"),
])
def test_a_configmap_no_api_server_could_hold_is_refused(value: str, why: str, capsys) -> None:
    """`/` and `a/b/c` printed a layout for ConfigMap namespace '' and name 'b/c'."""
    assert main(["layout", "--example", "--configmap", value]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"kubeon-gpu layout: --configmap: {value!r}: {why}"), line


def test_a_configmap_in_another_namespace_is_planned_there(capsys) -> None:
    assert main(["layout", "--example", "--configmap", "nvidia/plugin.config-1"]) == 0
    configmap = yaml.safe_load(capsys.readouterr().out)["configMap"]
    assert (configmap["namespace"], configmap["name"]) == ("nvidia", "plugin.config-1")


def _objects(out: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(out) if d]


def test_example_as_kubernetes_objects(capsys) -> None:
    """-o kubernetes: the plan's ConfigMap key and node labels as objects kubectl applies, each said in comments."""
    assert main(["layout", "--example"]) == 0
    plan = yaml.safe_load(capsys.readouterr().out)
    assert main(["layout", "--example", "-o", "kubernetes"]) == 0
    out = capsys.readouterr().out
    configmap, *nodes = _objects(out)
    assert configmap == {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "time-slicing-config", "namespace": "gpu-operator"},
                         "data": plan["configMap"]["add"]}
    assert {n["metadata"]["name"]: n for n in nodes} == {
        n["name"]: {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n["name"], "labels": n["labels"]}}
        for n in plan["nodes"]}
    assert out.startswith("# kubeon-gpu layout: the plan as objects")
    assert "kubectl apply --server-side --force-conflicts --field-manager=kubeon-gpu-layout -f FILE" in out
    assert ("# MIG, as the controller does it: kubectl cordon gpu-a100-2; apply; wait until its label "
            "nvidia.com/mig.config.state is success; kubectl uncordon gpu-a100-2\n") in out


LIVE_CONFIGMAP = {
    "apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "plugin-config", "namespace": "nvidia", "uid": "u-1", "resourceVersion": "42",
                 "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"team": "gpu"},
                 "managedFields": [{"manager": "kubectl-create", "operation": "Update"}],
                 "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "note": "keep"}},
    "data": {"any": "version: v1\n"},
}


def test_the_configmap_file_is_written_whole_with_the_keys_merged_in(tmp_path: Path, capsys) -> None:
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(LIVE_CONFIGMAP))
    assert main(["layout", "--example", "--configmap-file", str(tmp_path / "cm.yaml"), "-o", "kubernetes"]) == 0
    configmap = _objects(capsys.readouterr().out)[0]
    (key,) = set(configmap["data"]) - {"any"}
    assert configmap["metadata"] == {"name": "plugin-config", "namespace": "nvidia", "labels": {"team": "gpu"},
                                     "annotations": {"note": "keep"}}  # the server's fields dropped
    assert configmap["data"]["any"] == "version: v1\n" and key.startswith("kubeon-ts-r2-")

    # a key the ConfigMap holds already is not added again: nothing to write to it
    held = {**LIVE_CONFIGMAP, "data": {**LIVE_CONFIGMAP["data"], key: configmap["data"][key]}}
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(held))
    assert main(["layout", "--example", "--configmap-file", str(tmp_path / "cm.yaml")]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["configMap"] == {"namespace": "nvidia", "name": "plugin-config",
                                                                    "add": {}}
    assert main(["layout", "--example", "--configmap-file", str(tmp_path / "cm.yaml"), "-o", "kubernetes"]) == 0
    assert [o["kind"] for o in _objects(capsys.readouterr().out)] == ["Node", "Node"]


@pytest.mark.parametrize(("change", "message"), [
    ({"kind": "Secret"}, "document 1: kind: Secret: --configmap-file holds the time-slicing ConfigMap"),
    ({"data": {"x": 5}}, "document 1: data.x: must be a string, not int"),
    ({"data": ["x"]}, "document 1: data: must be a map of strings"),
    ({"metadata": {"name": "plugin-config"}}, "document 1: metadata.namespace: missing"),
])
def test_a_configmap_file_it_cannot_use_is_one_line_naming_the_field(tmp_path: Path, capsys, change: dict,
                                                                     message: str) -> None:
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump({**LIVE_CONFIGMAP, **change}))
    assert main(["layout", "--example", "--configmap-file", str(tmp_path / "cm.yaml"), "-o", "kubernetes"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"kubeon-gpu layout: {tmp_path / 'cm.yaml'}, {message}"), line


def test_a_configmap_file_of_another_configmap_than_named_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(LIVE_CONFIGMAP))
    assert main(["layout", "--example", "--configmap-file", str(tmp_path / "cm.yaml"),
                 "--configmap", "gpu-operator/time-slicing-config"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"kubeon-gpu layout: {tmp_path / 'cm.yaml'}, document 1: metadata: ConfigMap "
                    "nvidia/plugin-config is not the one --configmap names (gpu-operator/time-slicing-config)")


def test_a_label_apply_cannot_remove_is_a_command_in_the_comments(tmp_path: Path, capsys) -> None:
    """A time-sliced node going MIG drops its device-plugin.config label: server-side apply cannot (a null
    label becomes ""), so the header names the `kubectl label` that does; the Node sets the MIG label."""
    node = make_node("gpu-7", gpus=1, labels={"nvidia.com/device-plugin.config": "kubeon-ts-r4-dd8dd6f8",
                                              "nvidia.com/gpu.replicas": "4",
                                              "nvidia.com/mig.strategy": "mixed"})
    pods = [make_pod(f"p{i}", "ml", gpus=1, gpu_resource="nvidia.com/mig-1g.10gb") for i in range(3)]
    policy = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "mig"},
              "spec": {"mode": "Automatic", "sharing": {"strategy": "MIG", "migProfile": "1g.10gb"}}}
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(node))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump_all(pods))
    (tmp_path / "pol.yaml").write_text(yaml.safe_dump(policy))
    assert main(["layout", "--nodes", str(tmp_path / "n.yaml"), "--pods", str(tmp_path / "p.yaml"),
                 "--policies", str(tmp_path / "pol.yaml"), "-o", "kubernetes"]) == 0
    out = capsys.readouterr().out
    assert "#   kubectl label node gpu-7 nvidia.com/device-plugin.config-\n" in out, out
    assert _objects(out) == [{"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "gpu-7", "labels": {"nvidia.com/mig.config": "all-1g.10gb"}}}]
