"""End-to-end harness: the test cluster with the optimizer's real processes wired in as in a cluster.

What is real: the test API server and its loops (tests/kubeapi/cluster.py),
TLS material from `kubeon-gpu certs generate`, the webhook process
(`kubeon-gpu webhook`, gunicorn over TLS) started as a subprocess, the
GpuPolicy CRD from manifests/crd/, and the Mutating/ValidatingWebhookConfiguration
objects rendered from the Helm chart (`helm template`, else the rendered
manifests), with only clientConfig.service rewritten to clientConfig.url of
the local process and caBundle set to the generated CA.

Fixtures (module-scoped, so one cluster and one webhook serve a test module):
- `e2e_cluster`: a background `Cluster` with GPU nodes and the GpuPolicy CRD.
- `tls_dir`: ca.crt, tls.crt, tls.key for 127.0.0.1.
- `webhook`: the running webhook, registered through the chart's configurations.
- `extender`: `kubeon-gpu extender` running; `e2e_cluster.use_extenders([extender.config])`
  routes the scheduler stand-in through it with the chart's scheduler config.
- `controller`: `kubeon-gpu controller` running against the cluster.

Hook for later issues: add a test module here that asks for `webhook`,
`extender` and/or `controller`; a component whose files are absent makes its
fixture skip with the reason, never fail.
"""

from __future__ import annotations

import base64
import copy
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client

from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_node
from tests.kubeapi.scheduler import ExtenderConfig
from tests.loopback import free_port
from tests.missing import missing

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "chart" / "kubeon-gpu-optimizer"
GPUPOLICY_CRD = REPO / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"
RELEASE = "kubeon-gpu-optimizer"
RELEASE_NAMESPACE = "kubeon-gpu"
WEBHOOK_SERVICE = "kubeon-gpu-optimizer-webhook"
STARTUP_TIMEOUT = 30.0


def require(path: Path, what: str) -> None:
    """Skip locally (fail in CI) when a component is not in the tree."""
    if not path.exists():
        missing(f"{what} not built yet ({path.relative_to(REPO)} absent)")


