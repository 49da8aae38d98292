"""Bad input to the hub gets a 400 with a JSON message or one line and exit code 2; never a 500, a
traceback, or a state that breaks later requests (the guide's rule for bad input). On SQLite and on a
real PostgreSQL, through `kubeon-gpu hub serve` and the `kubeon-gpu hub` command."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hub.db import open_db
from hub.store import Hub
from tests.hub.conftest import HubProcess, run_cli
from tests.hub.test_hub_api import POLICY, _token


def test_an_approval_expiry_no_date_can_hold_is_refused_and_polls_go_on(hub_server: HubProcess, cluster: str,
                                                                        tmp_path: Path) -> None:
    """`expiresInSeconds: 1e20` was stored; then every poll of the cluster, the admin listing and the
    console page answered 500 (time.gmtime overflowed) until someone withdrew it by id."""
    token = _token(hub_server, "create", cluster)
    (tmp_path / "p.yaml").write_text(POLICY)
    assert hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(tmp_path / "p.yaml")).returncode == 0
    client = hub_server.client()
    path = f"/clusters/{cluster}/approvals"
    for huge in (1e20, 3153600001):
        refused = client.admin("POST", path, json={"policy": "inference-sharing", "target": "Deployment/ns/w",
                                                   "expiresInSeconds": huge})
        assert refused.status_code == 400 and refused.json()["field"] == "expiresInSeconds", refused.text
    kept = client.admin("POST", path, json={"policy": "inference-sharing", "target": "Deployment/ns/w",
                                            "expiresInSeconds": 3153600000})  # 100 years: the longest
    assert kept.status_code == 201
    polled = client.request("GET", f"/api/v1/clusters/{cluster}/policies", token=token)
    assert polled.status_code == 200 and [a["id"] for a in polled.json()["approvals"]] == [kept.json()["id"]]
    assert client.admin("GET", f"/clusters/{cluster}/policies").status_code == 200
    done = hub_server.cli("approval", "add", "--cluster", cluster, "--policy", "inference-sharing",
                          "--target", "Deployment/ns/w", "--expires-in", "73000d")  # 200 years
    assert done.returncode == 2 and "expiresInSeconds" in done.stderr, done.stderr


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_numbers_json_has_not_are_refused(hub_server: HubProcess, cluster: str, number: str) -> None:
    """`"time": NaN` answered 500; Infinity and 1e999 were stored and the actions list then answered
    `Infinity`, which is not JSON."""
    token = _token(hub_server, "create", cluster)
    body = ('{"actions": [{"id": "a1", "policy": "p", "target": "Deployment/ns/w", "action": "scale to 0", '
            f'"mode": "Automatic", "result": "applied", "time": {number}}}]}}')
    answer = hub_server.client().request("POST", f"/api/v1/clusters/{cluster}/actions", token=token, data=body,
                                         headers={"Idempotency-Key": "k1", "Content-Type": "application/json"})
    assert answer.status_code == 400 and "malformed JSON" in answer.json()["error"], answer.text
    assert hub_server.client().admin("GET", f"/clusters/{cluster}/actions").json()["actions"] == []


def test_the_same_batch_or_action_sent_at_once_is_stored_once(hub_server: HubProcess, cluster: str) -> None:
    """A controller that times out and retries races its own first request: each answer is the first
    one's or a duplicate, never a 500 from the unique constraint."""
    token = _token(hub_server, "create", cluster)
    client = hub_server.client()
    path = f"/api/v1/clusters/{cluster}/actions"
    for round_ in range(4):
        action = {"id": f"a{round_}", "policy": "p", "target": "Deployment/ns/w", "action": "scale to 0",
                  "mode": "Automatic", "result": "applied", "time": 1_800_000_000.0}
        answers: list[tuple[int, dict]] = []
        lock = threading.Lock()

        def send(key: str, body: dict = action, answers: list = answers, lock: threading.Lock = lock) -> None:
            got = client.request("POST", path, token=token, json={"actions": [body]},
                                 headers={"Idempotency-Key": key})
            with lock:
                answers.append((got.status_code, got.json()))

        # two requests with one key, two with another key and the same action id
        threads = [threading.Thread(target=send, args=(key,)) for key in
                   (f"k{round_}", f"k{round_}", f"j{round_}", f"j{round_}")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [status for status, _ in answers] == [200] * 4, answers
        assert sum(body["accepted"] for _, body in answers if not body["duplicate"]) == 1, answers
    logged = client.admin("GET", f"/clusters/{cluster}/actions").json()["actions"]
    assert sorted(a["id"] for a in logged) == ["a0", "a1", "a2", "a3"]


def test_withdrawing_twice_changes_nothing_the_second_time(db_url: str) -> None:
    hub = Hub(open_db(db_url))
    hub.create_cluster("c", "t")
    hub.apply_policy("c", "p", {"mode": "Approve", "packing": {}}, "t")
    approval = hub.add_approval("c", "p", "Deployment/ns/w", "t")
    hub.withdraw_approval("c", approval, "t")
    revision = hub.policies("c")[0]
    entries = len(hub.audit())
    hub.withdraw_approval("c", approval, "t")
    assert hub.policies("c")[0] == revision, "a withdrawal that changes nothing made a new revision"
    assert len(hub.audit()) == entries


@pytest.mark.parametrize(("args", "message"), [
    (["--db", "bogus", "token", "create", "--cluster", "c"], "--db 'bogus': not a database URL"),
    (["--db", "sqlite:////nonexistent-dir/x/hub.db", "token", "create", "--cluster", "c"],
     "--db sqlite:////nonexistent-dir/x/hub.db: cannot open the database"),
    (["--db", "postgresql+psycopg://u:secret@127.0.0.1:9/db", "token", "create", "--cluster", "c"],
     "--db postgresql+psycopg://u:***@127.0.0.1:9/db: cannot open the database"),
    # a URL SQLAlchemy cannot parse (the port) was echoed whole, password included
    (["--db", "postgresql+psycopg://u:secret@db:notaport/hub", "token", "create", "--cluster", "c"],
     "--db 'postgresql+psycopg://u:***@db:notaport/hub': not a database URL"),
    (["serve", "--bind", "127.0.0.1:99999"], "--bind '127.0.0.1:99999': expected HOST:PORT, the port 1-65535"),
    (["serve", "--admin-token-file", "/nonexistent/token"], "--admin-token-file /nonexistent/token: No such file"),
    (["serve", "--cert", "/nonexistent/c.pem", "--key", "/nonexistent/k.pem"],
     "--cert /nonexistent/c.pem: no such file"),
    (["serve", "--workers", "0"], "kubeon-gpu hub serve: error: argument --workers: 0 is below 1"),
])
def test_cli_mistakes_are_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    if args[0] == "serve":
        args = ["--db", f"sqlite:///{tmp_path}/hub.db", *args]
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and message in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    if lines[0].startswith("usage:"):  # argparse: its usage, then the one line
        assert lines[-1] == message, done.stderr
    else:
        assert len(lines) == 1, done.stderr
    assert "secret" not in done.stderr, "the database password was shown"


def test_a_policy_file_yaml_cannot_read_is_one_line(hub_server: HubProcess, cluster: str, tmp_path: Path) -> None:
    _token(hub_server, "create", cluster)
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY.replace("mode: Approve", "mode: [Approve"))
    done = run_cli("--db", hub_server.db, "policy", "apply", "--cluster", cluster, "-f", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"kubeon-gpu hub: {bad}: not valid YAML at line 6, column 11: did not find expected ',' or ']'"], done.stderr


