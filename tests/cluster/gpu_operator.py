"""The GPU Operator shim: GPU Feature Discovery, the device plugin and the MIG manager, reacting to node
labels as the real ones do.

A stand-in for hardware we do not have (no GPUs, so no node agents): it writes what they would
publish on a node (labels and extended resources in its status) through the real API server.

- GPU Feature Discovery (nodes Karpenter launches): given `instances` (instance type -> (GPU product,
  GPUs), the hardware a cloud's instance type carries), a node labelled
  `node.kubernetes.io/instance-type` with GPUs and no `nvidia.com/gpu.present` yet gets the labels
  GFD prints for them and the device plugin's `nvidia.com/gpu` (tests/cluster/objects.py gfd_labels);
  the two passes below then treat it like any GPU node. `hold(node)` keeps the device plugin from
  registering a node's GPUs (its pod not running yet) until `release(node)`.

- Device plugin (time-slicing): a node labelled `nvidia.com/device-plugin.config=<key>`
  runs with that key of the time-slicing ConfigMap. The key's text is parsed
  and checked as the device plugin's config (api/config/v1: version v1,
  sharing.timeSlicing{renameByDefault, failRequestsGreaterThanOne,
  resources[{name, rename, devices, replicas}]}, unknown fields refused);
  with renameByDefault the node's allocatable becomes
  `nvidia.com/gpu.shared = GPUs x replicas` and GFD's labels follow
  (`gpu.replicas`, `gpu.sharing-strategy`, product `-SHARED`). A key that
  does not parse (or is missing) leaves the node as it was and is listed in
  `errors`. No label: whole GPUs again.
- MIG manager: a changed `nvidia.com/mig.config=<layout>` sets
  `nvidia.com/mig.config.state=pending`; on the next pass (after `delay`) the
  layout is looked up in the GPU Operator's default mig-parted config
  (vendor/crds/gpu-operator_default-mig-parted-config.yaml) for the node's
  GPU, by PCI device id, and the node advertises its `nvidia.com/mig-*`
  counts (mixed strategy) and state `success`. It goes `failed` instead, and
  advertises nothing new, when the layout is unknown for that GPU, when a
  GPU pod is on the node (the real manager needs the GPUs empty), or when the
  test asked for it (`fail(node, layout)`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupolicy.catalog import DEFAULT_CATALOG, GPU_RESOURCE, MIG_RESOURCE_PREFIX, SHARED_GPU_RESOURCE
from tests.cluster.loops import MERGE_PATCH, InBackground, PassLoop, read_items
from tests.cluster.objects import OPENB_PRODUCTS, gfd_labels

MIG_PARTED_CONFIG = Path(__file__).resolve().parents[2] / "vendor" / "crds" / \
    "gpu-operator_default-mig-parted-config.yaml"
PLUGIN_LABEL = "nvidia.com/device-plugin.config"
MIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

_REPLICATED = {"type": "object", "additionalProperties": False, "required": ["name", "replicas"], "properties": {
    "name": {"type": "string"}, "rename": {"type": "string"}, "replicas": {"type": "integer", "minimum": 1},
    "devices": {"oneOf": [{"type": "string"}, {"type": "array"}, {"type": "integer"}]}}}
DEVICE_PLUGIN_CONFIG_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["version"],
    "properties": {
        "version": {"const": "v1"},
        "flags": {"type": "object"},
        "resources": {"type": "object"},
        "imex": {"type": "object"},
        "sharing": {"type": "object", "additionalProperties": False, "properties": {
            "timeSlicing": {"type": "object", "additionalProperties": False, "properties": {
                "renameByDefault": {"type": "boolean"},
                "failRequestsGreaterThanOne": {"type": "boolean"},
                "resources": {"type": "array", "items": _REPLICATED}}},
            "mps": {"type": "object", "additionalProperties": False, "properties": {
                "renameByDefault": {"type": "boolean"},
                "resources": {"type": "array", "items": _REPLICATED}}}}},
    },
}


def parse_plugin_config(text: str) -> dict[str, Any]:
    """A time-slicing key's text as the device plugin reads it (raises on a config it would refuse)."""
    doc = yaml.safe_load(text)
    jsonschema.validate(doc, DEVICE_PLUGIN_CONFIG_SCHEMA)
    return dict(doc)


