"""How often capacity drains evicted each workload's pods: the `evictions` input of plan_disruptions.

The core pins a node holding a pod evicted `max_evictions_per_pod` times
(no pod is moved without end, gpupolicy/capacity/disruption/planning.py). A pod
key does not survive an eviction here: a Deployment's pod comes back under a
new name. So the count is kept per workload (gpupolicy/k8s/owners.py's
`Kind/namespace/name`) in the policy's status, `status.evictions`, by merge
patches of one key (controller/policies.py `set_record`; the guide's RBAC
has no write on workloads). A pod's count is its workload's divided by the
workload's pods now (rounded up): a Deployment of four pods evicted four
times has moved each pod once, as far as anyone can tell.

Crash-safe, exactly once per pod uid (the functions below in this order, then their helpers):
1. before the Eviction API is asked, the pods' uids are added to `pending`;
2. after it answered, the accepted ones move to `evicted` and `count` grows;
3. every pass first settles what a crash left in `pending`: a uid whose pod
   is gone or terminating was evicted (counted); one whose pod lives on a
   node no longer draining was not (dropped); the rest wait.
Bare pods are not counted (an evicted bare pod does not come back). A
record whose workload has no pod is dropped an hour after its last eviction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller.capacity.state import Pass, annotations_of, meta, pod_key
from gpupolicy.capacity.drain import DRAINING_ANNOTATION
from gpupolicy.k8s.owners import pod_owner
from gpupolicy.model import EvictionRecord, GpuPolicy

FIELD = "evictions"
KEEP_UIDS = 32  # the last evicted uids kept per workload (a uid is never counted twice while listed)
FORGET_AFTER = 3600.0


def settle(p: Pass, policies: Iterable[GpuPolicy]) -> None:
    """Step 3, at the start of a pass: resolve what a crash left pending; forget workloads long gone."""
    if not p.ctx.is_leader():
        return
    now = p.ctx.clock.now()
    known = {policy.name: records(p, policy.name) for policy in policies}
    if not any(known.values()):
        return  # nothing recorded (most passes): no pod need be read
    pods = {str(meta(pod).get("uid") or ""): pod for pod in p.seen.pods}
    owners = {key for key in (owner_key(pod) for pod in p.seen.pods) if key is not None}
    draining = {str(n["metadata"]["name"]) for n in p.seen.nodes if DRAINING_ANNOTATION in annotations_of(n)}
    for name, recorded in known.items():
        for key, record in recorded.items():
            gone = [u for u in record.pending if u not in pods or meta(pods[u]).get("deletionTimestamp")]
            kept = [u for u in record.pending if u not in gone
                    and (pods[u].get("spec") or {}).get("nodeName") in draining]
            updated = _counted(record, gone).model_copy(update={"pending": kept}) if record.pending else record
            if key not in owners and not updated.pending and now - updated.at > FORGET_AFTER:
                _write(p, name, key, None)
            elif updated != record:
                _write(p, name, key, updated)


def before_evictions(p: Pass, policy: GpuPolicy | None, uids: Sequence[str]) -> None:
    """Step 1: note the pods about to be evicted (a repeated ask after a 429 writes nothing)."""
    if policy is None or not p.ctx.is_leader():
        return
    known = records(p, policy.name)
    for key, group in _by_owner(p, uids).items():
        record = known.get(key) or EvictionRecord()
        new = [u for u in group if u not in record.pending and u not in record.evicted]
        if new:
            _write(p, policy.name, key, record.model_copy(update={
                "pending": [*record.pending, *new], "at": p.ctx.clock.now()}))


def after_evictions(p: Pass, policy: GpuPolicy | None, accepted: Sequence[str]) -> None:
    """Step 2: count the evictions the API accepted."""
    if policy is None or not accepted or not p.ctx.is_leader():
        return
    known = records(p, policy.name)
    for key, group in _by_owner(p, accepted).items():
        _write(p, policy.name, key, _counted(known.get(key) or EvictionRecord(), group))


def per_pod(p: Pass, policies: Iterable[GpuPolicy]) -> dict[str, int]:
    """Pod key -> evictions (its workload's count over its pods now, rounded up; the highest of the
    policies' records)."""
    counts: dict[str, int] = {}
    for policy in policies:
        for key, record in records(p, policy.name).items():
            counts[key] = max(counts.get(key, 0), record.count)
    if not counts:
        return {}
    members: dict[str, list[str]] = {}
    for pod in p.seen.pods:
        owner = owner_key(pod)
        if owner is not None and owner in counts and not meta(pod).get("deletionTimestamp"):
            members.setdefault(owner, []).append(pod_key(pod))
    return {pod: math.ceil(counts[key] / len(keys)) for key, keys in members.items() for pod in keys}


def records(p: Pass, policy: str) -> dict[str, EvictionRecord]:
    """status.evictions of one policy (unreadable entries skipped)."""
    entry = p.ctx.policies.get(policy)
    raw = (entry.raw_status.get(FIELD) if entry is not None else None) or {}
    found: dict[str, EvictionRecord] = {}
    for key, value in raw.items():
        try:
            found[str(key)] = EvictionRecord.model_validate(value)
        except ValueError:
            continue
    return found


def _counted(record: EvictionRecord, uids: Sequence[str]) -> EvictionRecord:
    new = [u for u in dict.fromkeys(uids) if u not in record.evicted]
    return record.model_copy(update={
        "count": record.count + len(new), "evicted": [*record.evicted, *new][-KEEP_UIDS:],
        "pending": [u for u in record.pending if u not in uids]})


def _by_owner(p: Pass, uids: Iterable[str]) -> dict[str, list[str]]:
    wanted = set(uids)
    grouped: dict[str, list[str]] = {}
    for pod in p.seen.pods:
        uid = str(meta(pod).get("uid") or "")
        key = owner_key(pod) if uid in wanted else None
        if key is not None:
            grouped.setdefault(key, []).append(uid)
    return grouped


def owner_key(pod: Mapping[str, Any]) -> str | None:
    """The workload a pod comes back from after an eviction; None for a bare pod."""
    key = pod_owner(pod, str(meta(pod).get("namespace") or "default"))
    return None if key.startswith("Pod/") else key


def _write(p: Pass, policy: str, key: str, record: EvictionRecord | None) -> None:
    body = None if record is None else record.model_dump(by_alias=True, mode="json")
    p.ctx.policies.set_record(p.ctx.api, policy, FIELD, key, body)