@pytest.mark.parametrize(("path", "body"), [
    ("/clusters", "[" * 1000 + "]" * 1000),  # 2 KiB: past what Python's parser recurses through
    ("/clusters/{cluster}/approvals", '{"policy": "inference-sharing", "target": "Deployment/ns/\\ud800"}'),
])
def test_json_no_store_can_hold_is_a_400(hub_server: HubProcess, cluster: str, path: str, body: str,
                                         tmp_path: Path) -> None:
    """Deep nesting answered 500 (RecursionError); a lone UTF-16 surrogate, which JSON can escape and no
    database text can store, answered 500 from the driver."""
    _token(hub_server, "create", cluster)
    (tmp_path / "p.yaml").write_text(POLICY)
    assert hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(tmp_path / "p.yaml")).returncode == 0
    answer = hub_server.client().admin("POST", path.format(cluster=cluster), data=body,
                                       headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"].startswith("malformed JSON: "), answer.text
    assert hub_server.client().admin("GET", f"/clusters/{cluster}/policies").json()["approvals"] == []


@pytest.mark.parametrize(("content", "message"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text (byte 0x89 at position 0)"),
    ("kind: GpuPolicy\n".encode("utf-16"), "not UTF-8 text (byte 0xff at position 0)"),
])
def test_a_policy_file_that_is_not_text_is_one_line(hub_server: HubProcess, cluster: str, tmp_path: Path,
                                                    content: bytes, message: str) -> None:
    _token(hub_server, "create", cluster)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    done = hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(bad))
    assert done.returncode == 2 and done.stderr == f"kubeon-gpu hub: {bad}: {message}\n", done.stderr


