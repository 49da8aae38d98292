"""The consolidation inputs the capacity controller builds from live objects (pure parts).

Pod ages (`changed_at`): when a pod last came to or left a node, from the pods' startTime (else
creationTimestamp), their containers' finishedAt, and, for a deleted pod that leaves no trace, when this
process saw the node's pods change. Real: the controller's EmptyTracker on plain Pod dicts; nothing faked.
"""

from __future__ import annotations

from typing import Any

from controller.capacity.consolidation import EmptyTracker, NodePods, read_node_pods
from controller.capacity.state import timestamp


def pod(name: str, uid: str, node: str, start: str | None, created: str = "2026-01-01T00:00:00Z",
        finished: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running"}
    if start:
        status["startTime"] = start
    if finished:
        status["containerStatuses"] = [{"name": "c", "state": {"terminated": {"finishedAt": finished}}}]
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid, "creationTimestamp": created},
            "spec": {"nodeName": node}, "status": status}


def changed_at(tracker: EmptyTracker, name: str, *pods: dict[str, Any], now: float) -> float | None:
    """`tracker.changed_at` for node `name` holding `pods`, as a pass reads them (`read_node_pods`)."""
    read: NodePods = read_node_pods(list(pods))
    return tracker.changed_at(name, read.members, read.latest, now)


def test_pod_ages_are_the_newest_start_then_what_the_process_saw_leave() -> None:
    tracker = EmptyTracker()
    a = pod("a", "u1", "n1", "2026-01-01T01:00:00Z")
    b = pod("b", "u2", "n1", None, created="2026-01-01T02:00:00Z")  # not started yet: its creation
    assert changed_at(tracker, "n1", a, b, now=1e10) == timestamp("2026-01-01T02:00:00Z")
    # b deleted: nothing in the objects says when, so the pass that saw it go is the mark
    later = timestamp("2026-01-01T05:00:00Z")
    assert later is not None
    assert changed_at(tracker, "n1", a, now=later) == later
    # a finished container counts as a departure
    done = pod("c", "u3", "n2", "2026-01-01T00:30:00Z", finished="2026-01-01T03:00:00Z")
    assert changed_at(tracker, "n2", done, now=1e10) == timestamp("2026-01-01T03:00:00Z")
    assert changed_at(tracker, "n3", now=1e10) is None


def test_a_pod_stamp_ahead_of_the_controllers_clock_reads_as_now() -> None:
    """API server and controller clocks differ: a start 'in the future' must not keep a node from ever
    settling (with settle 0 a future mark made `now - changed_at` negative: no candidate)."""
    early = timestamp("2026-01-01T00:00:00Z")
    assert early is not None
    ahead = pod("a", "u1", "n1", "2026-01-01T00:00:02Z")
    assert changed_at(EmptyTracker(), "n1", ahead, now=early) == early


def test_a_pods_age_counts_from_its_binding_then_its_start_then_its_creation() -> None:
    from controller.capacity.consolidation import started_at

    bound = pod("a", "u1", "n1", "2026-01-01T01:00:00Z")
    bound["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                      "lastTransitionTime": "2026-01-01T00:10:00Z"}]
    assert started_at(bound, now=1e10) == timestamp("2026-01-01T00:10:00Z")
    assert started_at(pod("b", "u2", "n1", "2026-01-01T01:00:00Z"), now=1e10) == timestamp("2026-01-01T01:00:00Z")
    assert started_at(pod("c", "u3", "n1", None), now=1e10) == timestamp("2026-01-01T00:00:00Z")
    assert started_at(pod("d", "u4", "n1", "2026-01-01T01:00:00Z"), now=5.0) == 5.0  # ahead of this clock