def kubeon_gpu(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (`python -m cli.main`, the console script's module) and return its output."""
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False, **kwargs)


@dataclass
class Process:
    """A `kubeon-gpu` server subprocess with its log file; `url` is its base URL."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path
    config: Any = None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def start_process(name: str, args: Sequence[str], health_url: str, log_dir: Path, *,
                  verify: str | bool = True, base_url: str = "", env: dict[str, str] | None = None) -> Process:
    """Start `kubeon-gpu <args>` and wait until `health_url` answers 200; fail with its log otherwise."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with open(log, "wb") as sink:
        popen = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO, stdout=sink,
                                 stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    process = Process(name, popen, base_url or health_url.rsplit("/", 1)[0], log)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            pytest.fail(f"{name} exited with {popen.returncode}:\n{process.log_tail()}")
        try:
            if requests.get(health_url, verify=verify, timeout=1).status_code == 200:
                return process
        except requests.RequestException:
            pass
        time.sleep(0.1)
    process.stop()
    pytest.fail(f"{name} not healthy at {health_url} after {STARTUP_TIMEOUT}s:\n{process.log_tail()}")


# ---------------------------------------------------------------- chart rendering

def render_chart(*sets: str) -> list[dict[str, Any]]:
    """`helm template` of the chart with `sets` (helm from .tools/bin: tests.install.chart.tool, which
    skips locally and fails in CI without it; the checked-in manifests cannot carry the sets)."""
    from tests.install.chart import tool

    args = [tool("helm"), "template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE]
    for value in sets:
        args += ["--set", value]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        pytest.fail(f"helm template failed:\n{result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def webhook_configurations(docs: Sequence[dict[str, Any]], base_url: str, ca_pem: bytes,
                           failure_policy: str | None = "Fail") -> list[dict[str, Any]]:
    """The chart's webhook configurations, pointed at `base_url` + each service path, caBundle set.

    failurePolicy is forced to Fail by default so that a webhook that cannot
    be reached fails the test instead of letting pods through unchanged.
    """
    out = []
    for doc in docs:
        if doc.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        doc = copy.deepcopy(doc)
        for hook in doc.get("webhooks") or []:
            service = hook["clientConfig"].pop("service", None) or {}
            hook["clientConfig"]["url"] = base_url + (service.get("path") or "/")
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
            if failure_policy:
                hook["failurePolicy"] = failure_policy
        out.append(doc)
    return out


def scheduler_extender_config(docs: Sequence[dict[str, Any]], url_prefix: str) -> ExtenderConfig:
    """The chart's KubeSchedulerConfiguration `extenders[0]`, with urlPrefix set to the local extender."""
    for doc in docs:
        if doc.get("kind") != "ConfigMap":
            continue
        for text in (doc.get("data") or {}).values():
            config = yaml.safe_load(text) if isinstance(text, str) and "KubeSchedulerConfiguration" in text else None
            if config and config.get("extenders"):
                ext = config["extenders"][0]
                return ExtenderConfig(
                    url_prefix, filter_verb=ext.get("filterVerb"), prioritize_verb=ext.get("prioritizeVerb"),
                    bind_verb=ext.get("bindVerb"),
                    weight=int(ext.get("weight", 1)), node_cache_capable=bool(ext.get("nodeCacheCapable")),
                    managed_resources=tuple(r["name"] for r in ext.get("managedResources") or []),
                    ignorable=bool(ext.get("ignorable")),
                    http_timeout=float(str(ext.get("httpTimeout", "5s")).rstrip("s") or 5))
    pytest.fail("no KubeSchedulerConfiguration with extenders in the rendered chart")


# ---------------------------------------------------------------- fixtures

def e2e_nodes() -> list[dict[str, Any]]:
    """A100-80GB nodes: one partitioned 7x 1g.10gb per GPU (tainted per MIG resource), one whole-GPU node."""
    return [
        make_node("a100-mig-0", "NVIDIA-A100-SXM4-80GB", 8, mig={"1g.10gb": 7}, gpu_taint=True),
        make_node("a100-whole-0", "NVIDIA-A100-SXM4-80GB", 8),
    ]


@pytest.fixture(scope="module")
def e2e_cluster() -> Iterator[Cluster]:
    require(GPUPOLICY_CRD, "the GpuPolicy CRD")
    with Cluster(nodes=e2e_nodes(), crd_files=[GPUPOLICY_CRD]) as cluster:
        cluster.ensure_namespace(RELEASE_NAMESPACE)
        yield cluster


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(REPO / "certs" / "command.py", "certs/ (kubeon-gpu certs)")
    out = tmp_path_factory.mktemp("tls")
    result = kubeon_gpu("certs", "generate", "--service", WEBHOOK_SERVICE, "--namespace", RELEASE_NAMESPACE,
                        "--out", str(out), "--ip", "127.0.0.1")
    assert result.returncode == 0, result.stderr
    return out


@dataclass
class Webhook:
    process: Process
    configurations: list[dict[str, Any]] = field(default_factory=list)
    ca_file: str = ""

    @property
    def url(self) -> str:
        return self.process.url


@pytest.fixture(scope="module")
def webhook(e2e_cluster: Cluster, tls_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """`kubeon-gpu webhook` over TLS, registered through the chart's webhook configurations."""
    require(REPO / "webhook" / "command.py", "webhook/ (kubeon-gpu webhook)")
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    process = start_process(
        "webhook",
        ["webhook", "--cert-dir", str(tls_dir), "--port", str(port), "--bind", "127.0.0.1",
         "--workers", "1", "--namespace", RELEASE_NAMESPACE, "--kubeconfig", e2e_cluster.kubeconfig,
         # an install with prometheus.url (never queried by the webhook): Automatic sharing may act
         "--prometheus-url", "http://127.0.0.1:9"],
        f"{base}/readyz", tmp_path_factory.mktemp("logs"), verify=str(tls_dir / "ca.crt"), base_url=base)
    try:
        docs = render_chart("certificates.mode=external")
        configurations = webhook_configurations(docs, base, (tls_dir / "ca.crt").read_bytes())
        assert {c["kind"] for c in configurations} == {"MutatingWebhookConfiguration",
                                                       "ValidatingWebhookConfiguration"}
        admission = client.AdmissionregistrationV1Api(e2e_cluster.api_client)
        for config in configurations:
            if config["kind"] == "MutatingWebhookConfiguration":
                admission.create_mutating_webhook_configuration(config, _preload_content=False)
            else:
                admission.create_validating_webhook_configuration(config, _preload_content=False)
        yield Webhook(process, configurations, str(tls_dir / "ca.crt"))
    finally:
        process.stop()


def wait_for_policy(webhook: Webhook, policy: str, probe_pod: dict[str, Any], timeout: float = 15.0) -> None:
    """Wait until the webhook's watch cache holds `policy`: its dry-run of `probe_pod` names the policy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        response = requests.post(f"{webhook.url}/dry-run", json={"object": probe_pod}, verify=webhook.ca_file,
                                 timeout=5)
        last = response.json() if response.headers.get("content-type", "").startswith("application/json") else None
        if response.status_code == 200 and any(d.get("policy") == policy for d in (last or {}).get("decisions", [])):
            return
        time.sleep(0.1)
    raise AssertionError(f"webhook never saw GpuPolicy {policy}; last dry-run answer: {last}")


@pytest.fixture(scope="module")
def extender(e2e_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """`kubeon-gpu extender` (plain HTTP) with `.config`, the chart's extender config pointed at it."""
    require(REPO / "extender" / "command.py", "extender/ (kubeon-gpu extender)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_process("extender", ["extender", "--port", str(port), "--bind", "127.0.0.1",
                                         "--kubeconfig", e2e_cluster.kubeconfig],
                            f"{base}/readyz", tmp_path_factory.mktemp("logs"), base_url=base)
    try:
        process.config = scheduler_extender_config(render_chart("certificates.mode=external"), base)
        yield process
    finally:
        e2e_cluster.use_extenders([])
        process.stop()


@pytest.fixture(scope="module")
def controller(e2e_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """`kubeon-gpu controller` against the cluster (health on a free port)."""
    require(REPO / "controller" / "command.py", "controller/ (kubeon-gpu controller)")
    port = free_port()
    process = start_process("controller", ["controller", "--namespace", RELEASE_NAMESPACE,
                                           "--kubeconfig", e2e_cluster.kubeconfig, "--health-port", str(port),
                                           "--identity", "e2e"],
                            f"http://127.0.0.1:{port}/healthz", tmp_path_factory.mktemp("logs"))
    try:
        yield process
    finally:
        process.stop()
