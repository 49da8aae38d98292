"""`kubeon-gpu controller --uninstall`: undo what the controller left in the cluster (helm pre-delete hook).

What it removes (docs/install.md, "Uninstalling", lists what stays):
- parked workloads come back: a Deployment/StatefulSet carrying
  `gpu.kubeon.io/scaled-from-replicas` at 0 replicas gets the recorded count;
- the controller's annotations on workloads (`scaled-from-replicas`,
  `scaled-at`, `undo`, `wake`);
- its KEDA ScaledObjects (label `app.kubernetes.io/managed-by`), with `--keda`
  only (without it the controller never wrote one and holds no KEDA RBAC);
- the scaler RoleBindings it made in the namespaces policies named (last: they
  are what lets it write the workloads).

First it takes the leader Lease for itself, so the running controller (still
up while the pre-delete hook runs) loses it, stops acting and cannot park a
workload again behind the cleanup's back; it waits one lease duration for the
old leader's last pass to end.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupolicy.scaling import autoscale as keda_core
from gpupolicy.scaling.scaletozero import SCALED_AT, SCALED_FROM, UNDO, WAKE, recorded_replicas
from kube import scale as kscale
from kube.leases import LeaseConflict, create_lease, get_lease, replace_lease
from kube.workloads import list_workloads, patch_workload

log = logging.getLogger(__name__)

OUR_WORKLOAD_ANNOTATIONS = (SCALED_FROM, SCALED_AT, UNDO, WAKE)
HOLDER = "kubeon-gpu-uninstall"


@dataclass
class UninstallReport:
    woken: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    scaled_objects: list[str] = field(default_factory=list)
    bindings: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def take_lease(api: client.ApiClient, namespace: str, name: str, hold_seconds: int = 3600,
               wait: bool = True) -> None:
    """Hold the leader Lease as HOLDER; the running controller sees another holder and stands down."""
    for _ in range(10):
        current = get_lease(api, namespace, name)
        now = time.time()
        try:
            if current is None:
                create_lease(api, namespace, name, HOLDER, hold_seconds, now)
                return
            replace_lease(api, current, HOLDER, hold_seconds, now, now, current.transitions + 1)
        except LeaseConflict:
            continue
        if wait and current.holder and current.holder != HOLDER:
            # The old leader acts until it next renews (and finds the new holder): one duration at most.
            time.sleep(min(float(current.lease_duration_seconds or 15), 60.0))
        return
    raise RuntimeError(f"could not take lease {namespace}/{name}")


def uninstall(api: client.ApiClient, *, keda: bool) -> UninstallReport:
    """Wake, un-annotate, delete ours; each failure is reported and never stops the rest."""
    report = UninstallReport()
    for obj in list_workloads(api):
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        ours = [k for k in OUR_WORKLOAD_ANNOTATIONS if k in annotations]
        if not ours:
            continue
        kind, namespace, name = obj["kind"], meta["namespace"], meta["name"]
        key = f"{kind}/{namespace}/{name}"
        patch: dict[str, object] = {"metadata": {"annotations": dict.fromkeys(ours)}}
        restore = recorded_replicas(annotations)
        if restore is not None and not (obj.get("spec") or {}).get("replicas"):
            patch["spec"] = {"replicas": restore}
        try:
            if keda and SCALED_FROM in annotations:  # a KEDA-managed target parked by pausing its ScaledObject
                so = kscale.scaled_object_for(kscale.list_scaled_objects(api, namespace), kind, name)
                if so is not None and kscale.is_paused_at_zero(so):
                    kscale.set_paused(api, namespace, so["metadata"]["name"], False)
            patch_workload(api, kind, namespace, name, patch)
        except ApiException as exc:
            report.failed.append(f"{key}: {exc.status} {exc.reason}")
            continue
        (report.woken if "spec" in patch else report.cleaned).append(key)
    if keda:
        selector = f"{keda_core.MANAGED_BY_LABEL}={keda_core.MANAGED_BY}"
        for so in kscale.list_scaled_objects_all_namespaces(api, selector):
            so_meta = so["metadata"]
            if keda_core.POLICY_LABEL not in (so_meta.get("labels") or {}):
                continue
            if kscale.delete_scaled_object(api, so_meta["namespace"], so_meta["name"]):
                report.scaled_objects.append(f"{so_meta['namespace']}/{so_meta['name']}")
    for namespace in sorted(kscale.list_scaler_bindings(api)):
        if kscale.delete_scaler_binding(api, namespace):
            report.bindings.append(namespace)
    return report


def run(api: client.ApiClient, namespace: str, lease_name: str, keda: bool) -> int:
    take_lease(api, namespace, lease_name)
    report = uninstall(api, keda=keda)
    log.info("uninstall woke=%s annotations-removed=%s scaledobjects-deleted=%s bindings-deleted=%s",
             ",".join(report.woken) or "-", ",".join(report.cleaned) or "-",
             ",".join(report.scaled_objects) or "-", ",".join(report.bindings) or "-")
    for failure in report.failed:
        log.error("uninstall could not clean %s", failure)
    return 1 if report.failed else 0
