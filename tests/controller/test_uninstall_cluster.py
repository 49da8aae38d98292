"""`kubeon-gpu controller --uninstall` (the chart's pre-delete hook) leaves nothing of the controller's behind.

Real: the command line in a subprocess, the test API server (tests/kubeapi) with the GpuPolicy and KEDA
CRDs, the controller's own kube/ verbs to set the scene. Faked: nothing; the "running controller" is the
Lease it holds.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from gpupolicy.model import AutoscaleSpec
from gpupolicy.scaling import autoscale as keda_core
from gpupolicy.scaling.scaletozero import SCALED_AT, SCALED_FROM, UNDO
from kube import scale as kscale
from kube.leases import create_lease, get_lease
from tests.controller.conftest import make_deployment

REPO = Path(__file__).resolve().parents[2]
NS = "ml"


def _deploy(api: client.ApiClient, name: str, replicas: int, annotations: dict[str, str]) -> None:
    obj: dict[str, Any] = make_deployment(name, NS, replicas=replicas)
    obj["metadata"]["annotations"] = annotations
    client.AppsV1Api(api).create_namespaced_deployment(NS, obj)


def _uninstall(kubeconfig: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "controller", "--uninstall", "--kubeconfig", kubeconfig,
                           "--namespace", "kubeon-gpu", *extra], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_uninstall_wakes_unannotates_and_deletes_what_the_controller_made(scale_api: Any) -> None:
    api = scale_api.api
    _deploy(api, "parked", 0, {SCALED_FROM: "3", SCALED_AT: "2026-12-01T00:00:00Z", UNDO: "{}", "team": "ml"})
    _deploy(api, "restarted", 2, {UNDO: '{"action": "rightsize"}'})
    _deploy(api, "untouched", 1, {"team": "ml"})
    kscale.ensure_scaler_binding(api, NS, kscale.ServiceAccountRef("kubeon-gpu-optimizer", "kubeon-gpu"))
    ours = keda_core.scaled_object(policy_name="p", kind="Deployment", namespace=NS, name="restarted",
                                   spec=AutoscaleSpec(target_utilization_percent=50, min=1, max=3),
                                   server_address="http://prom:9090")
    kscale.create_scaled_object(api, ours)
    create_lease(api, "kubeon-gpu", "kubeon-gpu-optimizer", "running-controller", 1, time.time())

    done = _uninstall(scale_api.kubeconfig, "--keda")
    assert done.returncode == 0, done.stdout + done.stderr

    apps = client.AppsV1Api(api)
    parked = apps.read_namespaced_deployment("parked", NS)
    assert parked.spec.replicas == 3 and parked.metadata.annotations == {"team": "ml"}
    assert not (apps.read_namespaced_deployment("restarted", NS).metadata.annotations or {})
    assert apps.read_namespaced_deployment("untouched", NS).metadata.annotations == {"team": "ml"}
    assert kscale.list_scaled_objects(api, NS) == []
    assert kscale.list_scaler_bindings(api) == {}
    lease = get_lease(api, "kubeon-gpu", "kubeon-gpu-optimizer")
    assert lease is not None and lease.holder == "kubeon-gpu-uninstall", "the running controller stood down"
    assert "uninstall woke=Deployment/ml/parked" in done.stderr


def test_uninstall_without_keda_touches_no_scaled_object(scale_api: Any) -> None:
    """keda.enabled=false: the controller made none and has no KEDA RBAC; someone else's stays."""
    api = scale_api.api
    theirs = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "theirs", "namespace": NS},
              "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}
    kscale.create_scaled_object(api, theirs)
    done = _uninstall(scale_api.kubeconfig)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [o["metadata"]["name"] for o in kscale.list_scaled_objects(api, NS)] == ["theirs"]
