"""Cluster summary reports in the hub: stored once each, bounded per cluster, read back for pages and the API.

The controller sends one `ClusterSummary` per poll (gpupolicy/hubsummary.py
makes it). A report id already stored is not stored again, so a batch retried
after a lost answer is stored once. Each cluster keeps its newest
`Hub.summary_retention` reports; older ones are deleted in the transaction
that stores a new one. `savings_rate` (what every action reported so far
saves per hour) is carried from report to report, so pruning loses no saving.
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
        rate = last.savings_rate if last is not None else 0.0
        stored = 0
        for report in sorted(reports, key=lambda r: float(r["time"])):
            if report["id"] in known:
                continue
            known.add(report["id"])
            saving = float(report["savings"]["perHour"])
            rate += saving
            session.add(Summary(
                cluster_id=cluster.id, report_id=report["id"], time=float(report["time"]), received_at=hub.clock(),
                gpus=report["gpus"], allocated=report["allocatedGpus"], idle=report["idleGpus"],
                pending=report["pendingGpuPods"], actions_applied=report["savings"]["actionsApplied"],
                cost_per_hour=float(report["costPerHour"]),
                savings_per_hour=saving, savings_rate=rate, body=json.dumps(report, sort_keys=True)))
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


def history(hub: Hub, name: str, limit: int | None = None) -> list[Point]:
    """The cluster's stored reports, oldest first (the newest `limit` of them when given)."""
    with hub._tx() as session:
        cluster = hub._cluster(session, name)
        query = select(Summary).where(Summary.cluster_id == cluster.id).order_by(Summary.id.desc())
        if limit is not None:
            query = query.limit(limit)
        rows = list(session.scalars(query))
    return [Point(r.time, r.gpus, r.allocated, r.idle, r.pending, r.actions_applied, r.cost_per_hour,
                  r.savings_per_hour, r.savings_rate) for r in reversed(rows)]


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


def saved_since(points: Sequence[Point], start: float, now: float) -> float:
    """Estimated money saved in [start, now]: each report's running savings rate held until the next report.
    Pure. Before the first point in the window, the rate just before it (its rate less its own saving)."""
    inside = [p for p in points if p.time >= start and p.time <= now]
    if not inside:
        before = [p for p in points if p.time < start]
        rate = before[-1].savings_rate if before else 0.0
        return rate * (now - start) / 3600.0
    total = (inside[0].savings_rate - inside[0].savings_per_hour) * (inside[0].time - start) / 3600.0
    for here, after in zip(inside, [*inside[1:], None], strict=True):
        until = after.time if after is not None else now
        total += here.savings_rate * max(until - here.time, 0.0) / 3600.0
    return total


def saved_this_month(hub: Hub, name: str) -> float:
    """`saved_since` the 1st of this month, reading only the rows it needs (three columns, this month's rows
    and the newest before it): the overview asks it for every cluster on every page."""
    now = hub.clock()
    start = month_start(now)
    columns = (Summary.time, Summary.savings_per_hour, Summary.savings_rate)
    with hub._tx() as session:
        cluster = hub._cluster(session, name)
        mine = Summary.cluster_id == cluster.id
        before = session.execute(select(*columns).where(mine, Summary.time < start)
                                 .order_by(Summary.id.desc()).limit(1)).all()
        inside = session.execute(select(*columns).where(mine, Summary.time >= start).order_by(Summary.id)).all()
    points = [Point(t, 0, 0, None, 0, 0, 0.0, saving, rate) for t, saving, rate in [*before, *inside]]
    return saved_since(points, start, now)
