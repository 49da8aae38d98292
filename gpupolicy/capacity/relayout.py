"""MIG re-layout of one node, as the GPU Operator's MIG manager requires it: one step per pass. Pure.

cordon -> (no GPU pod arrived) set `nvidia.com/mig.config=<layout>` -> wait
for `nvidia.com/mig.config.state=success` with the layout's devices in
allocatable -> uncordon. On `failed`, or when `timeout` passes, the previous
layout label is put back and, once the MIG manager reports success for it,
the node is uncordoned and the failure reported; if even that fails the node
stays cordoned (`stuck`) for a person to look at.

Every step's state lives in one node annotation (`gpu.kubeon.io/mig-relayout`)
written in the same patch as the step's change, so a controller restarted at
any moment reads where it was and carries on; nothing is kept in memory.

The patch that changes `nvidia.com/mig.config` also sets
`nvidia.com/mig.config.state=pending`, what the MIG manager itself writes when
it starts on a new config: it notices the label some time later, and until
then the state still describes the previous config (a `failed` one would read
as this config failing, a `success` one as it applied). With `pending` written
in the same patch, every `success` or `failed` read afterwards is the MIG
manager's answer to this config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupolicy.capacity.layout import RELAYOUT_ANNOTATION
from gpupolicy.catalog import MIG_CONFIG_LABEL, MIG_STATE_LABEL, PLUGIN_CONFIG_LABEL, GpuProduct

CORDONED, LABELLED, ROLLBACK, STUCK = "cordoned", "labelled", "rollback", "stuck"
DEFAULT_TIMEOUT_SECONDS = 900.0
PENDING = "pending"  # the MIG manager's state while it applies a config


@dataclass(frozen=True)
class Record:
    """Where a node's re-layout stands (the annotation's content)."""

    target: str
    previous: str
    step: str
    since: float
    cordoned: bool  # we cordoned it (it was schedulable before): uncordon at the end
    policy: str = ""
    proposal: str = ""
    failure: str = ""

    def to_text(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))


def read_record(annotations: Mapping[str, str]) -> Record | None:
    """The record on a node, or None (absent or unreadable: an unreadable one is left to a person)."""
    text = annotations.get(RELAYOUT_ANNOTATION)
    if not text:
        return None
    try:
        data = json.loads(text)
        return Record(**{k: data[k] for k in Record.__dataclass_fields__ if k in data})
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Step:
    """One write to the node (a merge patch) and what it means; `patch` empty means wait."""

    patch: dict[str, Any] = field(default_factory=dict)
    outcome: str = "waiting"  # waiting | started | labelled | done | rolling-back | rolled-back | aborted | stuck
    message: str = ""


def _patch(labels: Mapping[str, str | None] | None = None, record: Record | bool | None = False,
           unschedulable: bool | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = dict(labels)
    if record is not False:
        meta["annotations"] = {RELAYOUT_ANNOTATION: record.to_text() if isinstance(record, Record) else None}
    patch: dict[str, Any] = {"metadata": meta} if meta else {}
    if unschedulable is not None:
        patch["spec"] = {"unschedulable": True if unschedulable else None}
    return patch


def start(node: str, target: str, previous: str, was_unschedulable: bool, now: float, policy: str = "",
          proposal: str = "") -> Step:
    """Cordon and record, in one patch (the plan saw no GPU pod on the node)."""
    record = Record(target, previous, CORDONED, now, not was_unschedulable, policy, proposal)
    return Step(_patch(record=record, unschedulable=True), "started",
                f"node {node}: cordoned for MIG {target} (was {previous})")


def _shows(layout_resources: Mapping[str, int], allocatable: Mapping[str, Any]) -> bool:
    for resource, count in layout_resources.items():
        try:
            if float(str(allocatable.get(resource, "0"))) < count:
                return False
        except ValueError:
            return False
    return True


def advance(node: str, record: Record, labels: Mapping[str, str], allocatable: Mapping[str, Any],
            gpu_pods: int, product: GpuProduct | None, gpus: int, now: float,
            timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Step:
    """The next step of a re-layout in flight (see the module docstring)."""
    state = labels.get(MIG_STATE_LABEL, "")
    uncordon = False if record.cordoned else None
    if record.step == CORDONED:
        if gpu_pods:
            return Step(_patch(record=None, unschedulable=uncordon), "aborted",
                        f"node {node}: a GPU pod arrived before the layout changed; left as {record.previous}")
        nxt = Record(**{**record.__dict__, "step": LABELLED, "since": now})
        return Step(_patch({MIG_CONFIG_LABEL: record.target, MIG_STATE_LABEL: PENDING, PLUGIN_CONFIG_LABEL: None},
                           nxt), "labelled",
                    f"node {node}: {MIG_CONFIG_LABEL}={record.target}, waiting for the MIG manager")
    if record.step == LABELLED:
        layout = product.mig_layout(record.target) if product else None
        devices = layout.resources(gpus) if layout else {}
        if state == "success" and labels.get(MIG_CONFIG_LABEL) == record.target and _shows(devices, allocatable):
            return Step(_patch(record=None, unschedulable=uncordon), "done",
                        f"node {node}: MIG {record.target} applied ({_devices(devices)})")
        waited = now - record.since
        if state == "failed" or waited > timeout:
            why = ("the MIG manager reported failed" if state == "failed"
                   else f"no success after {waited:.0f}s (state {state or 'unset'})")
            nxt = Record(**{**record.__dict__, "step": ROLLBACK, "since": now, "failure": why})
            return Step(_patch({MIG_CONFIG_LABEL: record.previous, MIG_STATE_LABEL: PENDING}, nxt), "rolling-back",
                        f"node {node}: MIG {record.target} failed: {why}; restoring {record.previous}")
        return Step(message=f"node {node}: waiting for MIG {record.target} (state {state or 'unset'})")
    if record.step == ROLLBACK:
        if state == "success" and labels.get(MIG_CONFIG_LABEL) == record.previous:
            return Step(_patch(record=None, unschedulable=uncordon), "rolled-back",
                        f"node {node}: MIG {record.target} failed ({record.failure}); {record.previous} restored")
        if state == "failed" or now - record.since > timeout:
            nxt = Record(**{**record.__dict__, "step": STUCK, "since": now})
            return Step(_patch(record=nxt), "stuck",
                        f"node {node}: restoring {record.previous} failed too; left cordoned for a person")
        return Step(message=f"node {node}: restoring {record.previous} (state {state or 'unset'})")
    return Step(outcome="stuck", message=f"node {node}: re-layout stuck ({record.failure}); left cordoned, "
                f"remove annotation {RELAYOUT_ANNOTATION} and uncordon once fixed")


def _devices(resources: Mapping[str, int]) -> str:
    return ", ".join(f"{count} {name}" for name, count in sorted(resources.items()))
