"""The API-semantics probe (probe.py) passes in full against the test API server.

Real: the probe's HTTP requests and real kubectl 1.35, the test server with the GpuPolicy
CRD (a cluster-scoped custom resource for the strategic-merge 415 check)."""

from __future__ import annotations

from tests.kubeapi.cluster import REPO, kubectl_binary
from tests.kubeapi.probe import probe
from tests.kubeapi.server import ApiServer


def test_probe_passes_in_full() -> None:
    with ApiServer.start(crd_files=[REPO / "manifests/crd/gpupolicies.gpu.kubeon.io.yaml"]) as api:
        results = probe(api.kubeconfig, kubectl_binary())
        assert [name for name, failure in results if failure] == [], results
        assert len(results) == 10
        left = [ns["metadata"]["name"] for ns in api.store.list("/namespaces")[0]]
        assert not [name for name in left if name.startswith("kubeapi-probe")]  # it cleans up after itself
