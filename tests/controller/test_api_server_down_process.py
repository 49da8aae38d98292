"""The API server down when the controller starts (a control-plane upgrade, a cluster still coming up): the
controller keeps trying and leads once the API server answers; the uninstall hook fails with one line.

Real: `kubeon-gpu controller` as a subprocess (Lease 2 s, renew every 0.4 s) authenticated as the chart's
controller ServiceAccount; the real control plane (tests/cluster), its kube-apiserver stopped before the
controller starts and started again on the same port and etcd while it runs. Faked: nothing. Before the
fix, the first refused connection raised urllib3's MaxRetryError (not an OSError) out of the lease loop:
its thread died, the process stayed up with /healthz and /readyz answering 200, and it never took the
Lease.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from kube.leases import get_lease
from tests.controller.conftest import CONTROLLER_CLUSTER, Scene
from tests.loopback import free_port, wait_for

CLUSTER = CONTROLLER_CLUSTER
REPO = Path(__file__).resolve().parents[2]
LEASE = "kubeon-gpu-optimizer"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_a_controller_started_before_the_api_server_leads_once_it_answers(scene: Scene, tmp_path: Path) -> None:
    plane = scene.cluster.plane
    log = tmp_path / "controller.log"
    plane.children.stop_one(plane.children.get("kube-apiserver"), grace=0.1)  # its token was minted before
    down = True
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "controller", "--kubeconfig", scene.kubeconfig,
         "--identity", "early", "--health-port", "0", "--health-bind", "127.0.0.1",
         "--lease-duration-seconds", "2", "--renew-seconds", "0.4", "--resync-seconds", "1"],
        cwd=REPO, env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "lease step failed" in log.read_text(), timeout=60,
                 what="a lease step against the refused port")
        assert process.poll() is None, log.read_text()
        plane.start_apiserver()
        down = False
        lease = wait_for(lambda: (found := get_lease(scene.admin, "kubeon-gpu", LEASE))
                         and found.holder == "early" and found, timeout=60,
                         what="the controller to take the Lease once the API server answers")
        assert lease.holder == "early"
        assert "leadership acquired identity=early" in log.read_text()
    finally:
        if down:
            plane.start_apiserver()
        process.terminate()
        process.wait(timeout=30)
    text = log.read_text()
    assert "Traceback" not in text and "Exception in thread" not in text, text


def test_uninstall_against_an_api_server_that_is_not_there_is_one_line(scene: Scene, tmp_path: Path) -> None:
    config = yaml.safe_load(Path(scene.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "controller", "--uninstall", "--kubeconfig", str(kubeconfig)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith("ERROR uninstall failed: MaxRetryError: "), result.stderr
