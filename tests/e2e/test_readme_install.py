"""The README's "Install in a cluster" block, run line for line against the test cluster and a
real hub.

The commands are read from README.md (the bash block under that heading), so the docs and
this test cannot drift. Real: kubectl 1.35 and helm 4 from .tools/bin (protobuf bodies,
server-side apply, watch-list, pod logs), the chart, the test API server with the scheduler,
workload controller and kubelet stand-ins making the Deployments ready, and the optimizer's
own processes run in place of the chart's pods with the chart's arguments, secret volumes and
env (tests/e2e/inplace.py): the webhook serving the chart's generated certificate behind its
Service, the controller whose output is the pod log `kubectl logs` reads. The hub is a real
`kubeon-gpu hub serve` with a certificate for the README's hub host, reached at the README's
URL through an egress proxy (tests/e2e/egress.py: the cluster's internet, here), so `policies
synced` in the log is the controller's own line after a real pull of the hub's policy set.

What the test adds around the README's lines, as a user's cluster would have it: the GPU
Operator's namespace (the README's stated prerequisite); the hub's side (the cluster's token,
which replaces the README's `<cluster token>` placeholder as a user does, and one policy for
the cluster, put by the hub's admin API); the pods' processes (the kubelet's
job); waiting for the rollout and for the controller's first hub pull (its real output)
before reading logs, as a user runs that line once the controller is up (the README line
itself has no wait: run at once after `helm upgrade` it can find nothing yet); the example
policies applied before `kubectl get gpupolicies` so the listing has rows. Not covered: the
scheduler and extender pods' processes (their Deployments roll out, nothing runs them), images.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.conftest import CHART, REPO, Process
from tests.e2e.egress import Egress
from tests.e2e.inplace import run_in_place
from tests.hub.conftest import HubProcess, start_hub
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_node
from tests.kubeapi.scheduler import ALL_SCHEDULERS
from tests.missing import missing

NAMESPACE = "kubeon-gpu"
RELEASE = "kubeon-gpu-optimizer"
TOOLS = REPO / ".tools" / "bin"
EXAMPLES = REPO / "examples" / "policies.yaml"


def readme_block(heading: str = "## Install in a cluster") -> list[str]:
    """The commands of the first ```bash block after `heading`, continuation lines joined."""
    text = (REPO / "README.md").read_text()
    after = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block, f"no bash block under {heading!r} in README.md"
    joined = block.group(1).replace("\\\n", " ")
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    for tool in ("kubectl", "helm"):
        if not (TOOLS / tool).is_file():
            missing(f"{tool} not in .tools/bin (scripts/install-test-deps.sh)")
    with Cluster(nodes=[make_node("node-0", product=None, gpus=0)], crd_files=(), scheduler_name=ALL_SCHEDULERS,
                 karpenter=False) as running:
        yield running


class Shell:
    """Runs README lines with bash (pipefail) against the cluster, tools from .tools/bin first."""

    def __init__(self, cluster: Cluster, home: Path) -> None:
        self.env = {**os.environ, "PATH": f"{TOOLS}:{os.environ['PATH']}", "KUBECONFIG": cluster.kubeconfig,
                    "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_DATA_HOME": str(home / "data")}

    def __call__(self, line: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=120)
        if ok:
            assert proc.returncode == 0, f"{line}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc


class Pods:
    """The optimizer processes running in place of the chart's pods (`network`: the node's
    egress and trusted CAs)."""

    def __init__(self, cluster: Cluster, sh: Shell, workdir: Path, network: dict[str, str]) -> None:
        self.cluster, self.sh, self.workdir, self.network = cluster, sh, workdir, network
        self.running: dict[str, Process] = {}

    def pod_of(self, deployment: str) -> dict[str, Any]:
        self.sh(f"kubectl -n {NAMESPACE} rollout status deploy/{deployment} --timeout=60s")
        labels = self.cluster.apps.read_namespaced_deployment(deployment, NAMESPACE).spec.selector.match_labels
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        pods = [p for p in self.cluster.pods(NAMESPACE, selector) if not p["metadata"].get("deletionTimestamp")]
        assert pods, f"no pod of {deployment}"
        return sorted(pods, key=lambda p: p["metadata"]["name"])[0]

    def start(self, deployment: str, **kwargs: Any) -> tuple[Process, dict[str, int]]:
        self.stop(deployment)
        process, ports = run_in_place(self.cluster, self.pod_of(deployment), self.workdir, network=self.network,
                                      **kwargs)
        self.running[deployment] = process
        return process, ports

    def stop(self, deployment: str | None = None) -> None:
        for name in [deployment] if deployment else list(self.running):
            if name in self.running:
                self.running.pop(name).stop()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[HubProcess, str, str]]:
    """A real hub with a certificate for the README's hub host; (hub, url, cluster) from the README."""
    helm = next(line for line in readme_block() if line.startswith("helm upgrade --install"))
    url = re.search(r"--set hub\.url=(\S+)", helm)
    cluster = re.search(r"--set cluster=(\S+)", helm)
    assert url and cluster, f"the README's helm line sets no hub.url/cluster: {helm}"
    host = url.group(1).split("://", 1)[1].split("/")[0]
    process = start_hub(f"sqlite:///{tmp_path}/hub.db", tls=True, dns_names=(host,))
    yield process, url.group(1), cluster.group(1)
    process.stop()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # kubelet-style probes
def test_readme_install_block_runs_verbatim(cluster: Cluster, hub: tuple[HubProcess, str, str],
                                            tmp_path: Path) -> None:
    hub_process, hub_url, cluster_name = hub
    token = hub_process.cli("token", "create", "--cluster", cluster_name)
    assert token.returncode == 0, token.stderr
    put = hub_process.client().admin("PUT", f"/clusters/{cluster_name}/policies/share-from-hub", json={
        "spec": {"mode": "Recommend", "selector": {"namespaces": ["inference"]},
                 "sharing": {"strategy": "TimeSlicing"}}})
    assert put.status_code == 200, put.text
    host = hub_url.split("://", 1)[1].split("/")[0]
    egress = Egress({f"{host}:443": ("127.0.0.1", int(hub_process.url.rsplit(":", 1)[1]))})
    lines = [line.replace("<cluster token>", token.stdout.strip().splitlines()[-1]) for line in readme_block()]
    helm_lines = [line for line in lines if line.startswith("helm upgrade --install")]
    assert len(helm_lines) == 1 and any(line.startswith("kubectl get gpupolicies") for line in lines), lines
    sh = Shell(cluster, tmp_path / "helm")
    pods = Pods(cluster, sh, tmp_path / "pods", {**egress.env, "REQUESTS_CA_BUNDLE": str(hub_process.ca_file)})
    cluster.ensure_namespace("gpu-operator")  # the README's prerequisite: the GPU Operator's namespace
    outputs: dict[str, str] = {}
    try:
        for line in lines:
            if line.startswith("kubectl get gpupolicies"):
                sh(f"kubectl apply -f {EXAMPLES}")  # a user's policies, admitted by the running webhook
                # The controller pod's process (its output is the pod log) has written each one's mode.
                controller, _ = pods.start(RELEASE)
                cluster.wait_for(lambda: _all_have_a_mode(cluster), timeout=60,
                                 message=f"the controller's status writes:\n{controller.log_tail()}")
            if " logs " in line:
                cluster.wait_for(lambda c=controller: "policies synced count=1 revision=" in c.log.read_text(),
                                 timeout=60, message=f"the controller's hub pull:\n{controller.log_tail()}")
            outputs[line] = sh(line).stdout
            if line.startswith("helm upgrade --install"):
                _, ports = pods.start(f"{RELEASE}-webhook", tls=True)
                cluster.api.map_service(NAMESPACE, f"{RELEASE}-webhook", f"https://127.0.0.1:{ports['--port']}")
        deploy_line = next(line for line in lines if "get deploy" in line)
        assert re.search(rf"^{RELEASE}\s+\d/\d", outputs[deploy_line], re.M), outputs[deploy_line]
        listing = outputs[next(line for line in lines if line.startswith("kubectl get gpupolicies"))].splitlines()
        assert listing[0].split() == ["NAME", "KIND", "MODE", "REQUESTED", "PRIORITY", "HUB", "AGE"], listing
        rows = {row.split()[0]: row.split() for row in listing[1:]}
        # Kind: labelled by the real webhook. MODE: what is enforced; the guide's install has no
        # prometheus.url, so the Automatic sharing policy stays Recommend (REQUESTED says what it asks).
        assert rows["share-inference"][1:4] == ["sharing", "Recommend", "Automatic"]
        assert rows["max-two-gpus"][1:4] == ["guardrail", "Recommend", "Recommend"]
        logs_line = next(line for line in lines if " logs " in line)
        assert re.search(r"policies synced count=1 revision=\d+", outputs[logs_line]), outputs[logs_line]
        assert "share-from-hub" in sh("kubectl get gpupolicies -o name").stdout  # the pulled set, written

        # upgrade with a changed value: the controller's pod rolls to the new arguments
        upgrade = helm_lines[0].replace("--set defaultMode=Recommend", "--set defaultMode=Automatic")
        assert upgrade != helm_lines[0], "the README's helm line no longer sets defaultMode=Recommend"
        sh(upgrade)
        controller = pods.pod_of(RELEASE)
        assert "--default-mode=Automatic" in controller["spec"]["containers"][0]["args"]
        process, _ = pods.start(RELEASE)
        assert "--default-mode=Automatic" in " ".join(process.popen.args)  # type: ignore[arg-type]
        history = sh(f"helm -n {NAMESPACE} history {RELEASE}").stdout
        assert "Install complete" in history and "Upgrade complete" in history

        # uninstall: the pre-delete Job cleans up, then nothing the chart made is left
        hook = threading.Thread(target=_run_uninstall_hook, args=(cluster, tmp_path / "hook"), daemon=True)
        hook.start()
        sh(f"helm -n {NAMESPACE} uninstall {RELEASE}")
        hook.join(timeout=5)
        assert not hook.is_alive(), "helm uninstall ended before its pre-delete Job was run"
        pods.stop()
        assert _left_of_ours(cluster) == _EXPECTED_LEFT
    finally:
        pods.stop()
        egress.close()


def _all_have_a_mode(cluster: Cluster) -> bool:
    items = client.CustomObjectsApi(cluster.api_client).list_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies")["items"]
    return bool(items) and all((p.get("status") or {}).get("effectiveMode") for p in items)


def _run_uninstall_hook(cluster: Cluster, workdir: Path, timeout: float = 60.0) -> None:
    """Play the Job controller and kubelet for the chart's pre-delete Job: run its container's
    command (`kubeon-gpu controller --uninstall ...`) against the cluster, then mark the Job Complete."""
    batch = client.BatchV1Api(cluster.api_client)
    name = f"{RELEASE}-uninstall"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            job = batch.read_namespaced_job(name, NAMESPACE)
            break
        except client.ApiException:
            time.sleep(0.2)
    else:
        raise AssertionError("helm created no pre-delete Job")
    args = list(job.spec.template.spec.containers[0].args)
    workdir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "cli.main", *args, "--kubeconfig", cluster.kubeconfig],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    batch.patch_namespaced_job_status(name, NAMESPACE, {"status": {
        "succeeded": 1, "startTime": now, "completionTime": now,
        "conditions": [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                       {"type": "Complete", "status": "True", "lastTransitionTime": now}]}})


# What stays after `helm uninstall`, each for a reason outside the chart's control:
_EXPECTED_LEFT = {
    "customresourcedefinitions/gpupolicies.gpu.kubeon.io",  # Helm never deletes crds/ (Helm's CRD policy)
    "namespaces/kubeon-gpu",  # made by the README's `kubectl create namespace`
    "secrets/kubeon-gpu/kubeon-gpu-optimizer-token",  # made by the README's `kubectl create secret`
    "leases/kubeon-gpu/kubeon-gpu-optimizer",  # the controller's leader Lease (written at run time)
}


def _left_of_ours(cluster: Cluster) -> set[str]:
    """Every object in the release namespace and every cluster-scoped object named kubeon-*, by
    resource/namespace/name (pods and events excluded: gone with their owners / not ours)."""
    left = set()
    catalog = cluster.api.catalog
    for res in catalog.all():
        items, _ = cluster.api.store.list(res.key, None)
        for obj in items:
            meta = obj["metadata"]
            ns = meta.get("namespace", "")
            ours = ns == NAMESPACE or (not ns and "kubeon" in meta["name"]) or meta["name"] == NAMESPACE
            if ours and res.plural not in ("events", "gpupolicies"):
                left.add("/".join(p for p in (res.plural, ns, meta["name"]) if p))
    return left


def test_chart_is_where_the_readme_points() -> None:
    line = next(line for line in readme_block() if line.startswith("helm upgrade --install"))
    assert str(CHART.relative_to(REPO)) in line.split()
