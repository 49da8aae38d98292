"""Reconciler: is the extender failing open? Its counters, read through its Service, into the policies' Ready.

kube-scheduler calls the extender as `ignorable` (the chart's profile): an
extender that answers internal errors, or that cannot be reached, leaves
pods placed by the stock plugins alone, unpacked, with nothing failing that a
user would see (issue 37). So each pass reads the extender's own /metrics
through the Service kube-scheduler calls (`--extender-url`, which the chart
sets to `http://<extender>.<namespace>.svc:8888`: no RBAC, the same path
kube-scheduler takes) and sums `kubeon_extender_decisions_total` for /filter
and /prioritize, all outcomes and `outcome="error"`. `gpupolicy.packing.health.judge`
turns two readings into a verdict; while degraded, the packing and typeFit
policies (those only the extender acts on, `gpupolicy.modes.HANDLERS`) say
`Ready=False, ExtenderDegraded` with the ratio in the message, and `Ready=True`
again once a window of answers is below the threshold
(`--extender-error-ratio`, default 10%). The chart runs one extender replica
(its state is per process): the Service reaches that one.
"""

from __future__ import annotations

import logging

import requests
from prometheus_client.parser import text_string_to_metric_families

from controller.context import ControllerContext
from gpupolicy.modes import Component
from gpupolicy.packing.health import HEALTHY, Answers, Health, judge

log = logging.getLogger(__name__)

DECISIONS = "kubeon_extender_decisions"  # the counter family (samples `..._total{verb,strategy,outcome}`)
VERBS = ("filter", "prioritize")  # the answers kube-scheduler ignores when they fail
TIMEOUT_SECONDS = 5.0
MAX_BYTES = 4 * 1024 * 1024


class Unreadable(Exception):
    """The extender's metrics could not be read; the message says why, in one line."""


def read_answers(session: requests.Session, base_url: str) -> Answers:
    """The extender's cumulative /filter and /prioritize answers and failures, from its /metrics."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = session.get(url, timeout=TIMEOUT_SECONDS)
    except requests.RequestException as exc:
        raise Unreadable(f"GET {url}: {type(exc).__name__}") from None
    if resp.status_code != 200:
        raise Unreadable(f"GET {url}: HTTP {resp.status_code}")
    if len(resp.content) > MAX_BYTES:
        raise Unreadable(f"GET {url}: more than {MAX_BYTES} bytes")
    total = errors = 0.0
    try:
        for family in text_string_to_metric_families(resp.text):
            if family.name != DECISIONS:
                continue
            for sample in family.samples:
                if sample.name == f"{DECISIONS}_total" and sample.labels.get("verb") in VERBS:
                    total += sample.value
                    errors += sample.value if sample.labels.get("outcome") == "error" else 0.0
    except ValueError as exc:
        raise Unreadable(f"GET {url}: not Prometheus text ({str(exc)[:100]})") from None
    return Answers(total, errors)


class ExtenderHealth:
    """Reconciler: read the extender's counters, judge them, publish the verdict into `ctx.failing`."""

    name = "extender-health"

    def __init__(self, period_seconds: float = 30.0) -> None:
        self.period_seconds = period_seconds
        self.health: Health = HEALTHY
        self._session = requests.Session()

    def reconcile(self, ctx: ControllerContext) -> None:
        if not ctx.extender_url or Component.EXTENDER not in ctx.components:
            ctx.failing.pop(Component.EXTENDER, None)
            return
        try:
            answers: Answers | None = read_answers(self._session, ctx.extender_url)
            problem = ""
        except Unreadable as exc:
            answers, problem = None, str(exc)
        health = judge(self.health, answers, problem, ctx.extender_error_ratio)
        if health.degraded and not self.health.degraded:
            log.warning("extender degraded: %s", health.message)
        elif self.health.degraded and not health.degraded:
            log.info("extender recovered: its answers are below the error threshold again")
        self.health = health
        if health.degraded:
            ctx.failing[Component.EXTENDER] = health.message
        else:
            ctx.failing.pop(Component.EXTENDER, None)
