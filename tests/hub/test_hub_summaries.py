"""Cluster summary reports at the hub: `kubeon-gpu hub serve` on SQLite and on a real PostgreSQL, reports
POSTed over HTTP as the controller posts them (controller.hubsync.HubClient), every answer checked against
hub/openapi.yaml. Faked: nothing; the reports' figures are chosen by the test instead of read from a cluster.
The month's savings estimate (hub.summaries.saved_since) is also checked on plain data."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from controller.hubsync import HubClient as ControllerClient
from controller.hubsync import HubSettings
from hub.summaries import Point, carry, month_start, saved_since
from tests.hub.conftest import ADMIN, HubProcess, start_hub, summary_report


def _token(hub: HubProcess, cluster: str) -> str:
    done = hub.cli("token", "create", "--cluster", cluster)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _post(hub: HubProcess, cluster: str, token: str, reports: list[dict], key: str = "k") -> tuple[int, dict]:
    answer = hub.client().request("POST", f"/api/v1/clusters/{cluster}/summaries", token=token,
                                  json={"summaries": reports}, headers={"Idempotency-Key": key})
    return answer.status_code, answer.json()


def _history(hub: HubProcess, cluster: str, query: str = "") -> dict:
    answer = hub.client().admin("GET", f"/clusters/{cluster}/summaries{query}")
    assert answer.status_code == 200, answer.text
    body: dict = answer.json()
    return body


def test_a_retried_batch_is_stored_once(hub_server: HubProcess, cluster: str) -> None:
    token = _token(hub_server, cluster)
    now = time.time()
    batch = [summary_report(now - 60, allocated=4), summary_report(now, allocated=5, saving=1.5)]
    assert _post(hub_server, cluster, token, batch) == (200, {"accepted": 2, "duplicate": False})
    assert _post(hub_server, cluster, token, batch) == (200, {"accepted": 0, "duplicate": True})
    # the controller's own client, the same batch under its key: stored once still
    sender = ControllerClient(HubSettings(hub_server.url, cluster, "unused"))
    assert sender.post_summaries(token, "retry", batch) == 200
    history = _history(hub_server, cluster)
    assert [p["allocatedGpus"] for p in history["points"]] == [4, 5]
    assert history["latest"] == batch[1]
    assert history["points"][-1]["savingsRate"] == 1.5
    listed = hub_server.client().admin("GET", "/clusters").json()["clusters"]
    mine = next(c for c in listed if c["name"] == cluster)
    assert mine["summary"]["gpus"] == 8 and mine["summary"]["allocatedGpus"] == 5 and mine["summary"]["idleGpus"] == 2


def test_another_clusters_token_is_refused(hub_server: HubProcess, cluster: str) -> None:
    _token(hub_server, cluster)
    other = _token(hub_server, cluster + "-other")
    status, body = _post(hub_server, cluster, other, [summary_report(time.time())])
    assert status == 403 and "another cluster" in body["error"]
    assert _post(hub_server, cluster, "kgo_not-a-token", [summary_report(time.time())])[0] == 401
    assert _history(hub_server, cluster)["points"] == []


@pytest.mark.parametrize(("change", "field"), [
    ({"gpus": "eight"}, "summaries.0.gpus"),
    ({"idleGpus": -1}, "summaries.0.idleGpus"),
    ({"costPerHour": "1e400"}, "summaries.0.costPerHour"),
    ({"version": 2}, "summaries.0.version"),
    ({"savings": {"actionsApplied": 0, "gpuHoursPerMonth": 0}}, "summaries.0.savings"),
    ({"surprise": 1}, "summaries.0"),
], ids=["wrong-type", "negative", "string-number", "unknown-version", "missing-field", "unknown-field"])
def test_a_malformed_report_is_a_400_naming_the_field(hub_server: HubProcess, cluster: str, change: dict,
                                                      field: str) -> None:
    token = _token(hub_server, cluster)
    status, body = _post(hub_server, cluster, token, [{**summary_report(time.time()), **change}])
    assert status == 400 and body["field"] == field, body
    assert body["error"].startswith(field)


def test_a_malformed_body_is_a_400(hub_server: HubProcess, cluster: str) -> None:
    token = _token(hub_server, cluster)
    answer = hub_server.client().request("POST", f"/api/v1/clusters/{cluster}/summaries", token=token,
                                         data=b'{"summaries": [NaN]}',
                                         headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and "malformed JSON" in answer.json()["error"]
    assert _post(hub_server, cluster, token, [])[1]["field"] == "summaries"


def test_history_is_bounded_and_keeps_the_savings(tmp_path: Path) -> None:
    hub = start_hub(f"sqlite:///{tmp_path}/hub.db", extra=("--summary-retention", "3"))
    try:
        token = _token(hub, "prod")
        start = time.time() - 600
        for n in range(6):
            _post(hub, "prod", token, [summary_report(start + 60 * n, allocated=n, saving=1.0)], key=str(n))
        history = _history(hub, "prod")
        assert [p["allocatedGpus"] for p in history["points"]] == [3, 4, 5], "the newest three are kept"
        assert history["points"][-1]["savingsRate"] == 6.0, "savings of pruned reports still count"
        assert [p["allocatedGpus"] for p in _history(hub, "prod", "?limit=1")["points"]] == [5]
        bad = hub.client().admin("GET", "/clusters/prod/summaries?limit=0")
        assert bad.status_code == 400 and bad.json()["field"] == "limit"
    finally:
        hub.stop()


def test_the_hub_serves_its_own_metrics_to_the_admin(hub_server: HubProcess, cluster: str) -> None:
    token = _token(hub_server, cluster)
    _post(hub_server, cluster, token, [summary_report(time.time(), gpus=12, cost=20.5, idle=3)])
    client = hub_server.client()
    assert client.request("GET", "/metrics").status_code == 401
    text = client.request("GET", "/metrics", token="adm" + "in-wrong").text
    assert "kubeon_hub" not in text
    scraped = client.request("GET", "/metrics", token=ADMIN)
    assert scraped.status_code == 200
    assert f'kubeon_hub_cluster_gpus{{cluster="{cluster}"}} 12.0' in scraped.text
    assert f'kubeon_hub_cluster_gpus_idle{{cluster="{cluster}"}} 3.0' in scraped.text
    assert f'kubeon_hub_cluster_cost_per_hour{{cluster="{cluster}"}} 20.5' in scraped.text
    assert 'kubeon_hub_clusters{state="never polled"}' in scraped.text


def test_a_hub_on_the_first_schema_upgrades_and_keeps_its_actions(tmp_path: Path) -> None:
    """A database made by the previous release (schema 0001, one action stored) upgrades to 0002 on start:
    the action is still there, and summary reports are stored."""
    from alembic import command
    from alembic.config import Config

    from hub.db import MIGRATIONS, make_engine

    url = f"sqlite:///{tmp_path}/hub.db"
    engine = make_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
        connection.exec_driver_sql("INSERT INTO clusters (id, name, created_at, revision) VALUES (1, 'old', 0, 0)")
        connection.exec_driver_sql(
            "INSERT INTO actions (cluster_id, action_id, policy, target, action, mode, result, time, received_at) "
            "VALUES (1, 'a-1', 'p', 'Deployment/ns/w', 'scale to 0', 'Automatic', 'applied', 1.0, 1.0)")
    engine.dispose()
    hub = start_hub(url)
    try:
        token = hub.client().admin("POST", "/clusters/old/token").json()["token"]
        assert [a["id"] for a in hub.client().admin("GET", "/clusters/old/actions").json()["actions"]] == ["a-1"]
        assert _post(hub, "old", token, [summary_report(time.time())]) == (200, {"accepted": 1, "duplicate": False})
        assert "schema 0002 (upgraded from 0001)" in hub.log.read_text()
    finally:
        hub.stop()


def _points(*reports: tuple[float, float]) -> list[Point]:
    """Stored reports made at (hours, saving per hour), with their running totals as the hub keeps them."""
    points: list[Point] = []
    rate = total = since = 0.0
    for hours, saving in reports:
        rate, total = carry(rate, total, since, hours * 3600.0, saving)
        since = hours * 3600.0
        points.append(Point(since, 8, 4, None, 0, 1, 10.0, saving, rate, total))
    return points


@pytest.mark.parametrize(("reports", "anchor", "expected"), [
    ((), 0, 0.0),
    (((1, 2.0),), 0, 2.0 * 2),  # from its report at 1 h to now at 3 h
    (((1, 2.0), (2, 1.0)), 0, 2.0 * 1 + 3.0 * 1),
    (((-2, 5.0), (2, 1.0)), 0, 5.0 * 2 + 6.0 * 1),  # a rate from last month holds on into this one
    (((-2, 5.0),), 0, 5.0 * 3),
    (((-4, 1.0), (-2, 5.0), (2, 1.0)), 1, 6.0 * 2 + 7.0 * 1),  # the anchor: the newest report before the 1st
], ids=["no-report", "one", "two", "last-months-rate-first", "only-last-month", "several-before"])
def test_saved_this_month_holds_each_rate_until_the_next_report(reports: tuple[tuple[float, float], ...],
                                                                  anchor: int, expected: float) -> None:
    points = _points(*reports)
    found = saved_since(points[anchor] if points else None, points[-1] if points else None, 0.0, 3 * 3600.0)
    assert found == pytest.approx(expected)


def test_the_month_starts_at_midnight_utc_on_the_first() -> None:
    assert month_start(1_796_554_728.0) == 1_796_083_200.0  # 2026-12-06 11:18 UTC -> 2026-12-01 00:00 UTC