def shared_replicas(config: Mapping[str, Any]) -> tuple[int, bool]:
    """Replicas of nvidia.com/gpu and whether the shares are renamed to `.shared`."""
    slicing = (config.get("sharing") or {}).get("timeSlicing") or {}
    for resource in slicing.get("resources") or []:
        if resource["name"] == GPU_RESOURCE:
            return int(resource["replicas"]), bool(slicing.get("renameByDefault")) or bool(resource.get("rename"))
    return 1, False


def mig_layouts(pci_id: str) -> dict[str, dict[str, int]]:
    """The default mig-parted config's layouts for a GPU with this PCI id (first matching entry each)."""
    doc = yaml.safe_load(MIG_PARTED_CONFIG.read_text())
    found: dict[str, dict[str, int]] = {}
    for name, entries in yaml.safe_load(doc["data"]["config.yaml"])["mig-configs"].items():
        for entry in entries:
            device_filter = entry.get("device-filter")
            if device_filter is None or pci_id in ([device_filter] if isinstance(device_filter, str)
                                                   else device_filter):
                found[name] = dict(entry.get("mig-devices") or {}) if entry["mig-enabled"] else {}
                break
    return found


def instances_from_csv(path: Path) -> dict[str, tuple[str, int]]:
    """Instance type -> (GPU product as GFD prints it, GPUs) from a catalog CSV (instance_type, model, gpus):
    the controller's catalog names GFD products, openb's model codes are mapped (objects.OPENB_PRODUCTS)."""
    import csv

    with open(path, newline="") as fh:
        return {row["instance_type"]: (OPENB_PRODUCTS.get(row["model"], (row["model"], 0))[0], int(row["gpus"]))
                for row in csv.DictReader(fh)}


