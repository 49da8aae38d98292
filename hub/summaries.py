"""Cluster summary reports in the hub: stored once each, bounded per cluster, read back for pages and the API.

The controller sends one `ClusterSummary` per poll (gpupolicy/capacity/summary.py
makes it). A report id already stored is not stored again, so a batch retried
after a lost answer is stored once. Each cluster keeps its newest
`Hub.summary_retention` reports; older ones are deleted in the transaction
that stores a new one. Two running totals are carried from report to report,
so pruning loses no saving and no page reads more than a few rows for them:
`savings_rate`, what every action reported so far saves per hour, and
`saved_total`, the money saved up to the report (each rate held until the
next report).
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from hub.db import Summary
from hub.store import Hub

DEFAULT_RETENTION = 10_080  # a week of reports at the default 60 s poll
# What a Point is read from (its fields, by name): columns, not rows as objects: a week of reports is 10,080.
POINT_COLUMNS = (Summary.time, Summary.gpus, Summary.allocated, Summary.idle, Summary.pending, Summary.actions_applied,
                 Summary.cost_per_hour, Summary.savings_per_hour, Summary.savings_rate, Summary.saved_total)


@dataclass(frozen=True)
class Point:
    """One stored report as the charts read it."""

    time: float
    gpus: int
    allocated: int
    idle: int | None
    pending: int
    actions_applied: int
    cost_per_hour: float
    savings_per_hour: float
    savings_rate: float
    saved_total: float = 0.0


def accrued(p: Point, at: float) -> float:
    """Money saved up to `at`, reckoned from the report `p`: its running total, plus its rate held since it
    (at or after it), or less the rate before it (the rate without its own saving) back to `at`. Pure."""
    if at >= p.time:
        return p.saved_total + p.savings_rate * (at - p.time) / 3600.0
    return p.saved_total - (p.savings_rate - p.savings_per_hour) * (p.time - at) / 3600.0


def carry(rate: float, total: float, since: float, at: float, saving: float) -> tuple[float, float]:
    """The running (savings rate, saved total) of a report made at `at` saving `saving` per hour, after one
    with (`rate`, `total`) made at `since`: the rate before it held until it. Pure."""
    return rate + saving, total + rate * max(at - since, 0.0) / 3600.0


def record(hub: Hub, name: str, reports: Sequence[dict[str, Any]]) -> tuple[int, bool]:
    """Store each report not stored before: (newly stored, whether every one had been stored already)."""
    for attempt in range(3):
        try:
            return _record(hub, name, reports)
        except IntegrityError:  # the same batch twice at once: the loser reads again and answers as a repeat
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _record(hub: Hub, name: str, reports: Sequence[dict[str, Any]]) -> tuple[int, bool]:
    with hub._tx() as session:
        cluster = hub._cluster(session, name)
        ids = [r["id"] for r in reports]
        known = set(session.scalars(select(Summary.report_id).where(Summary.cluster_id == cluster.id,
                                                                    Summary.report_id.in_(ids))))
        last = session.scalar(select(Summary).where(Summary.cluster_id == cluster.id)
                              .order_by(Summary.id.desc()).limit(1))
        rate, total, since = (last.savings_rate, last.saved_total, last.time) if last is not None else (0.0, 0.0, 0.0)
        stored = 0
        for report in sorted(reports, key=lambda r: float(r["time"])):
            if report["id"] in known:
                continue
            known.add(report["id"])
            saving, at = float(report["savings"]["perHour"]), float(report["time"])
            rate, total = carry(rate, total, since, at, saving)
            since = max(at, since)
            session.add(Summary(
                cluster_id=cluster.id, report_id=report["id"], time=float(report["time"]), received_at=hub.clock(),
                gpus=report["gpus"], allocated=report["allocatedGpus"], idle=report["idleGpus"],
                pending=report["pendingGpuPods"], actions_applied=report["savings"]["actionsApplied"],
                cost_per_hour=float(report["costPerHour"]),
                savings_per_hour=saving, savings_rate=rate, saved_total=total,
                body=json.dumps(report, sort_keys=True)))
            stored += 1
        if stored:
            session.flush()
            _prune(session, cluster.id, hub.summary_retention)
        return stored, stored == 0 and bool(reports)


def _prune(session: Any, cluster_id: int, keep: int) -> None:
    count = session.scalar(select(func.count()).select_from(Summary).where(Summary.cluster_id == cluster_id)) or 0
    if count <= keep:
        return
    cutoff = session.scalar(select(Summary.id).where(Summary.cluster_id == cluster_id)
                            .order_by(Summary.id.desc()).offset(keep).limit(1))
    session.execute(delete(Summary).where(Summary.cluster_id == cluster_id, Summary.id <= cutoff))


def history(hub: Hub, name: str, limit: int | None = None, since: float | None = None) -> list[Point]:
    """The cluster's stored reports, oldest first (the newest `limit` of them, those made at `since` or later)."""
    with hub._tx() as session:
        cluster = hub._cluster(session, name)
        query = select(*POINT_COLUMNS).where(Summary.cluster_id == cluster.id).order_by(Summary.id.desc())
        if since is not None:
            query = query.where(Summary.time >= since)
        if limit is not None:
            query = query.limit(limit)
        rows = session.execute(query).all()
    return [Point(*tuple(row)) for row in reversed(rows)]


def latest(hub: Hub, name: str) -> dict[str, Any] | None:
    """The newest report as it was sent, or None before the first."""
    with hub._tx() as session:
        cluster = hub._cluster(session, name)
        row = session.scalar(select(Summary).where(Summary.cluster_id == cluster.id)
                             .order_by(Summary.id.desc()).limit(1))
        return json.loads(row.body) if row is not None else None


def month_start(now: float) -> float:
    """Midnight UTC on the first day of `now`'s month."""
    t = time.gmtime(now)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def saved_since(anchor: Point | None, last: Point | None, start: float, now: float) -> float:
    """Estimated money saved in [start, now]: from `anchor` (the newest report before `start`, else the oldest
    after it) to `last` (the newest report). Pure."""
    if anchor is None or last is None:
        return 0.0
    return max(accrued(last, now) - accrued(anchor, start), 0.0)


def saved_this_month(hub: Hub, name: str) -> float:
    """`saved_since` midnight UTC on the 1st: three rows read, however many reports are stored."""
    now = hub.clock()
    start = month_start(now)
    with hub._tx() as session:
        cluster = hub._cluster(session, name)
        mine = select(*POINT_COLUMNS).where(Summary.cluster_id == cluster.id)
        last = session.execute(mine.order_by(Summary.id.desc()).limit(1)).first()
        anchor = (session.execute(mine.where(Summary.time < start).order_by(Summary.id.desc()).limit(1)).first()
                  or session.execute(mine.where(Summary.time >= start).order_by(Summary.id).limit(1)).first())
    return saved_since(Point(*tuple(anchor)) if anchor else None, Point(*tuple(last)) if last else None, start, now)
