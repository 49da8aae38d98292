"""A DCGM-format test exporter: a tiny HTTP server whose series the test scripts over time.

Each series is (metric name, labels, script); a script maps wall-clock time
to a value or None (the series is absent at that moment, as when a pod is
gone). The same scripts produce the backfilled history (see server.py), so
history and live scrapes tell one story.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Script = Callable[[float], float | None]

HELP = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
}


def constant(value: float) -> Script:
    return lambda _t: value


def absent() -> Script:
    return lambda _t: None


def phases(origin: float, steps: Iterable[tuple[float, Script]]) -> Script:
    """Run scripts one after another from `origin` (durations in seconds); the last one lasts."""
    plan = list(steps)

    def script(t: float) -> float | None:
        at = origin
        for duration, inner in plan:
            if t < at + duration:
                return inner(t)
            at += duration
        return plan[-1][1](t) if plan else None

    return script


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items())) + "}"


def gpu_labels(
    *,
    namespace: str,
    pod: str,
    gpu: int = 0,
    host: str = "gpu-node-1",
    host_label: str = "Hostname",
    model: str = "NVIDIA H200",
    container: str = "main",
    mig_profile: str | None = None,
    mig_id: int = 0,
) -> dict[str, str]:
    """The labels dcgm-exporter puts on a per-GPU series (MIG adds GPU_I_PROFILE, GPU_I_ID)."""
    labels = {
        "gpu": str(gpu),
        "UUID": f"GPU-{zlib.crc32(f'{host}/{gpu}'.encode()):08x}-0000-0000-0000-000000000000",
        "pci_bus_id": f"00000000:{gpu + 0x18:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": model,
        host_label: host,
        "DCGM_FI_DRIVER_VERSION": "580.159.04",
        "container": container,
        "namespace": namespace,
        "pod": pod,
    }
    if mig_profile:
        labels["GPU_I_PROFILE"] = mig_profile
        labels["GPU_I_ID"] = str(mig_id)
    return labels


@dataclass
class ScriptedSeries:
    metric: str
    labels: dict[str, str]
    script: Script


class DcgmExporter:
    """Serves /metrics on 127.0.0.1 (free port) in the Prometheus text format."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], ScriptedSeries] = {}
        self._lock = threading.Lock()
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = exporter.render(time.time()).encode()
                exporter.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def put(self, metric: str, labels: Mapping[str, str], script: Script) -> None:
        """Add or replace a series (same metric + labels replaces its script)."""
        key = (metric, tuple(sorted(labels.items())))
        with self._lock:
            self._series[key] = ScriptedSeries(metric, dict(labels), script)

    def remove(self, metric: str, labels: Mapping[str, str]) -> None:
        with self._lock:
            self._series.pop((metric, tuple(sorted(labels.items()))), None)

    def series(self) -> list[ScriptedSeries]:
        with self._lock:
            return sorted(self._series.values(), key=lambda s: (s.metric, sorted(s.labels.items())))

    def samples_at(self, t: float) -> list[tuple[ScriptedSeries, float]]:
        out = []
        for s in self.series():
            value = s.script(t)
            if value is not None and not math.isnan(value):
                out.append((s, float(value)))
        return out

    def render(self, t: float) -> str:
        lines: list[str] = []
        current = None
        for s, value in self.samples_at(t):
            if s.metric != current:
                kind, text = HELP.get(s.metric, ("gauge", s.metric))
                lines += [f"# HELP {s.metric} {text}", f"# TYPE {s.metric} {kind}"]
                current = s.metric
            lines.append(f"{s.metric}{format_labels(s.labels)} {value:g}")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
