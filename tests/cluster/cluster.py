"""One loopback cluster: the real control plane, optionally the optimizer as the chart renders it and
real Karpenter, and the GPU Operator shim (the only stand-in: we have no GPUs).

    with Cluster(kubeon=True) as cluster:
        cluster.kubeconfig, cluster.api            # admin kubeconfig path, kubernetes ApiClient
        cluster.create_node(make_node("a100-0"))   # a KWOK node carrying what GFD and the device plugin publish
        ns = cluster.namespace("t-example")        # created, its default ServiceAccount there
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.cluster.control_plane import KWOK_ANNOTATION, ControlPlane, remove_state, scratch_dir
from tests.cluster.karpenter import start_karpenter
from tests.cluster.kubeon import GPU_OPERATOR_NAMESPACE, Kubeon, ensure_namespace


class Cluster:
    def __init__(self, root: Path | None = None, *, kubeon: bool = False, karpenter: bool = False,
                 gpu_operator: bool = True, kubeon_sets: tuple[str, ...] = (), keep_state: bool = False) -> None:
        self._own_root = root is None
        self.root = root or scratch_dir()
        self.keep_state = keep_state
        self.plane = ControlPlane(self.root)
        self.kubeon = Kubeon(self.plane, kubeon_sets) if kubeon else None
        self.with_karpenter = karpenter
        self.with_gpu_operator = gpu_operator
        self.gpu_operator: Any = None
        self.api: client.ApiClient | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def url(self) -> str:
        return self.plane.url

    def start(self) -> Cluster:
        try:
            self.plane.start()
            self.api = config.new_client_from_config(str(self.kubeconfig))
            if self.with_karpenter:
                start_karpenter(self.plane, self.api)
            if self.kubeon:
                self.kubeon.start(self.api)
            if self.with_gpu_operator:
                from tests.kubeapi.gpu_operator import GpuOperator
                ensure_namespace(self.api, GPU_OPERATOR_NAMESPACE)
                self.gpu_operator = GpuOperator(self.api)
                self.gpu_operator._loop.interval = 0.5
                self.gpu_operator.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.gpu_operator is not None:
            self.gpu_operator.stop()
        self.plane.stop()
        if self.api is not None:
            self.api.close()
        if self._own_root and not self.keep_state:
            remove_state(self.root)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers for tests

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def create_node(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a KWOK-managed node (the annotation KWOK selects on), its status as given."""
        body = {**body, "metadata": {**body["metadata"], "annotations": {
            **(body["metadata"].get("annotations") or {}), KWOK_ANNOTATION: "fake"}}}
        status = body.get("status") or {}
        self.core().create_node(body)
        if status:  # a create may drop status; the device plugin and GFD write it as the kubelet would
            self.core().patch_node_status(body["metadata"]["name"], {"status": {
                k: v for k, v in status.items() if k in ("capacity", "allocatable")}})
        return body

    def namespace(self, name: str, labels: dict[str, str] | None = None, timeout: float = 30.0) -> str:
        """Create `name` and wait for its default ServiceAccount (pods are refused before it)."""
        self.core().create_namespace({"metadata": {"name": name, "labels": labels or {}}})
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.core().read_namespaced_service_account("default", name)
                return name
            except ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def delete_namespace(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.core().delete_namespace(name)
