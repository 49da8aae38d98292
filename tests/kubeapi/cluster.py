"""`Cluster`: the test API server plus the loops that make it behave like a cluster.

    with Cluster(nodes=[make_node("a100-0")]) as cluster:
        cluster.create(make_deployment("llm", gpus=1, replicas=2))
        cluster.wait_for(lambda: len(cluster.pods("default", "app=llm", bound=True)) == 2)

Loops: the scheduler stand-in (tests/kubeapi/scheduler.py), the workload
controllers and kubelet stand-in (workloads.py) and the Karpenter stand-in
(karpenter.py). `background=True` (the default) runs them in threads, which
is what end-to-end tests want; `background=False` leaves them still and the
test drives them with `step()` / `settle()` for fully deterministic runs.

Every loop talks to the server only through the `kubernetes` client over
HTTP, with the kubeconfig the server generates, like the components under
test. Later issues hook in by passing `extenders=` (or calling
`use_extenders`) and by starting their own processes against
`cluster.kubeconfig`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from simulator.kubescheduler import Profile
from tests.cluster.objects import DEFAULT_SCHEDULER, NODECLAIM_CRD, NODEPOOL_CRD, SCALEDOBJECT_CRD
from tests.kubeapi.karpenter import Karpenter
from tests.kubeapi.scheduler import Extender, ExtenderConfig, Scheduler, read_items
from tests.kubeapi.workloads import Kubelet, WorkloadController

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_CRDS = (NODECLAIM_CRD, NODEPOOL_CRD, SCALEDOBJECT_CRD)


def kubectl_binary() -> str:
    """kubectl 1.35 from .tools/bin (scripts/install-test-deps.sh), else the machine's kubectl."""
    for candidate in (REPO / ".tools" / "bin" / "kubectl", shutil.which("kubectl")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError("kubectl not found: run scripts/install-test-deps.sh")


class Cluster:
    """Starts the test API server with the upstream CRDs, creates nodes, runs the loops; a context manager."""

    def __init__(
        self,
        *,
        nodes: Iterable[Mapping[str, Any]] = (),
        crd_files: Sequence[str | Path] = (),
        scheduler_name: str | None = DEFAULT_SCHEDULER,
        extenders: Sequence[ExtenderConfig] = (),
        background: bool = True,
        karpenter: bool = True,
        launch_delay: float | None = None,
        interval: float = 0.05,
        port: int = 0,
    ) -> None:
        self._nodes = [dict(n) for n in nodes]
        self._crd_files = [str(p) for p in (*UPSTREAM_CRDS, *crd_files) if Path(p).is_file()]
        self._scheduler_name = scheduler_name
        self._extenders = list(extenders)
        self.background = background
        self._with_karpenter = karpenter
        self._launch_delay = launch_delay if launch_delay is not None else (0.2 if background else 0.0)
        self._interval = interval
        self._port = port
        self.api: Any = None
        self.api_client: client.ApiClient | None = None

    # -- lifecycle
    def __enter__(self) -> Cluster:
        from tests.kubeapi import ApiServer  # the server is another module's; imported only when used

        self.api = ApiServer.start(crd_files=self._crd_files, port=self._port)
        try:
            self.api_client = self.api.api_client()
            self.core = client.CoreV1Api(self.api_client)
            self.apps = client.AppsV1Api(self.api_client)
            self.policy = client.PolicyV1Api(self.api_client)
            self.custom = client.CustomObjectsApi(self.api_client)
            self.scheduler = Scheduler(self.api_client, scheduler_name=self._scheduler_name,
                                       extenders=self._extenders, interval=self._interval)
            self.workloads = WorkloadController(self.api_client)
            self.kubelet = Kubelet(self.api_client)
            self.karpenter = (Karpenter(self.api_client, launch_delay=self._launch_delay)
                              if self._with_karpenter else None)
            for node in self._nodes:
                self.create(node)
            if self.background:
                self.start_loops()
        except BaseException:
            self.api.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.stop_loops()
        if self.api is not None:
            self.api.stop()
            self.api = None

    def _loops(self) -> list[Any]:
        return [loop for loop in (self.scheduler, self.workloads, self.kubelet, self.karpenter) if loop]

    def start_loops(self) -> None:
        for loop in self._loops():
            loop.start()

    def stop_loops(self) -> None:
        """Every loop is asked to stop first and then joined, so a shutdown waits for the slowest pass in
        flight, not for the sum of them (four passes under load overran `serve`'s 20 s SIGINT budget)."""
        loops = self._loops() if self.api_client is not None else []
        for loop in loops:
            loop.request_stop()
        for loop in loops:
            loop.stop()

    @property
    def url(self) -> str:
        return str(self.api.url)

    @property
    def kubeconfig(self) -> str:
        return str(self.api.kubeconfig)

    # -- hooks for later issues
    def use_extenders(self, extenders: Sequence[ExtenderConfig], profile: Profile | None = None) -> None:
        """Point the scheduler at these extenders (e.g. a `kubeon-gpu extender` started by a fixture).

        `profile`: score like kube-scheduler with it (e.g. the chart's rendered profile); None: no scoring.
        """
        self.scheduler.extenders = [Extender(config) for config in extenders]
        self.scheduler.profile = profile

    # -- deterministic driving
    def step(self) -> int:
        """One pass of every loop, in cluster order; returns how many changes they made."""
        changes = sum(1 for placement in self.scheduler.schedule_once() if placement.node)
        changes += self.workloads.reconcile_once()
        changes += self.kubelet.sync_once()
        if self.karpenter is not None:
            changes += self.karpenter.reconcile_once()
        return changes

    def settle(self, max_rounds: int = 30) -> int:
        """Step until a pass changes nothing; fails loudly if it never settles."""
        for rounds in range(1, max_rounds + 1):
            if self.step() == 0:
                return rounds
        raise AssertionError(f"cluster did not settle in {max_rounds} passes")

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0, message: str = "") -> Any:
        """Poll `predicate` (stepping the loops when not in background) until it is truthy."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.background:
                self.step()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
            time.sleep(0.02 if not self.background else 0.05)

    # -- objects
    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create a wire-format object of a kind tests use; returns the stored object as a dict."""
        body = dict(obj)
        kind, meta = body["kind"], body.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        if kind not in ("Namespace", "Node", "NodeClaim", "NodePool", "GpuPolicy") and namespace != "default":
            self.ensure_namespace(namespace)
        calls: dict[str, Callable[[], Any]] = {
            "Namespace": lambda: self.core.create_namespace(body, _preload_content=False),
            "Node": lambda: self.core.create_node(body, _preload_content=False),
            "Pod": lambda: self.core.create_namespaced_pod(namespace, body, _preload_content=False),
            "ConfigMap": lambda: self.core.create_namespaced_config_map(namespace, body, _preload_content=False),
            "Deployment": lambda: self.apps.create_namespaced_deployment(namespace, body, _preload_content=False),
            "StatefulSet": lambda: self.apps.create_namespaced_stateful_set(namespace, body, _preload_content=False),
            "PodDisruptionBudget": lambda: self.policy.create_namespaced_pod_disruption_budget(
                namespace, body, _preload_content=False),
        }
        if kind in calls:
            created = json.loads(calls[kind]().data)
        else:
            group, version = body["apiVersion"].split("/")
            plural = kind.lower()[:-1] + "ies" if kind.endswith("y") else kind.lower() + "s"
            created = json.loads(self.custom.create_cluster_custom_object(
                group, version, plural, body, _preload_content=False).data)
        if kind == "Node" and not (created.get("status") or {}).get("allocatable") and body.get("status"):
            created = json.loads(self.core.patch_node_status(
                meta["name"], {"status": body["status"]}, _content_type="application/merge-patch+json",
                _preload_content=False).data)
        return created

    def ensure_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        try:
            self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": name, "labels": dict(labels or {})}},
                                       _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def pods(self, namespace: str | None = None, selector: str | None = None, *,
             bound: bool | None = None, ready: bool | None = None) -> list[dict[str, Any]]:
        """Pods as wire dicts, sorted by name; `bound`/`ready` filter on spec.nodeName and Ready."""
        kwargs: dict[str, Any] = {"label_selector": selector} if selector else {}
        if namespace:
            items = read_items(self.core.list_namespaced_pod(namespace, _preload_content=False, **kwargs))
        else:
            items = read_items(self.core.list_pod_for_all_namespaces(_preload_content=False, **kwargs))
        items = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        if bound is not None:
            items = [p for p in items if bool((p.get("spec") or {}).get("nodeName")) == bound]
        if ready is not None:
            items = [p for p in items if any(c.get("type") == "Ready" and c.get("status") == "True"
                                             for c in (p.get("status") or {}).get("conditions") or []) == ready]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def events(self, namespace: str = "default", reason: str | None = None) -> list[dict[str, Any]]:
        items = read_items(self.core.list_namespaced_event(namespace, _preload_content=False))
        return [e for e in items if reason is None or e.get("reason") == reason]

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run real kubectl against this cluster's kubeconfig; output is text."""
        result = subprocess.run([kubectl_binary(), "--kubeconfig", self.kubeconfig, *args], input=input,
                                capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result
