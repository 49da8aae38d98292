"""The plain manifests for `kubectl apply -k manifests/`: current, buildable, appliable.

Real: manifests/render.sh run with the real helm 4 into a temporary directory
and compared byte for byte with manifests/rendered/ (stale = fail); `kubectl
kustomize manifests/` with real kubectl 1.35; every object validated against
the Kubernetes schemas; `kubectl apply -k` then `kubectl get gpupolicies`, and helm's `lookup`,
against a real kube-apiserver v1.35 (tests/cluster: etcd, kube-apiserver, kube-controller-manager;
no optimizer running, as right after `kubectl apply -k` before the webhook certificate exists).
"""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.cluster.cluster import Cluster
from tests.install.chart import CHART, MANIFESTS, NAMESPACE, find, load_dir, one, run, tool

RENDERED = MANIFESTS / "rendered"
CLUSTER = {"gpu_operator": False}  # the test applies the GPU Operator's namespace itself, as the guide assumes


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


GPU_OPERATOR_NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata: {name: gpu-operator}\n"
POLICY = """apiVersion: gpu.kubeon.io/v1alpha1
kind: GpuPolicy
metadata: {name: share-inference}
spec:
  mode: Recommend
  selector: {namespaces: [inference]}
  sharing: {strategy: TimeSlicing}
"""


def test_apply_then_get_gpupolicies_on_a_real_api_server(kube_cluster: Cluster) -> None:
    """The guide's `kubectl apply -k manifests/` then `kubectl get gpupolicies`, with kubectl's
    client-side validation on (the real server serves /openapi).

    Nothing serves the webhook yet (no Secret, no caBundle, no kube-proxy here): kube-apiserver
    cannot call it, and the rendered `failurePolicy: Ignore` admits the policy anyway, as
    docs/install.md says of the time before `certs patch-cabundle`.
    """
    # A cluster the guide assumes: the GPU Operator's namespace exists.
    kube_cluster.kubectl("apply", "-f", "-", input=GPU_OPERATOR_NAMESPACE)
    try:
        applied = kube_cluster.kubectl("apply", "-k", str(MANIFESTS)).stdout
        assert "customresourcedefinition.apiextensions.k8s.io/gpupolicies.gpu.kubeon.io created" in applied
        assert "deployment.apps/kubeon-gpu-optimizer created" in applied
        assert "mutatingwebhookconfiguration.admissionregistration.k8s.io/kubeon-gpu-optimizer created" in applied
        got = kube_cluster.wait_for(lambda: _listed(kube_cluster), timeout=30, message="the GpuPolicy CRD served")
        assert "No resources found" in got.stdout + got.stderr
        kube_cluster.kubectl("apply", "-f", "-", input=POLICY, timeout=90)
        listed = kube_cluster.kubectl("get", "gpupolicies").stdout
        assert "share-inference" in listed
        deploy = kube_cluster.kubectl("-n", NAMESPACE, "get", "deploy", "kubeon-gpu-optimizer", "-o", "name").stdout
        assert deploy.strip() == "deployment.apps/kubeon-gpu-optimizer"
        again = kube_cluster.kubectl("apply", "-k", str(MANIFESTS)).stdout
        assert " created" not in again, "a second apply must change nothing"
    finally:
        # the chart's fixed cluster-scoped names (ClusterRoles, webhook configurations) would stop a
        # helm release in this cluster from adopting them: leave the cluster as it was
        kube_cluster.kubectl("delete", "-k", str(MANIFESTS), "--ignore-not-found", "--wait", timeout=120)


def _listed(cluster: Cluster) -> subprocess.CompletedProcess[str] | None:
    done = cluster.kubectl("get", "gpupolicies", check=False)
    return done if done.returncode == 0 else None


def existing_tls_secret(namespace: str) -> str:
    """The Secret a previous helm install into `namespace` made (Helm's ownership metadata on it)."""
    return f"""apiVersion: v1
kind: Secret
metadata:
  name: kubeon-gpu-optimizer-webhook-tls
  namespace: {namespace}
  labels: {{app.kubernetes.io/managed-by: Helm}}
  annotations: {{meta.helm.sh/release-name: kubeon-gpu-optimizer, meta.helm.sh/release-namespace: {namespace}}}
type: kubernetes.io/tls
data: {{tls.crt: dGxzLWNydA==, tls.key: dGxzLWtleQ==, ca.crt: Y2EtY3J0}}
"""


def test_upgrade_keeps_the_webhook_certificate(kube_cluster: Cluster, namespace: str) -> None:
    """helm's `lookup` against a live API server: an existing cert Secret is reused, caBundle follows it.

    Real: helm 4 `template --dry-run=server` (lookup enabled) against kube-apiserver holding the
    Secret a previous install made. The release goes to this test's namespace, so the objects
    `kubectl apply -k` made in kubeon-gpu (no Helm ownership) are not in its way.
    """
    # The chart's prerequisites check needs the GPU Operator's namespace. Under pytest-xdist this
    # module's tests may each get their own cluster, so this test makes it rather than rely on another.
    kube_cluster.kubectl("apply", "-f", "-", input=GPU_OPERATOR_NAMESPACE)
    kube_cluster.kubectl("apply", "-f", "-", input=existing_tls_secret(namespace))
    out = run([tool("helm"), "template", "kubeon-gpu-optimizer", str(CHART), "-n", namespace, "--dry-run=server",
               "--kubeconfig", str(kube_cluster.kubeconfig), "-s", "templates/webhook-configurations.yaml"]).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    secret = one(docs, "Secret", "kubeon-gpu-optimizer-webhook-tls")
    assert secret["data"] == {"tls.crt": "dGxzLWNydA==", "tls.key": "dGxzLWtleQ==", "ca.crt": "Y2EtY3J0"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(docs, kind, "kubeon-gpu-optimizer")["webhooks"]:
            assert hook["clientConfig"]["caBundle"] == "Y2EtY3J0"
