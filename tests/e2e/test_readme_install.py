"""The README's "Install in a cluster" block, run line for line against a real kube-apiserver and
a real hub.

The commands are read from README.md (the bash block under that heading), so the docs and this
test cannot drift. Real: kubectl 1.35 and helm 4 from .tools/bin, the chart, kube-apiserver v1.35
(tests/cluster) with kube-controller-manager (Deployments, ReplicaSets, the Job of the uninstall
hook, garbage collection), the default kube-scheduler and KWOK. The hub is a real `kubeon-gpu hub
serve` with a certificate for the README's hub host, reached at the README's URL through an egress
proxy (tests/e2e/egress.py: the cluster's internet, here).

What KWOK cannot do, and what stands in for it:
- KWOK marks the chart's pods Running without running them, so most of what is checked is what the
  API server holds (objects, Deployments rolled out, what is left after uninstall). Two pods are run
  in place by the test, as a kubelet would (tests/e2e/inplace.py: the pod's args, env and secret
  volumes, as the pod's ServiceAccount): the webhook, serving the certificate helm generated, and
  the controller, which pulls the hub's policy set and writes each policy's status.
- There is no Service network (no kube-proxy): kube-apiserver calls the webhook through the helm-made
  webhook configurations at `kubeon-gpu-optimizer-webhook.kubeon-gpu.svc:443` (its own service
  resolution and TLS check against the helm-made caBundle), its HTTPS_PROXY being a stand-in for the
  Service routing: the Service's port -> targetPort -> the in-place pod's port.
- There is no kubelet to serve `kubectl logs`: the README's logs line is not run; the controller's
  own output (what that line would show) is read instead.
- The uninstall hook is a Job: the real Job controller creates its pod and the default scheduler
  binds it to a node the test plays the kubelet of (the KWOK node is cordoned first: KWOK would
  complete the pod without running it). The test runs the hook container's command as the hook's
  ServiceAccount, reports the pod Succeeded, and the real Job controller completes the Job that
  `helm uninstall` waits for.

What the test adds around the README's lines, as a user's cluster would have it: the GPU
Operator's namespace (the README's stated prerequisite); a node; the hub's side (the cluster's
token, which replaces the README's `<cluster token>` placeholder as a user does, and one policy for
the cluster, put by the hub's admin API); waiting for the rollout and for the controller's first hub
pull before reading its output; the example policies applied before `kubectl get gpupolicies` so
the listing has rows. Not covered: the scheduler and extender pods' processes, images.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.cluster import Cluster
from tests.cluster.fixtures import start_cluster
from tests.cluster.kubeon import CHART, REPO, token_kubeconfig
from tests.cluster.objects import make_node
from tests.cluster.processes import Child
from tests.e2e.egress import Egress
from tests.e2e.inplace import run_in_place
from tests.hub.conftest import HubProcess, start_hub
from tests.missing import missing

NAMESPACE = "kubeon-gpu"
RELEASE = "kubeon-gpu-optimizer"
TOOLS = REPO / ".tools" / "bin"
EXAMPLES = REPO / "examples" / "policies.yaml"
HOOK_NODE = "hook-runner"


def readme_block(heading: str = "## Install in a cluster") -> list[str]:
    """The commands of the first ```bash block after `heading`, continuation lines joined."""
    text = (REPO / "README.md").read_text()
    after = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block, f"no bash block under {heading!r} in README.md"
    joined = block.group(1).replace("\\\n", " ")
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture
def network() -> Iterator[Egress]:
    """The way out of the cluster: to the hub (the controller's) and to Services (kube-apiserver's)."""
    egress = Egress({})
    yield egress
    egress.close()


@pytest.fixture
def cluster(network: Egress) -> Iterator[Cluster]:
    for tool in ("kubectl", "helm"):
        if not (TOOLS / tool).is_file():
            missing(f"{tool} not in .tools/bin (scripts/install-test-deps.sh)")
    running = start_cluster(gpu_operator=False, apiserver_env=network.env)
    try:
        running.create_node(make_node("node-0", product=None, gpus=0))
        yield running
    finally:
        running.stop()


class Shell:
    """Runs README lines with bash (pipefail) against the cluster, tools from .tools/bin first."""

    def __init__(self, cluster: Cluster, home: Path) -> None:
        self.env = {**os.environ, "PATH": f"{TOOLS}:{os.environ['PATH']}", "KUBECONFIG": str(cluster.kubeconfig),
                    "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_DATA_HOME": str(home / "data")}

    def __call__(self, line: str, ok: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if ok:
            assert proc.returncode == 0, f"{line}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc


class Pods:
    """The optimizer processes running in place of the chart's pods (`network`: the node's
    egress and trusted CAs)."""

    def __init__(self, cluster: Cluster, sh: Shell, workdir: Path, network: dict[str, str]) -> None:
        self.cluster, self.sh, self.workdir, self.network = cluster, sh, workdir, network
        self.running: dict[str, Child] = {}

    def pod_of(self, deployment: str) -> dict[str, Any]:
        """The rolled-out Deployment's pod of its newest ReplicaSet."""
        self.sh(f"kubectl -n {NAMESPACE} rollout status deploy/{deployment} --timeout=120s")
        sets = [rs for rs in self.cluster.apps.list_namespaced_replica_set(NAMESPACE).items
                if any(o.name == deployment for o in rs.metadata.owner_references or [])]
        newest = max(sets, key=lambda rs: int(rs.metadata.annotations["deployment.kubernetes.io/revision"]))
        pods = self.cluster.pods(NAMESPACE, f"pod-template-hash={newest.metadata.labels['pod-template-hash']}")
        assert pods, f"no pod of {deployment}"
        return pods[0]

    def start(self, deployment: str, **kwargs: Any) -> tuple[Child, dict[str, Any], dict[int, int]]:
        """Run the Deployment's pod in place: (process, pod, local port by container port)."""
        self.stop(deployment)
        pod = self.pod_of(deployment)
        process, ports = run_in_place(self.cluster, pod, self.workdir, network=self.network, **kwargs)
        self.running[deployment] = process
        return process, pod, ports

    def stop(self, deployment: str | None = None) -> None:
        for name in [deployment] if deployment else list(self.running):
            if name in self.running:
                self.cluster.plane.children.stop_one(self.running.pop(name))


def route_service(cluster: Cluster, network: Egress, service: str, pod: dict[str, Any],
                  ports: dict[int, int]) -> None:
    """What kube-proxy would do for kube-apiserver: `<service>.<ns>.svc:<port>` to the pod behind
    it, here the in-place process (the Service's targetPort named on the pod's container)."""
    svc = cluster.core.read_namespaced_service(service, NAMESPACE)
    container_ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0].get("ports") or []}
    for port in svc.spec.ports:
        target = port.target_port
        container_port = container_ports[target] if isinstance(target, str) else int(target)
        network.routes[f"{service}.{NAMESPACE}.svc:{port.port}"] = ("127.0.0.1", ports[container_port])


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


def test_readme_install_block_runs_verbatim(cluster: Cluster, network: Egress,
                                            hub: tuple[HubProcess, str, str], tmp_path: Path) -> None:
    hub_process, hub_url, cluster_name = hub
    token = hub_process.cli("token", "create", "--cluster", cluster_name)
    assert token.returncode == 0, token.stderr
    put = hub_process.client().admin("PUT", f"/clusters/{cluster_name}/policies/share-from-hub", json={
        "spec": {"mode": "Recommend", "selector": {"namespaces": ["inference"]},
                 "sharing": {"strategy": "TimeSlicing"}}})
    assert put.status_code == 200, put.text
    host = hub_url.split("://", 1)[1].split("/")[0]
    network.routes[f"{host}:443"] = ("127.0.0.1", int(hub_process.url.rsplit(":", 1)[1]))
    lines = [line.replace("<cluster token>", token.stdout.strip().splitlines()[-1]) for line in readme_block()]
    helm_lines = [line for line in lines if line.startswith("helm upgrade --install")]
    assert len(helm_lines) == 1 and any(line.startswith("kubectl get gpupolicies") for line in lines), lines
    sh = Shell(cluster, tmp_path / "helm")
    pods = Pods(cluster, sh, tmp_path / "pods", {**network.env, "REQUESTS_CA_BUNDLE": str(hub_process.ca_file)})
    cluster.ensure_namespace("gpu-operator")  # the README's prerequisite: the GPU Operator's namespace
    outputs: dict[str, str] = {}
    controller: Child | None = None
    try:
        for line in lines:
            if line.startswith("kubectl get gpupolicies"):
                sh(f"kubectl apply -f {EXAMPLES}")  # a user's policies, admitted by the webhook behind its Service
                # The controller pod's process has written each one's mode.
                controller, _, _ = pods.start(RELEASE)
                cluster.wait_for(lambda: _all_have_a_mode(cluster), timeout=90,
                                 message=f"the controller's status writes:\n{controller.tail()}")
            if " logs " in line:  # no kubelet serves `kubectl logs`: the controller's own output instead
                assert controller is not None
                synced = cluster.wait_for(lambda c=controller: _grep(c, "policies synced"), timeout=90,
                                          message=f"the controller's hub pull:\n{controller.tail()}")
                outputs[line] = synced
                continue
            outputs[line] = sh(line).stdout
            if line.startswith("helm upgrade --install"):
                _, pod, ports = pods.start(f"{RELEASE}-webhook", tls=True)
                route_service(cluster, network, f"{RELEASE}-webhook", pod, ports)
        deploy_line = next(line for line in lines if "get deploy" in line)
        assert re.search(rf"^{RELEASE}\s+\d/\d", outputs[deploy_line], re.M), outputs[deploy_line]
        listing = outputs[next(line for line in lines if line.startswith("kubectl get gpupolicies"))].splitlines()
        assert listing[0].split() == ["NAME", "KIND", "MODE", "REQUESTED", "PRIORITY", "HUB", "VIA", "AGE"], listing
        rows = {row.split()[0]: row.split() for row in listing[1:]}
        # Kind: labelled by the real webhook, called by kube-apiserver through the helm-made configuration.
        # MODE: what is enforced; the guide's install has no prometheus.url, so the Automatic sharing
        # policy stays Recommend (REQUESTED says what it asks).
        assert rows["share-inference"][1:4] == ["sharing", "Recommend", "Automatic"]
        assert rows["max-two-gpus"][1:4] == ["guardrail", "Recommend", "Recommend"]
        logs_line = next(line for line in lines if " logs " in line)
        assert re.search(r"policies synced count=1 revision=\d+", outputs[logs_line]), outputs[logs_line]
        assert "share-from-hub" in sh("kubectl get gpupolicies -o name").stdout  # the pulled set, written

        # upgrade with a changed value: the controller's pod rolls to the new arguments
        upgrade = helm_lines[0].replace("--set defaultMode=Recommend", "--set defaultMode=Automatic")
        assert upgrade != helm_lines[0], "the README's helm line no longer sets defaultMode=Recommend"
        sh(upgrade)
        process, pod, _ = pods.start(RELEASE)
        assert "--default-mode=Automatic" in pod["spec"]["containers"][0]["args"]
        assert "--default-mode=Automatic" in " ".join(process.popen.args)  # type: ignore[arg-type]
        history = sh(f"helm -n {NAMESPACE} history {RELEASE}").stdout
        assert "Install complete" in history and "Upgrade complete" in history

        # uninstall: the pre-delete Job's command runs, then nothing the chart made is left
        pods.stop()
        sh("kubectl cordon node-0")  # KWOK would complete the hook's pod without running it
        # what a capacity drain leaves on a node: the hook removes the optimizer's gpu.kubeon.io/* labels
        sh("kubectl label node node-0 gpu.kubeon.io/draining=true")
        cluster.core.create_node(make_node(HOOK_NODE, product=None, gpus=0))  # a node the test is the kubelet of
        hook = HookKubelet(cluster, tmp_path / "hook")
        hook.start()
        sh(f"helm -n {NAMESPACE} uninstall {RELEASE}")
        hook.join(timeout=30)
        assert not hook.is_alive() and hook.error is None, hook.error or "the hook's pod never ran"
        assert "uninstall woke=- records-removed=- nodes-cleaned=node-0 " in hook.output, hook.output
        labels = cluster.core.read_node("node-0").metadata.labels
        assert "gpu.kubeon.io/draining" not in labels, "the hook's command ran, as the hook's ServiceAccount"
        left: set[str] = set()

        def settled() -> bool:  # garbage collection and KWOK take the pods and endpoints a moment
            left.clear()
            left.update(_left_of_ours(cluster))
            return left == _EXPECTED_LEFT

        with contextlib.suppress(AssertionError):
            cluster.wait_for(settled, timeout=120)
        assert left == _EXPECTED_LEFT
    finally:
        pods.stop()


def _grep(process: Child, word: str) -> str:
    return "\n".join(line for line in process.log.read_text(errors="replace").splitlines() if word in line)


def _all_have_a_mode(cluster: Cluster) -> bool:
    items = client.CustomObjectsApi(cluster.api_client).list_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies")["items"]
    return bool(items) and all((p.get("status") or {}).get("effectiveMode") for p in items)


class HookKubelet(threading.Thread):
    """The kubelet of one node for the chart's pre-delete Job: once the real Job controller's pod is
    bound here, run its container's command (`kubeon-gpu controller --uninstall ...`) with its env, as
    its ServiceAccount, and report the pod Succeeded (or Failed), so the Job controller completes the
    Job that `helm uninstall` waits for."""

    def __init__(self, cluster: Cluster, workdir: Path, timeout: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.cluster, self.workdir, self.timeout = cluster, workdir, timeout
        self.output = ""
        self.error: str | None = None

    def run(self) -> None:
        try:
            pod = self.cluster.wait_for(self._bound_pod, timeout=self.timeout,
                                        message=f"the uninstall hook's pod on {HOOK_NODE}")
            self._run(pod)
        except BaseException as exc:  # reported to the test thread
            self.error = f"{type(exc).__name__}: {exc}"

    def _bound_pod(self) -> dict[str, Any] | None:
        pods = self.cluster.pods(NAMESPACE, f"job-name={RELEASE}-uninstall", bound=True)
        return next((p for p in pods if p["spec"]["nodeName"] == HOOK_NODE), None)

    def _run(self, pod: dict[str, Any]) -> None:
        meta, container = pod["metadata"], pod["spec"]["containers"][0]
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = token_kubeconfig(self.cluster.plane, self.cluster.api_client, pod["spec"]["serviceAccountName"],
                                      NAMESPACE, self.workdir / "kubeconfig")
        env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}}
        started = _now()
        done = subprocess.run([sys.executable, "-m", "cli.main", *container["args"], "--kubeconfig", str(kubeconfig)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
        self.output = done.stdout + done.stderr
        phase, reason = ("Succeeded", "Completed") if done.returncode == 0 else ("Failed", "Error")
        terminated = {"exitCode": done.returncode, "reason": reason, "startedAt": started, "finishedAt": _now()}
        self.cluster.core.patch_namespaced_pod_status(meta["name"], NAMESPACE, {"status": {
            "phase": phase, "startTime": started,
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"},
                           {"type": "ContainersReady", "status": "False", "reason": "PodCompleted"},
                           {"type": "Initialized", "status": "True"}],
            "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                   "ready": False, "restartCount": 0, "started": False,
                                   "state": {"terminated": terminated}}]}})
        if done.returncode != 0:
            raise AssertionError(f"the uninstall hook's command failed ({done.returncode}):\n{self.output}")


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# What stays after `helm uninstall`, each for a reason outside the chart's control:
_EXPECTED_LEFT = {
    "CustomResourceDefinition/gpupolicies.gpu.kubeon.io",  # Helm never deletes crds/ (Helm's CRD policy)
    "APIService/v1alpha1.gpu.kubeon.io",  # kube-apiserver's own for the CRD's group version: goes with the CRD
    "Namespace/kubeon-gpu",  # made by the README's `kubectl create namespace`
    "Secret/kubeon-gpu/kubeon-gpu-optimizer-token",  # made by the README's `kubectl create secret`
    "Lease/kubeon-gpu/kubeon-gpu-optimizer",  # the controller's leader Lease (written at run time)
    "ServiceAccount/kubeon-gpu/default",  # every namespace's own (kube-controller-manager)
    "ConfigMap/kubeon-gpu/kube-root-ca.crt",  # every namespace's own (kube-controller-manager)
}


def _left_of_ours(cluster: Cluster) -> set[str]:
    """Every object in the release namespace and every object named kubeon-* anywhere, by
    Kind/namespace/name, listed through discovery of every resource the API server serves (Events
    excluded: not ours to delete; GpuPolicies: the user's, kept with the CRD)."""
    left = set()
    for scope in ("true", "false"):
        kinds = cluster.kubectl("api-resources", "--verbs=list", f"--namespaced={scope}", "-o", "name").stdout.split()
        kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io", "gpupolicies.gpu.kubeon.io")]
        items = json.loads(cluster.kubectl("get", ",".join(kinds), "-A", "-o", "json", timeout=120).stdout)["items"]
        for obj in items:
            meta = obj["metadata"]
            namespace = meta.get("namespace", "")
            if namespace == NAMESPACE or "kubeon" in meta["name"]:
                left.add("/".join(p for p in (obj["kind"], namespace, meta["name"]) if p))
    return left


def test_chart_is_where_the_readme_points() -> None:
    line = next(line for line in readme_block() if line.startswith("helm upgrade --install"))
    assert str(CHART.relative_to(REPO)) in line.split()
