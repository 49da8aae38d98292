"""Real Prometheus for controller tests: a scripted DCGM exporter plus a Prometheus process.

- exporter.py: DcgmExporter serves DCGM-format series scripted over time.
- h200.py: replays the real H200 trace (idle, busy, bursty) as such a script.
- server.py: PrometheusServer backfills history from the scripts with promtool,
  then starts /usr/bin/prometheus on a free loopback port scraping every 1 s.
"""

from tests.promharness.exporter import DcgmExporter, absent, constant, gpu_labels, phases
from tests.promharness.h200 import replay
from tests.promharness.server import PrometheusServer, available

__all__ = [
    "DcgmExporter", "PrometheusServer", "absent", "available", "constant", "gpu_labels", "phases", "replay",
]