class GpuOperator(InBackground):
    """Reacts to device-plugin and MIG labels; `reconcile_once()` is one pass, `start()` runs passes."""

    def __init__(self, api_client: client.ApiClient, *, namespace: str = "gpu-operator",
                 configmap: str = "time-slicing-config", delay: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, interval: float = 0.5,
                 instances: Mapping[str, tuple[str, int]] | None = None) -> None:
        self.core = client.CoreV1Api(api_client)
        self.instances = dict(instances or {})
        self._held: set[str] = set()
        self.namespace, self.configmap = namespace, configmap
        self.delay, self.clock = delay, clock
        self.errors: list[str] = []
        self.applied: list[tuple[str, str]] = []  # (node, layout) the MIG manager ran, in order
        self._failing: set[tuple[str, str]] = set()
        self._pending_since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._loop = PassLoop("test-gpu-operator", self.reconcile_once, interval)

    def fail(self, node: str, layout: str) -> None:
        """Make the MIG manager report `failed` for this layout on this node."""
        self._failing.add((node, layout))

    def hold(self, node: str) -> None:
        """Keep the device plugin from (re)registering this node's GPUs, as before its pod runs (a pass under
        way finishes first)."""
        with self._lock:
            self._held.add(node)

    def release(self, node: str) -> None:
        self._held.discard(node)

    def reconcile_once(self) -> int:
        with self._lock:
            nodes = read_items(self.core.list_node(_preload_content=False))
            pods = read_items(self.core.list_pod_for_all_namespaces(_preload_content=False))
            writes = 0
            for node in nodes:
                if node["metadata"]["name"] in self._held:
                    continue
                try:
                    writes += self._node(node, pods)
                except ApiException as exc:
                    if exc.status != 404:  # a node deleted since the list (Karpenter terminating it): no agent left
                        raise
            return writes

    def _node(self, node: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        if (node["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") != "true":
            return self._discover(node)
        return self._mig(node, pods) or self._plugin(node)

    # -- GPU Feature Discovery
    def _discover(self, node: dict[str, Any]) -> int:
        """GFD's labels and the device plugin's GPUs on a node of a GPU instance type."""
        product, gpus = self.instances.get((node["metadata"].get("labels") or {}).get(INSTANCE_TYPE_LABEL, ""),
                                           ("", 0))
        if not gpus:
            return 0
        labels, resources = gfd_labels(product, gpus)
        return self._publish(node, labels, resources)

    # -- device plugin
    def _plugin(self, node: dict[str, Any]) -> int:
        labels = node["metadata"].get("labels") or {}
        if labels.get(MIG_LABEL, "all-disabled") != "all-disabled":
            return 0
        gpus = int(labels.get("nvidia.com/gpu.count", "0"))
        key = labels.get(PLUGIN_LABEL)
        replicas, renamed = 1, False
        if key:
            try:
                data = json.loads(self.core.read_namespaced_config_map(
                    self.configmap, self.namespace, _preload_content=False).data).get("data") or {}
                replicas, renamed = shared_replicas(parse_plugin_config(data[key]))
            except (ApiException, KeyError, jsonschema.ValidationError, yaml.YAMLError) as exc:
                message = f"{node['metadata']['name']}: config {key!r}: {type(exc).__name__} {exc}"[:300]
                if message not in self.errors:
                    self.errors.append(message)
                return 0
        if replicas > 1 and renamed:
            resources = {SHARED_GPU_RESOURCE: str(gpus * replicas)}
        elif replicas > 1:
            resources = {GPU_RESOURCE: str(gpus * replicas)}
        else:
            resources = {GPU_RESOURCE: str(gpus)}
        product = labels.get("nvidia.com/gpu.product", "").removesuffix("-SHARED")
        new_labels = {"nvidia.com/gpu.replicas": str(replicas),
                      "nvidia.com/gpu.sharing-strategy": "time-slicing" if replicas > 1 else "none",
                      "nvidia.com/gpu.product": product + ("-SHARED" if replicas > 1 else "")}
        return self._publish(node, new_labels, resources)

    # -- MIG manager
    def _mig(self, node: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        wanted = labels.get(MIG_LABEL)
        if wanted is None or (wanted, "success") == (labels.get("kubeon-test/mig-applied"), labels.get(STATE_LABEL)):
            return 0
        if labels.get(STATE_LABEL) == "failed" and labels.get("kubeon-test/mig-failed") == wanted:
            return 0
        if labels.get(STATE_LABEL) != "pending" or name not in self._pending_since:
            self._pending_since[name] = self.clock()
            self._patch(name, {"metadata": {"labels": {STATE_LABEL: "pending"}}})
            return 1
        if self.clock() - self._pending_since[name] < self.delay:
            return 0
        del self._pending_since[name]
        product = DEFAULT_CATALOG.product(labels.get("nvidia.com/gpu.product", ""))
        layouts = mig_layouts(product.pci_device_ids[0]) if product and product.pci_device_ids else {}
        busy = any((p.get("spec") or {}).get("nodeName") == name and _gpu_pod(p) for p in pods)
        if (name, wanted) in self._failing or wanted not in layouts or busy:
            self._patch(name, {"metadata": {"labels": {STATE_LABEL: "failed", "kubeon-test/mig-failed": wanted}}})
            return 1
        gpus = int(labels.get("nvidia.com/gpu.count", "0"))
        devices = layouts[wanted]
        resources = ({MIG_RESOURCE_PREFIX + p.replace("+", "."): str(n * gpus) for p, n in devices.items()}
                     if devices else {GPU_RESOURCE: str(gpus)})
        self.applied.append((name, wanted))
        self._publish(node, {STATE_LABEL: "success", "kubeon-test/mig-applied": wanted, "kubeon-test/mig-failed": None,
                             "nvidia.com/mig.strategy": "mixed"}, resources)  # cluster-wide, as GFD prints it
        return 1

    # -- writes
    def _publish(self, node: dict[str, Any], labels: Mapping[str, str | None], resources: Mapping[str, str]) -> int:
        """Set GPU labels and replace the node's nvidia.com/* allocatable; 0 when nothing changes."""
        status = node.get("status") or {}
        old = {k: v for k, v in (status.get("allocatable") or {}).items() if k.startswith("nvidia.com/")}
        current = node["metadata"].get("labels") or {}
        if old == dict(resources) and all(current.get(k) == v for k, v in labels.items()):
            return 0
        self._patch(node["metadata"]["name"], {"metadata": {"labels": dict(labels)}})
        gpu_off = {k: None for k in old if k not in resources}
        body = {"status": {"allocatable": {**gpu_off, **resources}, "capacity": {**gpu_off, **resources}}}
        self.core.patch_node_status(node["metadata"]["name"], body, _content_type=MERGE_PATCH,
                                    _preload_content=False)
        return 1

    def _patch(self, name: str, body: dict[str, Any]) -> None:
        self.core.patch_node(name, body, _content_type=MERGE_PATCH, _preload_content=False)


def _gpu_pod(pod: Mapping[str, Any]) -> bool:
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if any(str(k).startswith("nvidia.com/") for k in limits):
            return True
    return False
