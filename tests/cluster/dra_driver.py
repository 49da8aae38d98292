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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupolicy.catalog import DEFAULT_CATALOG, Catalog

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
