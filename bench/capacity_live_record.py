"""What bench/capacity_live.py reads back from the API server: NodeClaims, Nodes and Pods, once a second.

A NodeClaim is counted from its creationTimestamp to the moment it is gone from the API (Karpenter's
finalizer has terminated the instance), at its instance type's catalog price. A pod is pending from its
creationTimestamp to its PodScheduled time; a pod of a live workload that disappears after it was bound
was evicted (by Karpenter's disruption or by our controller: both go through the eviction API); one that
disappears after the bench ended its workload finished. Polling a list each second, not a watch: an
object that lives less than a second can be missed, which no NodeClaim or bound pod here does (the
registration delay alone is longer), and a poll costs the 2-core machine less than three watches.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from tests.cluster.loops import read_items

KARPENTER = ("karpenter.sh", "v1")
HOSTNAME = "kubernetes.io/hostname"
TYPE_LABEL = "node.kubernetes.io/instance-type"
DISRUPTED_TAINT = "karpenter.sh/disrupted"  # Karpenter taints a node it disrupts (consolidation, drift)
FIGHT_SECONDS = 60.0  # "in the same minute": a pod Karpenter evicts this soon after it was placed


def stamp(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def condition_time(obj: dict[str, Any], kind: str) -> float | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return stamp(c.get("lastTransitionTime"))
    return None


@dataclass
class Claim:
    name: str
    instance_type: str
    created: float
    ready: float | None = None
    deleted: float | None = None
    cordoned: bool = False
    disrupted_since: float | None = None  # the poll that first saw Karpenter's disruption taint on its Node


@dataclass
class PodSeen:
    key: str  # <workload>/<pod name>
    workload: str
    created: float
    gpus: int
    scheduled: float | None = None  # PodScheduled's stamp (whole seconds): pending time
    bound_seen: float | None = None  # the poll that first saw it bound: the events' place (ordered with gone)
    claim: str = ""
    gpu_indexes: str = ""
    gone: float | None = None
    evicted: bool = False
    on_draining: bool = False  # first seen bound to a node that was cordoned (a drain under way) at that poll


@dataclass
class Recorder:
    """Everything seen, keyed by name; `poll` adds one look at the cluster."""

    custom: Any
    core: Any
    namespace: str
    prices: dict[str, tuple[int, float]]  # instance type -> (GPUs, $/h)
    t0: float = field(default_factory=time.time)
    claims: dict[str, Claim] = field(default_factory=dict)
    pods: dict[str, PodSeen] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)  # workload -> its replicas
    ended: dict[str, float] = field(default_factory=dict)  # workload -> when the bench deleted it
    peak_nodes: int = 0

    def poll(self) -> None:
        now = time.time()
        items = read_items(self.custom.list_cluster_custom_object(*KARPENTER, "nodeclaims", _preload_content=False))
        live = set()
        for c in items:
            name = c["metadata"]["name"]
            live.add(name)
            seen = self.claims.setdefault(name, Claim(
                name, (c["metadata"].get("labels") or {}).get(TYPE_LABEL, ""),
                stamp(c["metadata"]["creationTimestamp"]) or now))
            seen.instance_type = seen.instance_type or (c["metadata"].get("labels") or {}).get(TYPE_LABEL, "")
        for name, seen in self.claims.items():
            if name not in live and seen.deleted is None:
                seen.deleted = now
        self.peak_nodes = max(self.peak_nodes, len(live))
        hosts = {}
        for n in read_items(self.core.list_node(_preload_content=False)):
            claim = (n["metadata"].get("labels") or {}).get(HOSTNAME, "")
            hosts[n["metadata"]["name"]] = claim
            if claim in self.claims:
                # ready when its Node is (what the scheduler waits for), not when Karpenter says Initialized
                self.claims[claim].ready = self.claims[claim].ready or condition_time(n, "Ready")
                seen = self.claims[claim]
                seen.cordoned = bool(n["spec"].get("unschedulable"))
                if seen.disrupted_since is None and any(t.get("key") == DISRUPTED_TAINT
                                                        for t in n["spec"].get("taints") or []):
                    seen.disrupted_since = now
        self._pods(now, hosts)

    def _pods(self, now: float, hosts: dict[str, str]) -> None:
        live = set()
        for p in read_items(self.core.list_namespaced_pod(self.namespace, _preload_content=False)):
            workload = (p["metadata"].get("labels") or {}).get("app", "")
            key = f"{workload}/{p['metadata']['name']}"
            live.add(key)
            gpus = sum(int((c.get("resources") or {}).get("requests", {}).get("nvidia.com/gpu", 0))
                       for c in p["spec"]["containers"])
            seen = self.pods.setdefault(key, PodSeen(key, workload, stamp(p["metadata"]["creationTimestamp"]) or now,
                                                     gpus))
            if seen.scheduled is None and p["spec"].get("nodeName"):
                seen.scheduled = condition_time(p, "PodScheduled") or now
                seen.bound_seen = now
                seen.claim = hosts.get(p["spec"]["nodeName"], p["spec"]["nodeName"])
                seen.on_draining = seen.claim in self.claims and self.claims[seen.claim].cordoned
            seen.gpu_indexes = (p["metadata"].get("annotations") or {}).get("gpu.kubeon.io/gpu-index", "")
        for key, seen in self.pods.items():
            if key not in live and seen.gone is None:
                seen.gone = now
                seen.evicted = seen.scheduled is not None and seen.workload not in self.ended

    # -- figures, as simulate --capacity names them
    def figures(self) -> dict[str, Any]:
        end = time.time()
        gpu_h = node_h = cost = 0.0
        for c in self.claims.values():
            gpus, price = self.prices.get(c.instance_type, (0, 0.0))
            hours = ((c.deleted or end) - c.created) / 3600
            node_h += hours
            gpu_h += gpus * hours
            cost += price * hours
        pending = [p.scheduled - p.created for p in self.pods.values() if p.scheduled is not None]
        evictions: dict[str, int] = {}
        for p in self.pods.values():
            if p.evicted:
                evictions[p.workload] = evictions.get(p.workload, 0) + 1
        finished: dict[str, int] = {}
        for p in self.pods.values():
            if p.scheduled is not None and not p.evicted and p.gone is not None:
                finished[p.workload] = finished.get(p.workload, 0) + 1
        return {"gpu_node_hours": round(gpu_h, 3), "node_hours": round(node_h, 3), "cost": round(cost, 3),
                "pending_seconds_p50": _pct(pending, 50), "pending_seconds_p95": _pct(pending, 95),
                "evictions": sum(evictions.values()), "max_evictions_per_pod": max(evictions.values(), default=0),
                "pods_never_placed": sum(max(0, n - finished.get(w, 0)) for w, n in self.replicas.items()),
                "peak_nodes": self.peak_nodes,
                "nodeclaims_left": sum(1 for c in self.claims.values() if c.deleted is None),
                "nodes_cordoned_left": sum(1 for c in self.claims.values() if c.deleted is None and c.cordoned),
                **self.fights()}

    def fights(self) -> dict[str, int]:
        """Our controller against Karpenter: pods bound to a node after it was cordoned for a drain (re-used
        while it goes), and pods Karpenter's disruption evicted within FIGHT_SECONDS of their placement."""
        reused = sum(1 for p in self.pods.values() if p.on_draining)
        karpenter_fresh = 0
        for p in self.pods.values():
            claim = self.claims.get(p.claim)
            if claim is None or p.bound_seen is None:
                continue
            if (p.evicted and claim.disrupted_since is not None and p.gone is not None
                    and p.gone - p.bound_seen < FIGHT_SECONDS):
                karpenter_fresh += 1
        return {"pods_placed_on_draining_nodes": reused, "karpenter_evictions_within_a_minute": karpenter_fresh}

    def events(self) -> list[tuple[str, ...]]:
        """`simulate --capacity --events` rows (time from the start of the run): launch, ready, delete of each
        NodeClaim; place, finish or evict of each pod. A pod's gpus are `index:1000` per GPU where the extender
        annotated indexes, else `*:1000` (the default scheduler picks no GPU)."""
        rows: list[tuple[float, str, str, str, str, str]] = []
        for c in self.claims.values():
            rows.append((c.created, "launch", c.name, c.instance_type, "", ""))
            if c.ready is not None:
                rows.append((c.ready, "ready", c.name, c.instance_type, "", ""))
            if c.deleted is not None:
                rows.append((c.deleted, "delete", c.name, c.instance_type, "", ""))
        for p in self.pods.values():
            if p.scheduled is None:
                continue
            kind = self.claims[p.claim].instance_type if p.claim in self.claims else ""
            indexes = p.gpu_indexes.split(",") if p.gpu_indexes else ["*"] * p.gpus
            # both times as polls saw them: stamps have whole seconds, and a pod bound in the second its GPU was
            # freed would read as placed before the pod it replaced was gone
            rows.append((p.bound_seen or p.scheduled, "place", p.claim, kind, p.key,
                         "|".join(f"{i}:1000" for i in indexes)))
            if p.gone is not None:
                rows.append((p.gone, "evict" if p.evicted else "finish", p.claim, kind, p.key, ""))
        order = {"launch": 0, "ready": 1, "finish": 2, "evict": 3, "delete": 4, "place": 5}
        rows.sort(key=lambda r: (r[0], order[r[1]]))
        return [(f"{r[0] - self.t0:.3f}", *r[1:]) for r in rows]


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if values else math.nan