def test_a_deleted_policys_approvals_do_not_come_back_with_its_name(db_url: str) -> None:
    """They were still listed, and in force again once a policy of the same name was created."""
    hub = Hub(open_db(db_url))
    hub.create_cluster("c", "t")
    hub.apply_policy("c", "p", {"mode": "Approve", "packing": {}}, "t")
    hub.add_approval("c", "p", "Deployment/ns/w", "t")
    assert len(hub.policies("c")[2]) == 1
    hub.delete_policy("c", "p", "t")
    assert hub.policies("c")[2] == []
    hub.apply_policy("c", "p", {"mode": "Approve", "packing": {}}, "t")
    assert hub.policies("c")[2] == []


def test_a_policy_without_a_name_is_named_as_such(hub_server: HubProcess, cluster: str, tmp_path: Path) -> None:
    _token(hub_server, "create", cluster)
    bad = tmp_path / "noname.yaml"
    bad.write_text("apiVersion: gpu.kubeon.io/v1alpha1\nkind: GpuPolicy\nmetadata: {}\nspec: {packing: {}}\n")
    done = hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(bad))
    assert done.returncode == 2
    assert done.stderr == f"kubeon-gpu hub: {bad}: document 1: metadata.name: a GpuPolicy needs a name\n"


@pytest.mark.parametrize("number", [".inf", ".nan", "-.inf"])
def test_a_wake_threshold_json_cannot_carry_is_refused_and_polls_stay_json(hub_server: HubProcess, cluster: str,
                                                                          tmp_path: Path, number: str) -> None:
    """`above: .inf` was stored; then every poll served `Infinity`, which no JSON parser reads."""
    import json

    import requests

    token = _token(hub_server, "create", cluster)
    bad = tmp_path / "nan.yaml"
    bad.write_text("apiVersion: gpu.kubeon.io/v1alpha1\nkind: GpuPolicy\nmetadata: {name: stz}\n"
                   "spec: {mode: Automatic, "
                   f"scaleToZero: {{namespaces: [default], wake: {{above: {number}, prometheusQuery: up}}}}}}\n")
    done = hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == (f"kubeon-gpu hub: {bad}: document 1 (stz): spec.scaleToZero.wake.above: "
                           "Input should be a finite number\n")
    answer = requests.get(f"{hub_server.url}/api/v1/clusters/{cluster}/policies",
                          headers={"Authorization": f"Bearer {token}"}, timeout=5, verify=hub_server.ca_file or True)
    assert json.loads(answer.text, parse_constant=lambda name: pytest.fail(f"{name} served"))["policies"] == []


@pytest.mark.parametrize("name", [".", ".."])
def test_a_cluster_name_no_url_path_can_hold_is_refused(hub_server: HubProcess, name: str) -> None:
    """URL clients remove dot segments (`/clusters/../policies` is `/policies`): a cluster named so was created
    and could never be polled."""
    answer = hub_server.client().admin("POST", "/clusters", json={"name": name})
    assert answer.status_code == 400 and answer.json()["field"] == "name", answer.text
    assert "a URL path cannot hold it" in answer.json()["error"]


def test_an_approval_target_longer_than_its_column_is_refused(db_url: str) -> None:
    """The API's schema caps it at 800, the console's form did not: PostgreSQL refused the row (a 500)."""
    from hub.store import HubError

    hub = Hub(open_db(db_url))
    hub.create_cluster("c", "t")
    hub.apply_policy("c", "p", {"mode": "Approve", "packing": {}}, "t")
    with pytest.raises(HubError, match="target: 801 characters, at most 800") as refused:
        hub.add_approval("c", "p", "Deployment/ns/" + "w" * 787, "t")
    assert refused.value.status == 400 and refused.value.field == "target"
    assert hub.add_approval("c", "p", "Deployment/ns/" + "w" * 786, "t")  # 800 fits
    assert len(hub.policies("c")[2]) == 1
