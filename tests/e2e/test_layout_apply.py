"""`kubeon-gpu layout -o kubernetes` applied by hand, as its output says, and read back.

Real: kubectl 1.35 from .tools/bin (server-side apply), the CLI as a subprocess on the example
nodes, pods and policies, and the real control plane (tests/cluster) holding those nodes and the GPU
Operator's time-slicing ConfigMap with a key of its own. The objects are read back with kubectl
alone, so the test runs unchanged against any cluster. Nothing is faked.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import yaml

from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import REPO
from tests.e2e import test_readme_install
from tests.e2e.test_readme_install import Shell

# the README test's fixtures: a bare real cluster (the test makes the GPU nodes and the ConfigMap)
cluster, network = test_readme_install.cluster, test_readme_install.network
EXAMPLES = REPO / "examples"
FILES = f"--nodes {EXAMPLES}/nodes.yaml --pods {EXAMPLES}/pods.yaml --policies {EXAMPLES}/policies.yaml"
LAYOUT = f"{shlex.quote(sys.executable)} -m cli.main layout {FILES}"


def test_the_plan_as_objects_applies_with_kubectl_and_reads_back(cluster: Cluster, tmp_path: Path) -> None:
    sh = Shell(cluster, tmp_path / "home")
    sh("kubectl create namespace gpu-operator")
    sh("kubectl -n gpu-operator create configmap time-slicing-config --from-literal=any='version: v1'")
    sh(f"kubectl create -f {EXAMPLES}/nodes.yaml")
    sh(f"kubectl -n gpu-operator get configmap time-slicing-config -o yaml > {tmp_path}/cm.yaml")

    plan = yaml.safe_load(sh(LAYOUT).stdout)
    objects = sh(f"{LAYOUT} --configmap-file {tmp_path}/cm.yaml -o kubernetes").stdout
    (tmp_path / "plan.yaml").write_text(objects)
    apply = objects.splitlines()[1].removeprefix("#").strip()
    assert apply.startswith("kubectl apply --server-side"), objects
    sh(apply.replace("-f FILE", f"-f {tmp_path}/plan.yaml"))

    data = json.loads(sh("kubectl -n gpu-operator get configmap time-slicing-config -o json").stdout)["data"]
    assert data == {"any": "version: v1", **plan["configMap"]["add"]}
    assert plan["configMap"]["add"] and plan["nodes"], plan
    for node in plan["nodes"]:
        labels = json.loads(sh(f"kubectl get node {node['name']} -o json").stdout)["metadata"]["labels"]
        assert labels.items() >= node["labels"].items(), (node["name"], labels)
        assert labels["nvidia.com/gpu.product"], "the node's other labels stay"
