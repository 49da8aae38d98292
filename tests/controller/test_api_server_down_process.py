"""The API server down when the controller starts (a control-plane upgrade, a cluster still coming up): the
controller keeps trying and leads once the API server answers; the uninstall hook fails with one line.

Real: `kubeon-gpu controller` as a subprocess (Lease 2 s, renew every 0.4 s), its kubeconfig pointing at a
port on 127.0.0.1 where nothing listens at first; then the test API server started on that very port with
the GpuPolicy CRD. Faked: nothing. Before the fix, the first refused connection raised urllib3's
MaxRetryError (not an OSError) out of the lease loop: its thread died, the process stayed up with
/healthz and /readyz answering 200, and it never took the Lease.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kube.leases import get_lease
from tests.controller.conftest import POLICY_CRD
from tests.kubeapi.cluster import Cluster
from tests.loopback import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
LEASE = "kubeon-gpu-optimizer"


def kubeconfig_for(port: int, tmp: Path) -> Path:
    """What the test API server writes for itself (plain HTTP, an ignored token), written before it runs."""
    path = tmp / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: test, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: test, user: {token: kubeapi-test-token}}]\n"
        "contexts: [{name: test, context: {cluster: test, user: test}}]\n")
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_a_controller_started_before_the_api_server_leads_once_it_answers(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "controller.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "controller", "--kubeconfig", str(kubeconfig_for(port, tmp_path)),
         "--identity", "early", "--health-port", "0", "--health-bind", "127.0.0.1",
         "--lease-duration-seconds", "2", "--renew-seconds", "0.4", "--resync-seconds", "1"],
        cwd=REPO, env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "lease step failed" in log.read_text(), timeout=60,
                 what="a lease step against the refused port")
        assert process.poll() is None, log.read_text()
        with Cluster(crd_files=[POLICY_CRD], background=False, karpenter=False, port=port) as cluster:
            cluster.core.create_namespace({"metadata": {"name": "kubeon-gpu"}})
            lease = wait_for(lambda: (found := get_lease(cluster.api_client, "kubeon-gpu", LEASE))
                             and found.holder == "early" and found, timeout=60,
                             what="the controller to take the Lease once the API server answers")
            assert lease.holder == "early"
            assert "leadership acquired identity=early" in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)
    text = log.read_text()
    assert "Traceback" not in text and "Exception in thread" not in text, text


def test_uninstall_against_an_api_server_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "controller", "--uninstall",
         "--kubeconfig", str(kubeconfig_for(free_port(), tmp_path))],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith("ERROR uninstall failed: MaxRetryError: "), result.stderr
