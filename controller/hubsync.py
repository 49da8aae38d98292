"""Hub sync: pull policies and approvals with the cluster token, write them as GpuPolicy objects, report actions.

The hub never connects to the cluster (docs/hub-api.md). Every `pollInterval`
(jittered ±10 %) `HubSync` GETs the cluster's policy set with its ETag:
- 200: the set is kept in memory and `policies synced count= revision= time=`
  is logged; 304: nothing was pulled (counted, never logged as a sync).
  Either way the cluster is converged to the last pulled set: hub policies
  become GpuPolicy objects labelled managed-by=hub with the revision, objects
  the hub no longer lists are deleted, direct edits are overwritten, and live
  approvals (expiry checked against the clock on every pass) are written into
  `spec.approvals`, which is what Approve mode applies.
- 401/403: the token is revoked. `HubState.connected` goes false at once, so
  `ctx.is_leader()` (checked by every writer before each write) is false and
  every writer stops; the policies are labelled hub=Disconnected (the webhook
  and the extender leave such policies out of their view) and their approvals
  are voided. Only a poll that succeeds, with a token re-read from the mounted
  file, resumes.
- other errors: exponential back-off (doubling, at most 10 minutes); the
  policies in the cluster stay in force.

Actions (applied by reconcilers, and proposals the optimizer shows) wait in a
bounded `Outbox` and are POSTed in batches with an idempotency key that stays
the same across retries of one batch, so the hub stores each exactly once.

After every successful poll a cluster summary (controller/hubreport.py: GPUs,
allocated, idle by DCGM, pending GPU pods, cost per hour, what the actions
applied since the last summary save) is queued and POSTed the same way; each
carries its own id, so a retried batch is stored once.
"""

from __future__ import annotations

import calendar
import dataclasses
import logging
import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import requests
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpupolicy.model import (
    API_VERSION,
    HUB_CONNECTED,
    HUB_DISCONNECTED,
    HUB_REVISION_ANNOTATION,
    HUB_STATE_LABEL,
    KIND,
    MANAGED_BY_HUB,
    MANAGED_BY_LABEL,
    Condition,
    GpuPolicy,
    Mode,
)
from gpupolicy.modes import effective_mode
from kube.policies import create_policy, delete_policy, list_policies, replace_policy

if TYPE_CHECKING:
    from controller.context import ControllerContext

# What makes this poll's cluster summary (controller/hubreport.py, passed in by controller/command.py):
# (context, now, [(policy, target) applied since the last one]) -> the ClusterSummary body.
SummaryMaker = Callable[["ControllerContext", float, list[tuple[str, str]]], dict[str, Any]]

log = logging.getLogger(__name__)

MAX_BACKOFF = 600.0
# hub.pollInterval's range (the chart's kgo.validateValues refuses the same): revocation, mode changes and
# new policies reach the cluster at the next poll, so a poll at least once a day.
MIN_POLL_SECONDS, MAX_POLL_SECONDS = 1.0, 86400.0
BATCH = 100
QUEUE_LIMIT = 10_000
SUMMARY_QUEUE_LIMIT = 1_000  # summaries waiting while the hub is away: the newest ~16 h at one a minute


@dataclass
class HubSettings:
    url: str
    cluster: str
    token_file: str
    poll_interval: float = 60.0
    ca_file: str | None = None
    timeout: float = 10.0


@dataclass
class HubState:
    """Whether the hub accepts this cluster's token; read by `ctx.is_leader()` on every write."""

    connected: bool = True
    reason: str = ""


class HubMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.polls = Counter("kubeon_gpu_hub_polls", "Hub polls by result (synced, not_modified, "
                             "unauthorized, error)", ["result"], registry=registry)
        self.connected = Gauge("kubeon_gpu_hub_connected", "1 while the hub accepts the cluster token",
                               registry=registry)
        self.synced_policies = Gauge("kubeon_gpu_hub_policies_synced", "Policies in the last pulled set",
                                     registry=registry)
        self.revision = Gauge("kubeon_gpu_hub_revision", "Hub revision of the last pulled set", registry=registry)
        self.last_sync = Gauge("kubeon_gpu_hub_last_sync_timestamp_seconds", "When a policy set was last pulled",
                               registry=registry)
        self.queued = Gauge("kubeon_gpu_hub_actions_queued", "Actions waiting to reach the hub", registry=registry)
        self.dropped = Counter("kubeon_gpu_hub_actions_dropped", "Actions dropped, oldest first, from a full queue",
                               registry=registry)
        self.reported = Counter("kubeon_gpu_hub_actions_reported", "Actions the hub acknowledged",
                                registry=registry)
        self.summaries = Counter("kubeon_gpu_hub_summaries_reported", "Cluster summaries the hub acknowledged",
                                 registry=registry)


