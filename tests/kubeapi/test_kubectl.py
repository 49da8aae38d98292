"""Real kubectl (1.35 from .tools/bin and 1.32 from the machine image) against the double.

Real: the kubectl binaries, the double over HTTP through its generated
kubeconfig, discovery, the minimal OpenAPI v3 document kubectl uses to decide
on server-side field validation, Table output, the TLS webhook from
test_admission. Faked: nothing beyond the double itself.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer
from tests.kubeapi.test_admission import Webhook, add_label, deny_labelled, hook_entry, register
from tests.kubeapi.test_crd import GPU_CRD, NODEPOOL_CRD
from tests.missing import missing

ROOT = Path(__file__).resolve().parents[2]
KUBECTLS = [p for p in (ROOT / ".tools/bin/kubectl", Path("/usr/bin/kubectl")) if p.exists()]
POD = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {labels}
spec:
  containers:
  - name: c
    image: busybox
"""


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


@pytest.fixture(params=KUBECTLS or [None], ids=lambda p: p.parent.name if p else "none")
def kubectl(request: pytest.FixtureRequest, api: ApiServer) -> Iterator:
    if request.param is None or not shutil.which(str(request.param)):
        missing("kubectl not installed: run scripts/install-test-deps.sh")

    def run(*args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(request.param), "--kubeconfig", api.kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=30)
        if ok:
            assert proc.returncode == 0, proc.stderr
        return proc
    yield run


def test_create_get_delete_pod(kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD.format(name="web", labels="{app: web}"))
    assert kubectl("create", "-f", str(manifest)).stdout.strip() == "pod/web created"
    again = kubectl("create", "-f", str(manifest), ok=False)
    assert again.returncode != 0 and "AlreadyExists" in again.stderr
    table = kubectl("get", "pods").stdout
    assert table.split("\n")[0].split()[0] == "NAME" and "web" in table
    assert kubectl("get", "pod", "web", "-o", "jsonpath={.metadata.labels.app}").stdout == "web"
    assert kubectl("get", "pods", "-l", "app=web", "-o", "name").stdout.strip() == "pod/web"
    assert kubectl("label", "pod", "web", "tier=front").returncode == 0
    assert "pod/web" in kubectl("apply", "-f", str(manifest)).stdout
    assert 'pod "web" deleted' in kubectl("delete", "-f", str(manifest)).stdout
    missing = kubectl("get", "pod", "web", ok=False)
    assert missing.returncode != 0 and 'pods "web" not found' in missing.stderr


def test_apply_and_get_all_namespaces(kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "objs.yaml"
    manifest.write_text("""apiVersion: v1
kind: Namespace
metadata: {name: kubeon-gpu}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg, namespace: kubeon-gpu}
data: {a: "1"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
""")
    out = kubectl("apply", "-f", str(manifest)).stdout
    assert "namespace/kubeon-gpu created" in out and "configmap/cfg created" in out
    assert "configmap/cfg unchanged" in kubectl("apply", "-f", str(manifest)).stdout
    assert "cfg" in kubectl("get", "configmaps", "-A").stdout
    assert 'namespace "kubeon-gpu" deleted' in kubectl("delete", "namespace", "kubeon-gpu").stdout
    assert kubectl("get", "cm", "-n", "kubeon-gpu", "-o", "name").stdout.strip() == ""


def test_custom_resources_with_field_validation(kubectl, api: ApiServer, tmp_path: Path) -> None:
    api.install_crd(NODEPOOL_CRD)
    manifest = tmp_path / "np.yaml"
    manifest.write_text("""apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: gpu}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements: [{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}]
      bogus: 1
""")
    strict = kubectl("create", "-f", str(manifest), ok=False)
    assert strict.returncode != 0 and 'unknown field "spec.template.spec.bogus"' in strict.stderr
    assert "nodepool.karpenter.sh/gpu created" in kubectl("create", "-f", str(manifest), "--validate=false").stdout
    assert "gpu" in kubectl("get", "nodepools").stdout
    assert 'nodepool.karpenter.sh "gpu" deleted' in kubectl("delete", "nodepool", "gpu").stdout


def test_gpupolicies(kubectl, tmp_path: Path) -> None:
    kubectl("apply", "-f", str(GPU_CRD))
    manifest = tmp_path / "policy.yaml"
    manifest.write_text("""apiVersion: gpu.kubeon.io/v1alpha1
kind: GpuPolicy
metadata: {name: share}
spec: {mode: Automatic}
""")
    kubectl("create", "-f", str(manifest))
    # The controller's status write (Automatic asked, Recommend enforced: no Prometheus).
    kubectl("patch", "gpupolicy", "share", "--subresource=status", "--type=merge",
            "-p", '{"status": {"effectiveMode": "Recommend", "requestedMode": "Automatic"}}')
    rows = kubectl("get", "gpupolicies").stdout.splitlines()
    assert rows[0].split()[:4] == ["NAME", "KIND", "MODE", "REQUESTED"] and rows[1].split()[0] == "share"
    assert rows[1].split()[2:4] == ["Recommend", "Automatic"]
    bad = kubectl("create", "-f", "-", stdin=manifest.read_text().replace("Automatic", "Sometimes"), ok=False)
    assert "spec.mode: Unsupported value" in bad.stderr
    kubectl("delete", "gpupolicy", "share")


def test_get_gpupolicies_says_when_the_hub_disconnected(kubectl, tmp_path: Path) -> None:
    """The controller labels hub-managed policies Disconnected on a refused token; kubectl shows it."""
    kubectl("apply", "-f", str(GPU_CRD))
    manifest = tmp_path / "policy.yaml"
    manifest.write_text("""apiVersion: gpu.kubeon.io/v1alpha1
kind: GpuPolicy
metadata:
  name: synced
  labels: {gpu.kubeon.io/managed-by: hub, gpu.kubeon.io/hub: Disconnected}
spec: {mode: Automatic, packing: {strategy: default}}
""")
    kubectl("create", "-f", str(manifest))
    rows = kubectl("get", "gpupolicies").stdout.splitlines()
    header = rows[0].split()
    assert header[:3] == ["NAME", "KIND", "MODE"] and header[-2:] == ["HUB", "AGE"], header
    assert rows[1].split()[-2] == "Disconnected", rows  # HUB, before AGE (KIND is empty without the webhook)
    kubectl("delete", "gpupolicy", "synced")


def test_webhook_warning_and_denial_reach_kubectl(kubectl, api: ApiServer) -> None:
    hook = Webhook({"/mutate": add_label("mutated", "yes"), "/validate": deny_labelled})
    try:
        cfg = {"url": hook.url + "/mutate", "caBundle": hook.ca_bundle}
        register(api, "Mutating", "m", hook_entry("mutate.example.com", cfg))
        register(api, "Validating", "v", hook_entry("deny.example.com", {**cfg, "url": hook.url + "/validate"}))
        created = kubectl("create", "-f", "-", stdin=POD.format(name="a", labels="{}"))
        assert "Warning: labelled mutated" in created.stderr
        denied = kubectl("create", "-f", "-", stdin=POD.format(name="b", labels="{deny: 'true'}"), ok=False)
        assert 'admission webhook "deny.example.com" denied the request: pods labelled deny' in denied.stderr
    finally:
        hook.close()
