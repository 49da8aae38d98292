"""The NVIDIA DRA driver shim: what its kubelet plugin and Helm chart publish, for KWOK GPU nodes.

Test hardware, like the GPU Operator shim: we have no GPUs, so nothing runs NVML. It writes
- the driver chart's DeviceClasses `gpu.nvidia.com` and `mig.nvidia.com`, copied from
  kubernetes-sigs/dra-driver-nvidia-gpu `deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml`
  and `deviceclass-mig.yaml` (commit 95932046; `extendedResourceName` left out: KEP-5004's gate is off in
  1.35 and kube-apiserver drops the field);
- one ResourceSlice per node (driver `gpu.nvidia.com`, pool = the node's name), its devices as the
  plugin's `GetDevice` builds them (`cmd/gpu-kubelet-plugin/deviceinfo.go`, `mig.go`): attributes `type`,
  `productName` (NVML's name: GFD's label with spaces), `uuid`, and for MIG `profile` and `parentUUID`;
  capacity `memory` in bytes (MIG: the profile's real memory, from our catalog: `nvidia-smi mig -lgip`
  figures for the H200) and `multiprocessors`.

`DraDriver` is the driver's kubelet plugin on nodes that come and go (Karpenter's): it watches nodes
carrying a label it is given and publishes each one's slice from what GPU Feature Discovery says of the
node (`nvidia.com/gpu.product`, `nvidia.com/gpu.count`) and, once the MIG manager applied a layout
(`nvidia.com/mig.config.state=success`), that layout's MIG devices (the GPU Operator shim's lookup in
mig-parted's default config): the order the real plugin follows, which starts after MIG is set up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupolicy.catalog import DEFAULT_CATALOG, Catalog
from kube import rest
from tests.cluster.loops import InBackground, PassLoop, read_items

DRIVER = "gpu.nvidia.com"
SMS_PER_SLICE = {"NVIDIA-H200": 16, "NVIDIA-A100-SXM4-40GB": 14}  # multiprocessors per compute slice


def device_classes() -> list[dict[str, Any]]:
    """The driver chart's two GPU DeviceClasses (resource.k8s.io/v1)."""
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"{kind}.nvidia.com"},
             "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                                           f"device.attributes['{DRIVER}'].type == '{kind}'"}}]}}
            for kind in ("gpu", "mig")]


def _text(value: str) -> dict[str, str]:
    return {"string": value}


def _gpu(node: str, index: int, product: str, catalog: Catalog) -> dict[str, Any]:
    entry = catalog.product(product)
    assert entry is not None, product
    sms = SMS_PER_SLICE.get(product, 16) * entry.compute_slices
    return {"name": f"gpu-{index}", "attributes": {
        "type": _text("gpu"), "productName": _text(product.replace("-", " ", 1)),
        "uuid": _text(f"GPU-{node}-{index}")},
        "capacity": {"memory": {"value": f"{entry.memory_mib}Mi"}, "multiprocessors": {"value": str(sms)}}}


def _mig(node: str, index: int, product: str, profile: str, slot: int, catalog: Catalog) -> dict[str, Any]:
    entry = catalog.product(product)
    found = entry.profile(profile) if entry is not None else None
    assert found is not None, (product, profile)
    sms = SMS_PER_SLICE.get(product, 16) * found.compute_slices
    return {"name": f"gpu-{index}-mig-{profile.replace('.', '')}-{slot}", "attributes": {
        "type": _text("mig"), "profile": _text(profile), "productName": _text(product.replace("-", " ", 1)),
        "parentUUID": _text(f"GPU-{node}-{index}"), "uuid": _text(f"MIG-{node}-{index}-{slot}")},
        "capacity": {"memory": {"value": f"{found.memory_mib}Mi"}, "multiprocessors": {"value": str(sms)}}}


def resource_slice(node: str, product: str, gpus: int, mig: Sequence[str] | None = None,
                   catalog: Catalog = DEFAULT_CATALOG) -> dict[str, Any]:
    """The ResourceSlice the driver's plugin on `node` publishes: `gpus` whole GPUs, or each GPU cut into
    the MIG profiles `mig` (one device per instance, in that order)."""
    devices: list[dict[str, Any]] = []
    for index in range(gpus):
        if mig:
            devices += [_mig(node, index, product, profile, slot, catalog) for slot, profile in enumerate(mig)]
        else:
            devices.append(_gpu(node, index, product, catalog))
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                     "resourceSliceCount": 1},
                     "devices": devices}}


def publish(cluster: Any, slices: Sequence[Mapping[str, Any]]) -> None:
    """Create the DeviceClasses (once) and the slices, as the driver's chart and plugins would."""
    for obj in [*device_classes(), *slices]:
        try:
            cluster.create(obj)
        except Exception as exc:  # a DeviceClass a previous test of the module made
            if getattr(exc, "status", None) != 409:
                raise


def node_slice(node: Mapping[str, Any], catalog: Catalog = DEFAULT_CATALOG) -> dict[str, Any] | None:
    """The slice the plugin publishes for `node` as GFD and the MIG manager left it; None before it can."""
    from tests.cluster.gpu_operator import mig_layouts

    labels = node["metadata"].get("labels") or {}
    product = catalog.product(labels.get("nvidia.com/gpu.product", ""))
    gpus = int(labels.get("nvidia.com/gpu.count", "0") or 0)
    if product is None or gpus <= 0:
        return None
    layout = labels.get("nvidia.com/mig.config")
    if layout is None:
        return resource_slice(node["metadata"]["name"], product.product, gpus, catalog=catalog)
    if labels.get("nvidia.com/mig.config.state") != "success" or not product.pci_device_ids:
        return None
    devices = mig_layouts(product.pci_device_ids[0]).get(layout)
    if devices is None:
        return None
    profiles = [profile for profile, count in devices.items() for _ in range(count)]
    return resource_slice(node["metadata"]["name"], product.product, gpus, profiles or None, catalog)


class DraDriver(InBackground):
    """The driver's plugin on every node labelled `selector` (key=value): one slice each, kept current."""

    def __init__(self, api_client: client.ApiClient, selector: str, interval: float = 0.5) -> None:
        self.api, self.core, self.selector = api_client, client.CoreV1Api(api_client), selector
        self.published: dict[str, dict[str, Any]] = {}  # node -> the slice last written
        self._loop = PassLoop("test-dra-driver", self.reconcile_once, interval)

    def reconcile_once(self) -> int:
        writes = 0
        nodes = read_items(self.core.list_node(label_selector=self.selector, _preload_content=False))
        for node in nodes:
            wanted = node_slice(node)
            name = node["metadata"]["name"]
            if wanted is None or self.published.get(name) == wanted:
                continue
            path = "/apis/resource.k8s.io/v1/resourceslices"
            try:  # the plugin replaces its slice when the devices change (a new MIG layout)
                rest.call(self.api, "DELETE", f"{path}/{wanted['metadata']['name']}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
            rest.call(self.api, "POST", path, body=wanted)
            self.published[name] = wanted
            writes += 1
        return writes
