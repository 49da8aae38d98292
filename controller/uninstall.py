"""`kubeon-gpu controller --uninstall`: undo what the optimizer left in the cluster (helm pre-delete hook).

What it removes (docs/install.md, "Uninstalling", says what stays and why):
- parked workloads come back: each park record in a GpuPolicy's
  `status.parked` sets its workload's replicas back through the scale
  subresource (KEDA-paused ones are unpaused, with `--keda`), then the record
  goes; right-sizing's restart records go too (nothing to undo: the pods
  were replaced);
- on nodes (gpupolicy/capacity/cleanup.py): our `gpu.kubeon.io/*` labels,
  annotations and taints, `nvidia.com/device-plugin.config` naming one of our
  time-slicing keys, `nvidia.com/mig.config` put back to what it was before
  our first re-layout, and cordons our records say we set;
- the `kubeon-ts-*` keys in the time-slicing ConfigMap (the ConfigMap and
  every other key stay: it is the GPU Operator's);
- its KEDA ScaledObjects (label `app.kubernetes.io/managed-by`), with `--keda`
  only (without it the controller never wrote one and holds no KEDA RBAC);
- Karpenter NodeClaims and NodePools labelled managed by us, unless
  `--keep-capacity` (deleting them gives the GPU nodes back);
- the scaler RoleBindings it made in the namespaces policies named (last: they
  are what lets it scale the workloads).

First it takes the leader Lease for itself, so the running controller (still
up while the pre-delete hook runs) loses it, stops acting and cannot park a
workload again behind the cleanup's back; it waits one lease duration for the
old leader's last pass to end.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.scaletozero import park_records
from gpupolicy.capacity.cleanup import node_cleanup_patch
from gpupolicy.capacity.timeslicing import is_our_key
from gpupolicy.scaling import autoscale as keda_core
from kube import layout as kl
from kube import scale as kscale
from kube.calls import API_ERRORS, one_line
from kube.leases import LeaseConflict, create_lease, get_lease, replace_lease
from kube.policies import list_policies, patch_status_entry
from kube.workloads import NotFound, patch_scale, read_scale

log = logging.getLogger(__name__)

_GAVE_UP: tuple[type[Exception], ...] = (*API_ERRORS, RuntimeError)  # RuntimeError: take_lease lost every race

HOLDER = "kubeon-gpu-uninstall"
KARPENTER = ("karpenter.sh", "v1")
MANAGED = f"{kscale.MANAGED_BY_LABEL}={kscale.MANAGED_BY}"


@dataclass
class UninstallReport:
    woken: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    configmap_keys: list[str] = field(default_factory=list)
    scaled_objects: list[str] = field(default_factory=list)
    capacity: list[str] = field(default_factory=list)
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


def _wake_parked(api: client.ApiClient, report: UninstallReport, keda: bool) -> None:
    """Every park record: replicas back through the scale subresource, then the record goes."""
    for policy in list_policies(api)[0]:
        name = policy["metadata"]["name"]
        status = policy.get("status") or {}
        for key, record in park_records(status).items():
            kind, namespace, workload = key.split("/", 2)
            try:
                if keda:
                    so = kscale.scaled_object_for(kscale.list_scaled_objects(api, namespace), kind, workload)
                    if so is not None and kscale.is_paused_at_zero(so):
                        kscale.set_paused(api, namespace, so["metadata"]["name"], False)
                scale = read_scale(api, kind, namespace, workload)
                same = record.uid is None or scale["metadata"].get("uid") in (None, record.uid)
                if same and not (scale.get("spec") or {}).get("replicas"):
                    patch_scale(api, kind, namespace, workload, {"spec": {"replicas": record.replicas}})
                    report.woken.append(key)
            except NotFound:
                pass  # the workload is gone: only the record is left to drop
            except ApiException as exc:
                report.failed.append(f"{key}: {exc.status} {exc.reason}")
                continue
            patch_status_entry(api, name, "parked", key, None)
            report.records.append(f"{name}:{key}")
        for key in status.get("restarts") or {}:
            patch_status_entry(api, name, "restarts", key, None)
            report.records.append(f"{name}:{key}")


def _clean_nodes(api: client.ApiClient, report: UninstallReport) -> None:
    for node in kl.list_nodes(api):
        patch = node_cleanup_patch(node)
        if patch is None:
            continue
        name = node["metadata"]["name"]
        try:
            kl.patch_node(api, name, patch)
        except ApiException as exc:
            report.failed.append(f"Node/{name}: {exc.status} {exc.reason}")
            continue
        report.nodes.append(name)


def _clean_configmap(api: client.ApiClient, report: UninstallReport, namespace: str, name: str) -> None:
    try:
        current = kl.read_configmap(api, namespace, name)
    except kl.ConfigMapUnavailable:
        return  # missing or not ours to read: nothing of ours can be in it
    ours = sorted(k for k in (current.get("data") or {}) if is_our_key(k))
    if not ours:
        return
    try:
        kl.patch_configmap(api, namespace, name, {"data": dict.fromkeys(ours)},
                           (current.get("metadata") or {}).get("resourceVersion"))
    except (ApiException, kl.ConfigMapUnavailable) as exc:
        report.failed.append(f"ConfigMap/{namespace}/{name}: {exc}")
        return
    report.configmap_keys.extend(ours)


def _karpenter_items(api: client.ApiClient, plural: str) -> list[dict[str, Any]]:
    try:
        response: Any = client.CustomObjectsApi(api).list_cluster_custom_object(
            *KARPENTER, plural, label_selector=MANAGED, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:  # Karpenter is not installed
            return []
        raise
    return list(json.loads(response.data).get("items") or [])


def _delete_capacity(api: client.ApiClient, report: UninstallReport) -> None:
    """NodeClaims, then NodePools, labelled managed by us (Karpenter drains and gives the nodes back)."""
    for plural in ("nodeclaims", "nodepools"):
        for item in _karpenter_items(api, plural):
            name = item["metadata"]["name"]
            try:
                client.CustomObjectsApi(api).delete_cluster_custom_object(*KARPENTER, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    report.failed.append(f"{plural}/{name}: {exc.status} {exc.reason}")
                continue
            report.capacity.append(f"{plural}/{name}")


def uninstall(api: client.ApiClient, *, keda: bool, keep_capacity: bool = False,
              gpu_operator_namespace: str = "gpu-operator",
              time_slicing_configmap: str = "time-slicing-config") -> UninstallReport:
    """Wake, clean nodes and the ConfigMap, delete ours; each failure is reported and never stops the rest."""
    report = UninstallReport()
    _wake_parked(api, report, keda)
    _clean_nodes(api, report)
    _clean_configmap(api, report, gpu_operator_namespace, time_slicing_configmap)
    if keda:
        selector = f"{keda_core.MANAGED_BY_LABEL}={keda_core.MANAGED_BY}"
        for so in kscale.list_scaled_objects_all_namespaces(api, selector):
            so_meta = so["metadata"]
            if keda_core.POLICY_LABEL not in (so_meta.get("labels") or {}):
                continue
            if kscale.delete_scaled_object(api, so_meta["namespace"], so_meta["name"]):
                report.scaled_objects.append(f"{so_meta['namespace']}/{so_meta['name']}")
    if not keep_capacity:
        _delete_capacity(api, report)
    for namespace in sorted(kscale.list_scaler_bindings(api)):
        if kscale.delete_scaler_binding(api, namespace):
            report.bindings.append(namespace)
    return report


def run(api: client.ApiClient, namespace: str, lease_name: str, keda: bool, keep_capacity: bool = False,
        gpu_operator_namespace: str = "gpu-operator", time_slicing_configmap: str = "time-slicing-config") -> int:
    try:
        take_lease(api, namespace, lease_name)
        report = uninstall(api, keda=keda, keep_capacity=keep_capacity,
                           gpu_operator_namespace=gpu_operator_namespace,
                           time_slicing_configmap=time_slicing_configmap)
    except _GAVE_UP as exc:  # the hook's Job fails with one line; Helm shows it and the Job retries
        log.error("uninstall failed: %s", one_line(exc))
        return 1
    log.info("uninstall woke=%s records-removed=%s nodes-cleaned=%s configmap-keys-removed=%s "
             "scaledobjects-deleted=%s capacity-deleted=%s bindings-deleted=%s",
             ",".join(report.woken) or "-", ",".join(report.records) or "-", ",".join(report.nodes) or "-",
             ",".join(report.configmap_keys) or "-", ",".join(report.scaled_objects) or "-",
             ",".join(report.capacity) or "-", ",".join(report.bindings) or "-")
    for failure in report.failed:
        log.error("uninstall could not clean %s", failure)
    return 1 if report.failed else 0
