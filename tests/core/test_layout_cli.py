"""`kubeon-gpu layout`: the planner's answer offline, and clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import yaml

from cli.main import main
from tests.kubeapi.fixtures import make_node, make_pod
from tests.kubeapi.gpu_operator import parse_plugin_config, shared_replicas


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
