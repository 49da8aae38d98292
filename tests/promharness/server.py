"""Starts the real Prometheus (Debian's /usr/bin/prometheus) for a test, with backfilled history.

Why backfill: scale to zero asks for samples covering the whole idle window
and right-sizing looks back days; a test cannot wait that long. Before
Prometheus starts, the exporter's scripts are evaluated over the past
`history` seconds at `step` spacing, written as OpenMetrics and turned into
TSDB blocks with `promtool tsdb create-blocks-from openmetrics` in the
fresh storage dir. The backfilled series carry the same job/instance labels
a scrape adds, so history and live samples are one series. Prometheus loads
the blocks at start (about 0.2 s), then scrapes the exporter every 1 s;
the first scrape comes about 5 s after start (the scrape manager applies
targets on a 5 s tick), so tests that only read history pass
`wait_scrape=False` and do not wait for it.

No gap between history and the first scrape: the history runs `lead`
seconds (default 10) past the start, to cover the scrape manager's tick and
a slow start on a loaded machine. Prometheus drops scraped samples older
than its newest block (out of bounds), so until then the scripts' values
come from the history alone, and from then on from the scrapes: one series
without a hole (a hole longer than scale to zero's max gap reads, rightly,
as "not known idle"; with the history ending at the start, the hole was
the tick plus a loaded start, over the 6 s max gap of the scale-to-zero
tests about 1 run in 4 under load). A script changed in
those first `lead` seconds shows once they have passed: `wait_for` waits
that long beyond its timeout, and `live_after` says when.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from tests.loopback import free_port
from tests.promharness.exporter import DcgmExporter, escape, format_labels

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
JOB = "dcgm"


def available() -> str | None:
    """None when Prometheus and promtool can run, else the reason they cannot."""
    for tool in (PROMETHEUS, PROMTOOL):
        if not Path(tool).exists():
            return f"{tool} not installed (scripts/install-test-deps.sh installs Debian's prometheus)"
    return None


def openmetrics_history(exporter: DcgmExporter, start: float, end: float, step: float) -> str:
    """The exporter's scripts over [start, end) as an OpenMetrics text (families contiguous)."""
    families: dict[str, list[str]] = {}
    t = start
    times = []
    while t < end:
        times.append(t)
        t += step
    for s in exporter.series():
        labels = dict(s.labels, job=JOB, instance=exporter.address)
        rendered = format_labels(labels)
        lines = families.setdefault(s.metric, [])
        for at in times:
            value = s.script(at)
            if value is not None:
                lines.append(f"{s.metric}{rendered} {value:g} {at:.3f}")
    out: list[str] = []
    for metric, lines in families.items():
        if lines:
            out += [f"# TYPE {metric} gauge", f"# HELP {metric} {escape(metric)}", *lines]
    out.append("# EOF")
    return "\n".join(out) + "\n"


class PrometheusServer:
    """One Prometheus process on 127.0.0.1:<free port>, temp storage, scraping one exporter."""

    def __init__(self, exporter: DcgmExporter, *, history: float = 0.0, step: float = 1.0,
                 wait_scrape: bool = True, lead: float = 10.0) -> None:
        self.exporter = exporter
        self.dir = Path(tempfile.mkdtemp(prefix="kubeon-prom-"))
        self.storage = self.dir / "data"
        self.storage.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        start = time.time()
        # Scraped samples before `live_after` are dropped (older than the newest block): the history
        # covers them, up to past the first scrape.
        self.live_after = start + lead if history > 0 else start
        if history > 0:
            self._backfill(start - history, self.live_after, step)
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n- job_name: {JOB}\n  static_configs:\n  - targets: ['{exporter.address}']\n"
        )
        self.log = (self.dir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.storage}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=15d",
                "--web.enable-lifecycle", "--log.level=warn",
            ],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready(wait_scrape)
        except BaseException:
            self.stop()
            raise

    def _backfill(self, start: float, end: float, step: float) -> None:
        text = openmetrics_history(self.exporter, start, end, step)
        source = self.dir / "history.om"
        source.write_text(text)
        subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.storage)],
            check=True, capture_output=True, timeout=60,
        )

    def _wait_ready(self, wait_scrape: bool, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.dir / 'prometheus.log').read_text()[-2000:]}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.05)
        else:
            raise TimeoutError("prometheus not ready")
        if not wait_scrape:
            return
        # The first scrape (Prometheus applies scrape targets ~5 s after start): `up` says it happened.
        self.wait_for(f'up{{job="{JOB}"}} == 1', timeout=max(1.0, deadline - time.monotonic()))

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = at
        body = requests.get(f"{self.url}/api/v1/query", params=params, timeout=5).json()
        if body.get("status") != "success":
            raise RuntimeError(f"{promql}: {body}")
        return list(body["data"]["result"])

    def wait_for(self, promql: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Poll until the query returns something (e.g. a freshly scripted value was scraped).

        `timeout` counts from when scrapes are live: a script changed while the history still
        covers now shows only after `live_after`."""
        deadline = time.monotonic() + timeout + max(0.0, self.live_after - time.time())
        while True:
            result = self.query(promql)
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result for {promql} after {timeout}s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