class TokenFile:
    """The mounted Secret's token, re-read when the file changes (the kubelet swaps `..data` links)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._signature: tuple[int, int, int] | None = None
        self.token: str | None = None

    def read(self) -> str | None:
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            log.warning("hub token file unreadable path=%s error=%s", self.path, exc.strerror)
            return self.token
        signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if signature != self._signature:
            try:
                with open(self.path, encoding="utf-8") as handle:
                    value = handle.read().strip() or None
            except OSError as exc:
                log.warning("hub token file unreadable path=%s error=%s", self.path, exc.strerror)
                return self.token
            if self._signature is not None and value != self.token:
                log.info("hub token file changed: using the new token path=%s", self.path)
            self._signature, self.token = signature, value
        return self.token


@dataclass
class Outbox:
    """Actions for the hub: bounded (oldest dropped and counted), one in-flight batch with a stable key."""

    limit: int = QUEUE_LIMIT
    dropped: int = 0
    _queue: deque[dict[str, Any]] = field(default_factory=deque)
    _batch: tuple[str, list[dict[str, Any]]] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, action: dict[str, Any]) -> None:
        with self._lock:
            self._queue.append(action)
            while len(self._queue) + len(self._batch[1] if self._batch else []) > self.limit:
                self._queue.popleft()
                self.dropped += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue) + (len(self._batch[1]) if self._batch else 0)

    def next_batch(self) -> tuple[str, list[dict[str, Any]]] | None:
        """The batch to send: the one that failed last time (same key), else a new one."""
        with self._lock:
            if self._batch is None and self._queue:
                items = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                self._batch = (uuid.uuid4().hex, items)
            return self._batch

    def sent(self) -> None:
        with self._lock:
            self._batch = None


@dataclass
class PollAnswer:
    status: int  # HTTP status; 0 when the hub could not be reached
    body: dict[str, Any] | None = None
    etag: str | None = None
    error: str = ""


class HubClient:
    """The two calls of the contract, over one keep-alive session."""

    def __init__(self, settings: HubSettings) -> None:
        self.settings = settings
        self.base = settings.url.rstrip("/") + "/api/v1/clusters/" + quote(settings.cluster, safe="")
        self.session = requests.Session()
        # Per request, not on the session: requests lets $REQUESTS_CA_BUNDLE override session.verify.
        self.verify: str | bool = settings.ca_file or True

    def poll(self, token: str | None, etag: str | None) -> PollAnswer:
        headers = {"Authorization": f"Bearer {token or ''}"}
        if etag:
            headers["If-None-Match"] = etag
        try:
            response = self.session.get(self.base + "/policies", headers=headers, timeout=self.settings.timeout,
                                        verify=self.verify)
        except requests.RequestException as exc:
            return PollAnswer(0, error=str(exc))
        if response.status_code == 200:
            try:
                return PollAnswer(200, response.json(), response.headers.get("ETag"))
            except ValueError:
                return PollAnswer(502, error="the hub answered 200 with a body that is not JSON")
        return PollAnswer(response.status_code, error=response.text[:200])

    def post_actions(self, token: str | None, key: str, actions: list[dict[str, Any]]) -> int:
        return self._post("/actions", token, key, {"actions": actions})

    def post_summaries(self, token: str | None, key: str, summaries: list[dict[str, Any]]) -> int:
        return self._post("/summaries", token, key, {"summaries": summaries})

    def _post(self, path: str, token: str | None, key: str, body: dict[str, Any]) -> int:
        try:
            headers = {"Authorization": f"Bearer {token or ''}", "Idempotency-Key": key}
            response = self.session.post(self.base + path, json=body, headers=headers,
                                         timeout=self.settings.timeout, verify=self.verify)
        except requests.RequestException:
            return 0
        return response.status_code


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def desired_objects(body: dict[str, Any], now: float) -> dict[str, dict[str, Any]]:
    """GpuPolicy objects (metadata and spec) for a pulled set; live approvals merged into spec.approvals."""
    approved: dict[str, set[str]] = {}
    for approval in body.get("approvals") or []:
        expires = _parse_time(approval.get("expires"))
        if expires is None or expires > now:
            approved.setdefault(str(approval["policy"]), set()).add(str(approval["target"]))
    revision = str(body.get("revision", 0))
    found = {}
    for item in body.get("policies") or []:
        name = str(item["name"])
        spec = dict(item.get("spec") or {})
        targets = set(spec.get("approvals") or []) | approved.get(name, set())
        if targets:
            spec["approvals"] = sorted(targets)
        else:
            spec.pop("approvals", None)
        found[name] = {
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY_HUB, HUB_STATE_LABEL: HUB_CONNECTED},
                         "annotations": {HUB_REVISION_ANNOTATION: revision}},
            "spec": spec,
        }
    return found


def _is_hub_managed(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY_HUB


def _differs(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    meta, want = current.get("metadata") or {}, desired["metadata"]
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return (current.get("spec") != desired["spec"]
            or any(labels.get(k) != v for k, v in want["labels"].items())
            or any(annotations.get(k) != v for k, v in want["annotations"].items()))


def _merged(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """`desired` over `current`: other labels/annotations (the webhook's kind label) kept, resourceVersion too."""
    meta = current.get("metadata") or {}
    return {**desired, "metadata": {
        "name": desired["metadata"]["name"], "resourceVersion": meta.get("resourceVersion"),
        "labels": {**(meta.get("labels") or {}), **desired["metadata"]["labels"]},
        "annotations": {**(meta.get("annotations") or {}), **desired["metadata"]["annotations"]},
    }}


class HubSync:
    """Reconciler `hub`: runs first, and on while writers are paused (it is the one that can resume them)."""

    name = "hub"
    runs_while_paused = True
    wakes_on_policy_change = False  # ReconcileRunner.policies_changed: polled at its interval only

    def __init__(self, settings: HubSettings, state: HubState, registry: CollectorRegistry,
                 default_mode: Mode = Mode.RECOMMEND, rng: random.Random | None = None,
                 summary: SummaryMaker | None = None) -> None:
        self.settings = settings
        self.state = state
        self.metrics = HubMetrics(registry)
        self.metrics.connected.set(1 if state.connected else 0)
        self.default_mode = default_mode
        self.client = HubClient(settings)
        self.token = TokenFile(settings.token_file)
        self.outbox = Outbox()
        self.summaries = Outbox(limit=SUMMARY_QUEUE_LIMIT)
        self.summary = summary  # None: no summary reports (tests of the sync alone)
        self._applied: list[tuple[str, str]] = []  # (policy, target) applied since the last summary
        self.rng = rng or random.Random()
        self.period_seconds = settings.poll_interval
        self.failures = 0
        self.etag: str | None = None
        self.body: dict[str, Any] | None = None
        self._reported: set[str] = set()
        self._restored = False

    # -- what reconcilers report ------------------------------------------------
    def applied(self, policy: GpuPolicy, target: str, action: str, result: str = "applied",
                now: float | None = None) -> None:
        """Queue one action for the hub (the Recorder calls this for every applied action)."""
        if result == "applied":
            self._applied.append((policy.name, target))
        self._queue({"id": uuid.uuid4().hex, "policy": policy.name, "target": target, "action": action[:4000],
                     "mode": policy.effective_mode(self.default_mode).value, "result": result,
                     "time": now if now is not None else time.time()})

    def _queue(self, action: dict[str, Any]) -> None:
        before = self.outbox.dropped
        self.outbox.add(action)
        if self.outbox.dropped > before:
            self.metrics.dropped.inc(self.outbox.dropped - before)
        self.metrics.queued.set(len(self.outbox))

    # -- one pass -----------------------------------------------------------------
    def reconcile(self, ctx: ControllerContext) -> None:
        if not self._restored:
            self._restore(ctx)
        token = self.token.read()
        answer = self.client.poll(token, self.etag)
        now = ctx.clock.now()
        if answer.status in (401, 403):
            self.metrics.polls.labels(result="unauthorized").inc()
            self.failures = 0
            self.period_seconds = self._jittered(self.settings.poll_interval)
            self.disconnect(ctx, f"the hub answered {answer.status} to this cluster's token")
            return
        if answer.status not in (200, 304):
            self.metrics.polls.labels(result="error").inc()
            self.failures += 1
            # backing off never polls more often than the interval itself (an interval over MAX_BACKOFF)
            backoff = min(MAX_BACKOFF, self.settings.poll_interval * 2 ** self.failures)
            self.period_seconds = self._jittered(max(self.settings.poll_interval, backoff))
            log.warning("hub poll failed status=%d error=%s: policies in the cluster stay in force; "
                        "next poll in %.0fs", answer.status, answer.error[:200], self.period_seconds)
            return
        self.failures = 0
        self.period_seconds = self._jittered(self.settings.poll_interval)
        if answer.status == 200 and answer.body is not None:
            self.body, self.etag = answer.body, answer.etag
        if self.body is None:  # 304 before any 200 in this process: nothing known to converge to
            self.metrics.polls.labels(result="not_modified").inc()
            return
        was_connected = self.state.connected
        self.state.connected, self.state.reason = True, ""
        self.metrics.connected.set(1)
        self.converge(ctx, now)
        self.publish_condition(ctx)
        if not was_connected:
            log.info("hub accepts the token again: writers resumed")
        if answer.status == 200:
            count, revision = len(self.body.get("policies") or []), int(self.body.get("revision") or 0)
            self.metrics.polls.labels(result="synced").inc()
            self.metrics.synced_policies.set(count)
            self.metrics.revision.set(revision)
            self.metrics.last_sync.set(now)
            log.info("policies synced count=%d revision=%d time=%s", count, revision,
                     time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
        else:
            self.metrics.polls.labels(result="not_modified").inc()
        self.report_proposals(ctx, now)
        self.flush(token)
        self.report_summary(ctx, now, token)

    def _jittered(self, seconds: float) -> float:
        return seconds * self.rng.uniform(0.9, 1.1)

    def _restore(self, ctx: ControllerContext) -> None:
        """After a restart: a cluster whose policies say Disconnected stays so until a poll succeeds."""
        items, _ = list_policies(ctx.api)
        if any(_is_hub_managed(o) and ((o.get("metadata") or {}).get("labels") or {}).get(HUB_STATE_LABEL)
               == HUB_DISCONNECTED for o in items):
            self.state.connected, self.state.reason = False, "disconnected before this restart"
            self.metrics.connected.set(0)
        self._restored = True

    def converge(self, ctx: ControllerContext, now: float) -> int:
        """Make the hub-managed GpuPolicies exactly the pulled set. Returns writes made."""
        assert self.body is not None
        desired = desired_objects(self.body, now)
        items, _ = list_policies(ctx.api)
        current = {str(o["metadata"]["name"]): o for o in items}
        writes = 0
        for name, obj in desired.items():
            if not ctx.lease_held():
                return writes
            existing = current.get(name)
            if existing is None:
                create_policy(ctx.api, obj)
                writes += 1
            elif _differs(existing, obj):
                if not _is_hub_managed(existing):
                    log.warning("policy %s existed in the cluster and is now managed by the hub", name)
                replace_policy(ctx.api, _merged(existing, obj))
                writes += 1
        for name, obj in current.items():
            if name not in desired and _is_hub_managed(obj) and ctx.lease_held():
                delete_policy(ctx.api, name)
                writes += 1
        if writes:
            log.info("hub policies written to the cluster writes=%d", writes)
        return writes

    def disconnect(self, ctx: ControllerContext, reason: str) -> None:
        """Stop every writer now; label the policies Disconnected and void their approvals."""
        first = self.state.connected
        self.state.connected, self.state.reason = False, reason
        self.metrics.connected.set(0)
        if first:
            log.error("hub disconnected: %s; every writer is paused, the webhook admits pods unchanged and the "
                      "extender stays neutral until a working token is read", reason)
        items, _ = list_policies(ctx.api)
        for obj in items:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if not _is_hub_managed(obj) or not ctx.lease_held():
                continue
            if labels.get(HUB_STATE_LABEL) == HUB_DISCONNECTED and not (obj.get("spec") or {}).get("approvals"):
                continue
            spec = {k: v for k, v in (obj.get("spec") or {}).items() if k != "approvals"}
            meta = obj["metadata"]
            body = {"apiVersion": API_VERSION, "kind": KIND, "spec": spec, "metadata": {
                "name": meta["name"], "resourceVersion": meta.get("resourceVersion"),
                "labels": {**labels, HUB_STATE_LABEL: HUB_DISCONNECTED},
                "annotations": dict(meta.get("annotations") or {})}}
            ctx.policies.observe(meta["name"], replace_policy(ctx.api, body))  # the status below reads the label
        # Status says it too; written here because the status writer is paused with the other writers.
        self.publish_condition(ctx)
        dataclasses.replace(ctx, is_leader=ctx.lease_held).write_status()

    def publish_condition(self, ctx: ControllerContext) -> None:
        """`HubConnected` in every hub-managed policy's status (written with the other conditions)."""
        if self.state.connected:
            condition = Condition(type="HubConnected", status="True", reason="Synced",
                                  message=f"pulled from {self.settings.url}")
        else:
            condition = Condition(type="HubConnected", status="False", reason="Disconnected",
                                  message=f"{self.state.reason}: nothing acts until a working token is read")
        for entry in ctx.policies.entries():
            if _is_hub_managed(entry.raw):
                ctx.policies.publish(entry.name, self.name, [], [condition])

    def report_proposals(self, ctx: ControllerContext, now: float) -> None:
        """Proposals shown in hub-managed policies' status reach the hub once each (result `proposed`)."""
        for entry in ctx.policies.entries():
            if entry.policy is None or not _is_hub_managed(entry.raw):
                continue
            mode = effective_mode(entry.policy, ctx.default_mode, ctx.prometheus_configured).mode
            for proposal in (entry.raw_status.get("proposals") or []):
                if proposal.get("state") != "Proposed" or not proposal.get("id"):
                    continue
                key = f"{entry.name}/{proposal['id']}/proposed"
                if key in self._reported:
                    continue
                self._reported.add(key)
                item = {"id": key[:128], "policy": entry.name, "target": str(proposal.get("target")),
                        "action": str(proposal.get("action") or "")[:4000] or "propose", "mode": mode.value,
                        "result": "proposed", "time": now}
                estimate = proposal.get("estimatedGpuHoursPerMonth")
                if isinstance(estimate, int | float) and 0 < estimate <= 1e9:
                    item["estimatedGpuHoursPerMonth"] = float(estimate)
                self._queue(item)

    def flush(self, token: str | None) -> int:
        """Send queued batches until the queue is empty or the hub fails; returns actions acknowledged."""
        sent = 0
        while (batch := self.outbox.next_batch()) is not None:
            key, actions = batch
            status = self.client.post_actions(token, key, actions)
            if status != 200:
                log.warning("hub did not take %d action(s) status=%d: kept for the next poll", len(actions), status)
                break
            self.outbox.sent()
            sent += len(actions)
            self.metrics.reported.inc(len(actions))
        self.metrics.queued.set(len(self.outbox))
        return sent

    def report_summary(self, ctx: ControllerContext, now: float, token: str | None) -> None:
        """Queue this poll's cluster summary and send what is queued (the oldest dropped from a full queue)."""
        if self.summary is None:
            return
        applied, self._applied = self._applied, []
        try:
            self.summaries.add(self.summary(ctx, now, applied))
        except Exception as exc:  # an API error must not stop the poll: the next one reports again
            self._applied = applied + self._applied
            log.warning("hub summary not made: %s", exc)
            return
        while (batch := self.summaries.next_batch()) is not None:
            key, items = batch
            status = self.client.post_summaries(token, key, items)
            if status != 200:
                log.warning("hub did not take %d summary report(s) status=%d: kept for the next poll",
                            len(items), status)
                return
            self.summaries.sent()
            self.metrics.summaries.inc(len(items))
