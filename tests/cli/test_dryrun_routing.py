"""`kubeon-gpu dry-run` shows the routing of CPU-only pods that tolerate the GPU taint, as the install's
switch (`--route-cpu-pods-on-gpu-nodes`, the chart's webhook.routeCpuPodsOnGpuNodes) sets it.

Real: the CLI in-process on real files (the repository's example policies). Faked: nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.helpers import EXAMPLES, dry_run

CPU_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "etl", "namespace": "inference"},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "4"}}}],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}


@pytest.mark.parametrize(("flags", "scheduler"), [((), "kubeon-gpu-scheduler"),
                                                  (("--route-cpu-pods-on-gpu-nodes", "false"), None)])
def test_dry_run_routes_as_the_install_would(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             flags: tuple[str, ...], scheduler: str | None) -> None:
    pods = tmp_path / "pod.yaml"
    pods.write_text(yaml.safe_dump(CPU_POD))
    run = dry_run(capsys, "-f", str(pods), "--policies", str(EXAMPLES / "policies.yaml"), "--metrics",
                  "-o", "json", *flags)
    assert run.code == 0, run.err
    (entry,) = json.loads(run.out)
    assert entry["object"]["spec"].get("schedulerName") == scheduler
