"""The README's install lines on a cluster that lacks a prerequisite of the chart: the install
fails before any object of the release exists, with one message naming what is missing and the
value that changes it.

Real: helm 4 and kubectl 1.35 from .tools/bin, the chart, and the real control plane
(tests/cluster; helm's `lookup` reads it as it reads any cluster). What exists is read
back with kubectl alone, so the test runs unchanged against any cluster. Nothing is faked.
"""

from __future__ import annotations

from pathlib import Path

from tests.cluster.cluster import Cluster
from tests.e2e import test_readme_install
from tests.e2e.test_readme_install import Shell, readme_block

# the README test's fixtures: a bare real cluster (no GPU Operator namespace) and its Service network
cluster, network = test_readme_install.cluster, test_readme_install.network

# Every listable kind but events, as KIND NAMESPACE NAME lines.
EVERYTHING = ("kubectl get $(kubectl api-resources --verbs=list -o name | grep -v '^events' | paste -sd, -) -A "
              "--no-headers -o custom-columns=KIND:.kind,NAMESPACE:.metadata.namespace,NAME:.metadata.name")
# Helm installs the chart's crds/ before it renders a template (so before any check can run), and
# keeps them whatever happens after; a later install finds the CRD there and goes on.
# kube-apiserver registers the CRD's group version as an APIService of its own (crdregistration).
CRD_OF_CRDS_DIR = {"CustomResourceDefinition <none> gpupolicies.gpu.kubeon.io",
                   "APIService <none> v1alpha1.gpu.kubeon.io"}


def _objects(sh: Shell) -> set[str]:
    return {" ".join(line.split()) for line in sh(EVERYTHING).stdout.splitlines() if line.strip()}


def _install_lines() -> tuple[list[str], str]:
    """The README's lines before its helm line (the namespace and the token's Secret), and the helm line."""
    lines = [line.replace("<cluster token>", "t0ken") for line in readme_block()]
    helm = next(i for i, line in enumerate(lines) if line.startswith("helm upgrade --install"))
    return lines[:helm], lines[helm]


def test_install_without_the_gpu_operator_namespace_creates_nothing(cluster: Cluster, tmp_path: Path) -> None:
    sh = Shell(cluster, tmp_path / "helm")
    before_helm, helm = _install_lines()
    for line in before_helm:
        sh(line)
    before = _objects(sh)
    assert not any(o.startswith("Namespace <none> gpu-operator") for o in before)

    failed = sh(helm, ok=False)

    assert failed.returncode != 0, failed.stdout
    errors = [line for line in failed.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, failed.stderr
    assert 'namespace "gpu-operator"' in errors[0] and "gpuOperator.namespace" in errors[0], errors[0]
    assert _objects(sh) - before <= CRD_OF_CRDS_DIR, "the failed install created objects"

    # the value the message names is the way out: the operator in a namespace of another name
    sh("kubectl create namespace nvidia-gpu-operator")
    sh(f"{helm} --set gpuOperator.namespace=nvidia-gpu-operator --dry-run=server")


def test_install_with_cert_manager_absent_creates_nothing(cluster: Cluster, tmp_path: Path) -> None:
    sh = Shell(cluster, tmp_path / "helm")
    before_helm, helm = _install_lines()
    for line in [*before_helm, "kubectl create namespace gpu-operator"]:
        sh(line)
    before = _objects(sh)

    failed = sh(f"{helm} --set certificates.mode=cert-manager", ok=False)

    assert failed.returncode != 0, failed.stdout
    errors = [line for line in failed.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, failed.stderr
    assert "certificates.cert-manager.io" in errors[0] and "certificates.mode" in errors[0], errors[0]
    assert _objects(sh) - before <= CRD_OF_CRDS_DIR, "the failed install created objects"
