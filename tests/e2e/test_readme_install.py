"""The README's "Install in a cluster" block, run line for line against the test cluster.

The commands are read from README.md (the bash block under that heading), so the docs and
this test cannot drift. Real: kubectl 1.35 and helm 4 from .tools/bin (protobuf bodies,
server-side apply, watch-list, pod logs), the chart, the test API server with the scheduler,
workload controller and kubelet stand-ins making the Deployments ready, and the optimizer's
own processes run in place of the chart's pods with the chart's arguments, secret volumes and
env (tests/e2e/inplace.py): the webhook serving the chart's generated certificate behind its
Service, the controller whose output is the pod log `kubectl logs` reads.

What the test adds around the README's lines, as a user's cluster would have it: the GPU
Operator's namespace (the README's stated prerequisite); the pods' processes (the kubelet's
job); waiting for the rollout and for the controller's first policy sync (its real output)
before reading logs, as a user runs that line once the controller is up (the README line
itself has no wait: run at once after `helm upgrade` it can find nothing yet); a self-hosted hub
(`kubeon-gpu hub serve`) holding the example policies, whose URL and token replace the README's
placeholders, so the controller pulls them before `kubectl get gpupolicies` lists them. Not covered: the
scheduler and extender pods' processes (their Deployments roll out, nothing runs them), images.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import CHART, REPO, Process
from tests.e2e.inplace import run_in_place
from tests.kubeapi.cluster import Cluster
from tests.kubeapi.fixtures import make_node
from tests.kubeapi.scheduler import ALL_SCHEDULERS

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
            pytest.skip(f"{tool} not in .tools/bin (scripts/install-test-deps.sh)")
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
    """The optimizer processes running in place of the chart's pods."""

    def __init__(self, cluster: Cluster, sh: Shell, workdir: Path) -> None:
        self.cluster, self.sh, self.workdir = cluster, sh, workdir
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
        process, ports = run_in_place(self.cluster, self.pod_of(deployment), self.workdir, **kwargs)
        self.running[deployment] = process
        return process, ports

    def stop(self, deployment: str | None = None) -> None:
        for name in [deployment] if deployment else list(self.running):
            if name in self.running:
                self.running.pop(name).stop()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # kubelet-style probes
def test_readme_install_block_runs_verbatim(cluster: Cluster, tmp_path: Path) -> None:
    from tests.hub.conftest import cli_in_process, start_hub

    # The README's hub and token are the user's: a self-hosted hub (`kubeon-gpu hub serve`) stands in,
    # holding the example policies, and its URL and token replace the README's two placeholders.
    hub = start_hub(f"sqlite:///{tmp_path}/hub.db")
    db = ["--db", hub.db]
    created = cli_in_process(*db, "token", "create", "--cluster", "prod-use1-a")
    assert created.returncode == 0, created.stderr
    applied = cli_in_process(*db, "policy", "apply", "--cluster", "prod-use1-a", "-f", str(EXAMPLES))
    assert applied.returncode == 0, applied.stderr
    token = created.stdout.splitlines()[-1]
    lines = [line.replace("<cluster token>", token).replace("https://acme.kubeon.io", hub.url)
             for line in readme_block()]
    helm_lines = [line for line in lines if line.startswith("helm upgrade --install")]
    assert len(helm_lines) == 1 and any(line.startswith("kubectl get gpupolicies") for line in lines), lines
    sh = Shell(cluster, tmp_path / "helm")
    pods = Pods(cluster, sh, tmp_path / "pods")
    cluster.ensure_namespace("gpu-operator")  # the README's prerequisite: the GPU Operator's namespace
    outputs: dict[str, str] = {}
    try:
        for line in lines:
            if line.startswith("kubectl get gpupolicies"):  # the controller pod's process pulls the hub's
                controller, _ = pods.start(RELEASE)  # policies; its output is the pod log `kubectl logs` reads
                cluster.wait_for(lambda c=controller: "policies synced" in c.log.read_text(), timeout=60,
                                 message=f"the controller's first policy sync:\n{controller.log_tail()}")
            outputs[line] = sh(line).stdout
            if line.startswith("helm upgrade --install"):
                _, ports = pods.start(f"{RELEASE}-webhook", tls=True)
                cluster.api.map_service(NAMESPACE, f"{RELEASE}-webhook", f"https://127.0.0.1:{ports['--port']}")
        deploy_line = next(line for line in lines if "get deploy" in line)
        assert re.search(rf"^{RELEASE}\s+\d/\d", outputs[deploy_line], re.M), outputs[deploy_line]
        listing = outputs[next(line for line in lines if line.startswith("kubectl get gpupolicies"))].splitlines()
        assert listing[0].split() == ["NAME", "KIND", "MODE", "PRIORITY", "HUB", "AGE"], listing
        rows = {row.split()[0]: row.split() for row in listing[1:]}
        assert rows["share-inference"][1:3] == ["sharing", "Automatic"]  # Kind: labelled by the real webhook
        assert rows["max-two-gpus"][1:3] == ["guardrail", "Recommend"]
        assert {row[4] for row in rows.values()} == {"Connected"}, listing  # synced from the hub
        logs_line = next(line for line in lines if " logs " in line)
        assert "policies synced count=4" in outputs[logs_line]

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

        # uninstall: nothing the chart made is left
        sh(f"helm -n {NAMESPACE} uninstall {RELEASE}")
        pods.stop()
        assert _left_of_ours(cluster) == _EXPECTED_LEFT
    finally:
        pods.stop()
        hub.stop()


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
