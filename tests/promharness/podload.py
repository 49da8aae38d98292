"""GPU utilisation per pod, as dcgm-exporter reports it: one series per running pod of a workload.

dcgm-exporter on each GPU node labels a GPU's series with the pod holding it, so a workload's
series come and go with its pods. `PodGpuLoad` plays that for one Deployment on the loopback
cluster: every `period` seconds it lists the workload's bound pods and keeps one
`DCGM_FI_DEV_GPU_UTIL` series per pod at the level the test sets (`set(percent)`), removing the
series of pods that are gone.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.promharness.exporter import DcgmExporter, gpu_labels

UTIL = "DCGM_FI_DEV_GPU_UTIL"


class PodGpuLoad:
    def __init__(self, exporter: DcgmExporter, pods: Any, namespace: str, selector: str,
                 period: float = 0.5) -> None:
        """`pods(namespace, selector)` lists the workload's pods (tests.cluster.Cluster.pods)."""
        self.exporter, self.pods, self.namespace, self.selector = exporter, pods, namespace, selector
        self.level = 0.0
        self.period = period
        self._shown: dict[str, dict[str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodGpuLoad:
        self._thread.start()
        return self

    def set(self, percent: float) -> None:
        self.level = percent

    def sync(self) -> None:
        running = {p["metadata"]["name"]: p["spec"]["nodeName"]
                   for p in self.pods(self.namespace, self.selector, bound=True)}
        for name in set(self._shown) - set(running):
            self.exporter.remove(UTIL, self._shown.pop(name))
        for name, node in running.items():
            if name not in self._shown:
                labels = gpu_labels(namespace=self.namespace, pod=name, host=node)
                self.exporter.put(UTIL, labels, lambda _t: self.level)
                self._shown[name] = labels

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sync()
            except Exception:  # a list failing while the cluster stops: the next tick retries
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
