"""The plain manifests for `kubectl apply -k manifests/`: current, buildable, appliable.

Real: manifests/render.sh run with the real helm 4 into a temporary directory
and compared byte for byte with manifests/rendered/ (stale = fail); `kubectl
kustomize manifests/` with real kubectl 1.35; every object validated against
the Kubernetes schemas; `kubectl apply -k` then `kubectl get gpupolicies`
against the project's test API server (tests/kubeapi). Faked: the cluster is
the test API server, not a real kube-apiserver.
"""

from __future__ import annotations

import filecmp
import subprocess
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.install.chart import CHART, MANIFESTS, NAMESPACE, find, load_dir, one, run, tool
from tests.missing import missing

RENDERED = MANIFESTS / "rendered"


@pytest.fixture(scope="module")
def built() -> list[dict]:
    out = run([tool("kubectl"), "kustomize", str(MANIFESTS)]).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_rendered_manifests_are_current(tmp_path: Path) -> None:
    helm = tool("helm")
    subprocess.run(["bash", str(MANIFESTS / "render.sh"), str(tmp_path / "out")], check=True,
                   env={"HELM": helm, "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=120)
    fresh = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert fresh == sorted(p.name for p in RENDERED.iterdir()), "run manifests/render.sh"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "out", RENDERED, fresh, shallow=False)
    assert not mismatch and not errors, f"stale: {mismatch + errors}: run manifests/render.sh"


def test_kustomize_builds_namespace_crd_and_workloads(built: list[dict]) -> None:
    namespace = one(built, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert find(built, "CustomResourceDefinition", "gpupolicies.gpu.kubeon.io")
    assert {d["metadata"]["name"] for d in find(built, "Deployment")} == {
        "kubeon-gpu-optimizer", "kubeon-gpu-optimizer-webhook", "kubeon-gpu-optimizer-extender",
        "kubeon-gpu-scheduler"}
    assert not find(built, "Secret"), "no private key in git: the TLS Secret is made at install"
    assert len(built) == len(load_dir(RENDERED)) + 1


def test_kustomize_output_is_valid_kubernetes(built: list[dict]) -> None:
    for doc in built:
        kubernetes_validate.validate(doc, "1.35.0", strict=True)


def test_rendered_scheduler_image_is_pinned(built: list[dict]) -> None:
    image = one(built, "Deployment", "kubeon-gpu-scheduler")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.k8s.io/kube-scheduler:v1.35.0"


def _api_server_class():  # type: ignore[no-untyped-def]
    try:
        from tests.kubeapi import ApiServer  # type: ignore[attr-defined]
    except ImportError as exc:
        missing(f"tests/kubeapi does not expose ApiServer ({exc})")
    return ApiServer


GPU_OPERATOR_NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata: {name: gpu-operator}\n"
POLICY = """apiVersion: gpu.kubeon.io/v1alpha1
kind: GpuPolicy
metadata: {name: share-inference}
spec:
  mode: Recommend
  selector: {namespaces: [inference]}
  sharing: {strategy: TimeSlicing}
"""


def test_apply_then_get_gpupolicies_on_the_test_api_server() -> None:
    """The guide's `kubectl apply -k manifests/` then `kubectl get gpupolicies`.

    --validate=false: the test API server serves no /openapi for kubectl's
    client-side validation; the same objects are validated strictly against
    the Kubernetes schemas in test_kustomize_output_is_valid_kubernetes.
    """
    kubectl = tool("kubectl")
    api = _api_server_class().start()
    try:
        base = [kubectl, "--kubeconfig", str(api.kubeconfig)]

        def kubectl_run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
            done = subprocess.run([*base, *args], input=stdin, capture_output=True, text=True, timeout=60,
                                  check=False)
            assert not check or done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            return done

        # A cluster the guide assumes: the GPU Operator's namespace exists.
        kubectl_run("apply", "--validate=false", "-f", "-", stdin=GPU_OPERATOR_NAMESPACE)
        applied = kubectl_run("apply", "--validate=false", "-k", str(MANIFESTS)).stdout
        assert "customresourcedefinition.apiextensions.k8s.io/gpupolicies.gpu.kubeon.io created" in applied
        assert "deployment.apps/kubeon-gpu-optimizer created" in applied
        assert "mutatingwebhookconfiguration.admissionregistration.k8s.io/kubeon-gpu-optimizer created" in applied
        deadline = time.monotonic() + 20
        while (got := kubectl_run("get", "gpupolicies", check=False)).returncode != 0:
            assert time.monotonic() < deadline, got.stderr
            time.sleep(0.3)
        assert "No resources found" in got.stdout + got.stderr
        kubectl_run("apply", "--validate=false", "-f", "-", stdin=POLICY)
        listed = kubectl_run("get", "gpupolicies").stdout
        assert "share-inference" in listed
        deploy = kubectl_run("-n", NAMESPACE, "get", "deploy", "kubeon-gpu-optimizer", "-o", "name").stdout
        assert deploy.strip() == "deployment.apps/kubeon-gpu-optimizer"
        again = kubectl_run("apply", "--validate=false", "-k", str(MANIFESTS)).stdout
        assert " created" not in again, "a second apply must change nothing"
    finally:
        api.stop()


EXISTING_TLS_SECRET = """apiVersion: v1
kind: Namespace
metadata: {name: kubeon-gpu}
---
apiVersion: v1
kind: Namespace
metadata: {name: gpu-operator}  # the GPU Operator's, which a previous install needed too
---
apiVersion: v1
kind: Secret
metadata:
  name: kubeon-gpu-optimizer-webhook-tls
  namespace: kubeon-gpu
  labels: {app.kubernetes.io/managed-by: Helm}
  annotations: {meta.helm.sh/release-name: kubeon-gpu-optimizer, meta.helm.sh/release-namespace: kubeon-gpu}
type: kubernetes.io/tls
data: {tls.crt: dGxzLWNydA==, tls.key: dGxzLWtleQ==, ca.crt: Y2EtY3J0}
"""


def test_upgrade_keeps_the_webhook_certificate() -> None:
    """helm's `lookup` against a live API server: an existing cert Secret is reused, caBundle follows it.

    Real: helm 4 `template --dry-run=server` (lookup enabled) against the test
    API server holding the Secret a previous install made.
    """
    kubectl, helm = tool("kubectl"), tool("helm")
    api = _api_server_class().start()
    try:
        kubeconfig = str(api.kubeconfig)
        done = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "apply", "--validate=false", "-f", "-"],
                              input=EXISTING_TLS_SECRET, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        out = run([helm, "template", "kubeon-gpu-optimizer", str(CHART), "-n", NAMESPACE, "--dry-run=server",
                   "--kubeconfig", kubeconfig, "-s", "templates/webhook-configurations.yaml"]).stdout
    finally:
        api.stop()
    docs = [d for d in yaml.safe_load_all(out) if d]
    secret = one(docs, "Secret", "kubeon-gpu-optimizer-webhook-tls")
    assert secret["data"] == {"tls.crt": "dGxzLWNydA==", "tls.key": "dGxzLWtleQ==", "ca.crt": "Y2EtY3J0"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(docs, kind, "kubeon-gpu-optimizer")["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == "Y2EtY3J0"
