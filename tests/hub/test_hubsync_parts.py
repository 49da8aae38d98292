"""The hub sync's small parts on their own: the bounded outbox, the token file, jitter and back-off."""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from controller.hubsync import HubSettings, HubState, HubSync, Outbox, TokenFile


def test_outbox_drops_the_oldest_and_counts_them() -> None:
    box = Outbox(limit=3)
    for n in range(5):
        box.add({"id": str(n)})
    assert box.dropped == 2 and len(box) == 3
    key, batch = box.next_batch() or ("", [])
    assert [a["id"] for a in batch] == ["2", "3", "4"]
    again = box.next_batch()
    assert again is not None and again[0] == key, "a retried batch keeps its idempotency key"
    box.sent()
    assert box.next_batch() is None and len(box) == 0


def test_token_file_is_reread_when_the_secret_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    token = TokenFile(str(path))
    assert token.read() == "first"
    replacement = tmp_path / "new"
    replacement.write_text("second")
    os.replace(replacement, path)  # what the kubelet's ..data swap amounts to
    assert token.read() == "second"
    path.unlink()
    assert token.read() == "second", "a file missing mid-swap keeps the last token"


def test_polls_are_jittered_and_errors_back_off(tmp_path: Path) -> None:
    from tests.loopback import free_port

    (tmp_path / "t").write_text("token")
    settings = HubSettings(f"http://127.0.0.1:{free_port()}", "c", str(tmp_path / "t"), poll_interval=60.0,
                           timeout=0.5)
    sync = HubSync(settings, HubState(), CollectorRegistry(), rng=random.Random(1))
    periods = {round(sync._jittered(60.0), 3) for _ in range(50)}
    assert len(periods) > 40 and min(periods) >= 54 and max(periods) <= 66
    sync._restored = True  # no cluster here: the restart check is the sync tests' business
    ctx = SimpleNamespace(clock=SimpleNamespace(now=lambda: 0.0))
    delays = []
    for _ in range(6):
        sync.reconcile(ctx)  # type: ignore[arg-type]  # the hub is down: connection refused
        delays.append(sync.period_seconds)
    assert 108 <= delays[0] <= 132 and 216 <= delays[1] <= 264, delays  # doubling, jittered
    assert all(540 <= d <= 660 for d in delays[3:]), "capped at 10 minutes"
    assert sync.state.connected, "an unreachable hub is an outage, not a revocation"


def test_backing_off_never_polls_more_often_than_the_interval(tmp_path: Path) -> None:
    """An interval over the 10-minute cap: a failed poll waits the interval, not the shorter cap."""
    from tests.loopback import free_port

    (tmp_path / "t").write_text("token")
    settings = HubSettings(f"http://127.0.0.1:{free_port()}", "c", str(tmp_path / "t"), poll_interval=3600.0,
                           timeout=0.5)
    sync = HubSync(settings, HubState(), CollectorRegistry(), rng=random.Random(1))
    sync._restored = True
    ctx = SimpleNamespace(clock=SimpleNamespace(now=lambda: 0.0))
    for _ in range(3):
        sync.reconcile(ctx)  # type: ignore[arg-type]  # the hub is down: connection refused
        assert 3240 <= sync.period_seconds <= 3960, sync.period_seconds


def _hub_policy_with_proposal(estimate: float) -> dict:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy",
            "metadata": {"name": "share", "labels": {"gpu.kubeon.io/managed-by": "hub"}},
            "spec": {"mode": "Approve", "selector": {"namespaces": ["ml"]}, "sharing": {"strategy": "TimeSlicing"}},
            "status": {"proposals": [{"id": "abc123", "target": "Deployment/ml/llm", "action": "gpu -> shared",
                                      "state": "Proposed", "estimatedGpuHoursPerMonth": estimate}]}}


def test_a_proposal_reaches_the_hub_with_its_estimated_gpu_hours(tmp_path: Path) -> None:
    from controller.hubreport import savings_of
    from controller.policies import PolicyStore, parse_entry
    from gpupolicy.model import Mode

    store = PolicyStore()
    store.replace_all([parse_entry(_hub_policy_with_proposal(146.0))])
    ctx = SimpleNamespace(policies=store, default_mode=Mode.RECOMMEND, prometheus_configured=True)
    (tmp_path / "t").write_text("token")
    sync = HubSync(HubSettings("http://127.0.0.1:1", "c", str(tmp_path / "t")), HubState(), CollectorRegistry())
    sync.report_proposals(ctx, 1.0)  # type: ignore[arg-type]
    _, batch = sync.outbox.next_batch() or ("", [])
    assert [(a["target"], a["result"], a["estimatedGpuHoursPerMonth"]) for a in batch] == [
        ("Deployment/ml/llm", "proposed", 146.0)]
    # once applied, the summary counts what the proposal said it frees; an action without a proposal frees 0
    applied = savings_of(ctx, [("share", "Deployment/ml/llm"), ("share", "Node/gpu-1")])  # type: ignore[arg-type]
    assert [a.gpu_hours_per_month for a in applied] == [146.0, 0.0]
