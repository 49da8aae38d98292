"""One loopback cluster: the real control plane, optionally the optimizer as the chart renders it and
real Karpenter, and the GPU Operator shim (the only stand-in: we have no GPUs).

    with Cluster(kubeon=True) as cluster:
        cluster.kubeconfig, cluster.api            # admin kubeconfig path, kubernetes ApiClient
        cluster.create_node(make_node("a100-0"))   # a KWOK node carrying what GFD and the device plugin publish
        ns = cluster.namespace("t-example")        # created, its default ServiceAccount there
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException

from tests.cluster.control_plane import KWOK_ANNOTATION, NO_EGRESS, ControlPlane, remove_state, scratch_dir
from tests.cluster.gpu_operator import GpuOperator, instances_from_csv
from tests.cluster.karpenter import INSTANCES, start_karpenter
from tests.cluster.keda import SUBNET, AdapterNetwork, start_keda
from tests.cluster.kubeon import GPU_OPERATOR_NAMESPACE, REPO, Kubeon, ensure_namespace

MERGE_PATCH = "application/merge-patch+json"


class Cluster:
    def __init__(self, root: Path | None = None, *, kubeon: bool = False, karpenter: bool = False,
                 gpu_operator: bool = True, kubeon_sets: tuple[str, ...] = (),
                 kubeon_components: tuple[str, ...] = Kubeon.COMPONENTS,
                 kubeon_args: dict[str, list[str]] | None = None,
                 node_registration_delay: str = "1s", karpenter_instances: Path = INSTANCES,
                 keep_state: bool = False, apiserver_env: Mapping[str, str] | None = None,
                 keda: bool = False, controller_manager_args: tuple[str, ...] = ()) -> None:
        """`kubeon`: the optimizer as the chart renders it (`kubeon_sets` helm values, `kubeon_components`
        which parts run, `kubeon_args` extra flags per part); `karpenter`: real Karpenter with its KWOK
        provider (`node_registration_delay` on its KWOKNodeClass, instance types from the catalog CSV
        `karpenter_instances`); `gpu_operator`: the GPU Operator shim; `apiserver_env`: extra
        environment of kube-apiserver (e.g. HTTPS_PROXY to reach Services); `keda`: real KEDA, its
        operator and its metrics adapter behind `v1beta1.external.metrics.k8s.io` (tests/cluster/keda.py);
        `controller_manager_args`: extra kube-controller-manager flags (e.g. the HPA's sync period)."""
        self._own_root = root is None
        self.root = root or scratch_dir()
        self.keep_state = keep_state
        self.plane = ControlPlane(self.root)
        self.plane.apiserver_env = dict(apiserver_env or {})
        self.plane.controller_manager_args = list(controller_manager_args)
        self.keda_network = AdapterNetwork() if keda else None
        if keda:
            # the adapter's address is the one dial kube-apiserver makes off loopback; the HPA
            # controller writes as its own ServiceAccount, so the audit log names its scale writes
            self.plane.aggregator_routing = True
            self.plane.apiserver_env["NO_PROXY"] = f"{NO_EGRESS['NO_PROXY']},{SUBNET}"
            self.plane.controller_manager_args.append("--use-service-account-credentials=true")
        self.kubeon = Kubeon(self.plane, kubeon_sets, kubeon_components, kubeon_args) if kubeon else None
        self.node_registration_delay = node_registration_delay
        self.karpenter_instances = karpenter_instances
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
            if self.keda_network is not None:
                self.keda_network.create()
            self.plane.start()
            self.api = config.new_client_from_config(str(self.kubeconfig))
            if self.keda_network is not None:
                start_keda(self.plane, self.api, self.keda_network)
            if self.with_karpenter:
                start_karpenter(self.plane, self.api, self.node_registration_delay, self.karpenter_instances)
            if self.kubeon:
                self.kubeon.start(self.api)
            if self.with_gpu_operator:
                ensure_namespace(self.api, GPU_OPERATOR_NAMESPACE)
                self.gpu_operator = GpuOperator(self.api, instances=instances_from_csv(self.karpenter_instances)
                                                if self.with_karpenter else None)
                self.gpu_operator.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.gpu_operator is not None:
            self.gpu_operator.stop()
        self.plane.stop()
        if self.keda_network is not None:
            self.keda_network.remove()
        if self.api is not None:
            self.api.close()
        if self._own_root and not self.keep_state:
            remove_state(self.root)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers for tests

    @property
    def api_client(self) -> client.ApiClient:
        assert self.api is not None, "the cluster is not started"
        return self.api

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def policy(self) -> client.PolicyV1Api:
        return client.PolicyV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def create_node(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a KWOK-managed node (the annotation KWOK selects on) with the status given: what the
        kubelet, GPU Feature Discovery and the device plugin would have published."""
        meta = dict(body["metadata"])
        meta["annotations"] = {**(meta.get("annotations") or {}), KWOK_ANNOTATION: "fake"}
        created = read(self.core.create_node({**body, "metadata": meta}, _preload_content=False))
        wanted = {k: v for k, v in (body.get("status") or {}).items() if k in ("capacity", "allocatable")}
        if wanted and any((created.get("status") or {}).get(k) != v for k, v in wanted.items()):
            created = read(self.core.patch_node_status(meta["name"], {"status": wanted},
                                                       _content_type=MERGE_PATCH, _preload_content=False))
        return created

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create any object (nodes through `create_node`); its namespace is made when missing."""
        body = dict(obj)
        if body["kind"] == "Node":
            return self.create_node(body)
        namespace = (body.get("metadata") or {}).get("namespace")
        if namespace:
            self.ensure_namespace(namespace)
        resource = dynamic.DynamicClient(self.api).resources.get(api_version=body["apiVersion"], kind=body["kind"])
        created = resource.create(body=body, namespace=namespace if resource.namespaced else None)
        return dict(created.to_dict())

    def ensure_namespace(self, name: str, labels: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
        """Create `name` (if missing) and wait for its default ServiceAccount: pods are refused before it."""
        try:
            self.core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}},
                                       _preload_content=False)
        except ApiException as error:
            if error.status != 409:
                raise
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.core.read_namespaced_service_account("default", name, _preload_content=False)
                return name
            except ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def delete_namespace(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespace(name)

    def pods(self, namespace: str | None = None, selector: str | None = None, *,
             bound: bool | None = None, ready: bool | None = None) -> list[dict[str, Any]]:
        """Pods as wire dicts, sorted by name; `bound`/`ready` filter on spec.nodeName and Ready."""
        kwargs: dict[str, Any] = {"label_selector": selector} if selector else {}
        response = (self.core.list_namespaced_pod(namespace, _preload_content=False, **kwargs) if namespace
                    else self.core.list_pod_for_all_namespaces(_preload_content=False, **kwargs))
        items = [p for p in read(response)["items"] if not p["metadata"].get("deletionTimestamp")]
        if bound is not None:
            items = [p for p in items if bool((p.get("spec") or {}).get("nodeName")) == bound]
        if ready is not None:
            items = [p for p in items if any(c.get("type") == "Ready" and c.get("status") == "True"
                                             for c in (p.get("status") or {}).get("conditions") or []) == ready]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def events(self, namespace: str = "default", reason: str | None = None) -> list[dict[str, Any]]:
        items = read(self.core.list_namespaced_event(namespace, _preload_content=False))["items"]
        return [e for e in items if reason is None or e.get("reason") == reason]

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 30.0, message: str = "") -> Any:
        """Poll `predicate` until it is truthy; fail naming `message` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
            time.sleep(0.1)

    def wait_nodes_settled(self, *names: str, timeout: float = 60.0) -> None:
        """Wait until KWOK has made each node Ready and the node lifecycle controller has lifted the
        `node.kubernetes.io/not-ready` taint admission puts on every new node: before that, a scheduler
        passes over the node, and a test comparing two nodes compares one."""
        def settled(name: str) -> bool:
            node = self.core.read_node(name)
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            return ready and not any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
        self.wait_for(lambda: all(settled(n) for n in names), timeout=timeout, message=f"nodes {names} settled")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run real kubectl (1.35, .tools/bin) against this cluster's admin kubeconfig."""
        done = subprocess.run([kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done


def read(response: Any) -> dict[str, Any]:
    """The JSON body of a `_preload_content=False` response."""
    return dict(json.loads(response.data))


def kubectl_binary() -> str:
    tools = REPO / ".tools" / "bin" / "kubectl"
    return str(tools) if tools.exists() else "kubectl"
