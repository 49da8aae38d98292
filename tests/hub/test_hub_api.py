"""The hub as a user runs it: `kubeon-gpu hub serve` on SQLite and on a real PostgreSQL, driven by its CLI
and its HTTP API, every response checked against hub/openapi.yaml."""

from __future__ import annotations

from pathlib import Path

import requests
import yaml

from hub.db import open_db
from hub.store import ROTATION_OVERLAP, Hub
from tests.hub.conftest import HubProcess

POLICY = """\
apiVersion: gpu.kubeon.io/v1alpha1
kind: GpuPolicy
metadata: {name: inference-sharing}
spec:
  mode: Approve
  selector: {namespaces: [inference]}
  sharing: {strategy: MIG, migProfile: auto}
---
apiVersion: gpu.kubeon.io/v1alpha1
kind: GpuPolicy
metadata: {name: idle-to-zero}
spec:
  scaleToZero: {namespaces: [batch], idleFor: 30m}
"""


def _token(hub: HubProcess, verb: str, cluster: str) -> str:
    done = hub.cli("token", verb, "--cluster", cluster)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_cluster_reads_its_policies_with_etag_and_304(hub_server: HubProcess, cluster: str, tmp_path: Path) -> None:
    token = _token(hub_server, "create", cluster)
    assert token.startswith("kgo_")
    (tmp_path / "p.yaml").write_text(POLICY)
    applied = hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(tmp_path / "p.yaml"))
    assert applied.returncode == 0, applied.stderr
    client = hub_server.client()
    first = client.request("GET", f"/api/v1/clusters/{cluster}/policies", token=token)
    assert first.status_code == 200
    body = first.json()
    assert [p["name"] for p in body["policies"]] == ["idle-to-zero", "inference-sharing"]
    assert body["policies"][1]["spec"]["sharing"] == {"strategy": "MIG", "migProfile": "auto"}
    assert body["revision"] == 2
    again = client.request("GET", f"/api/v1/clusters/{cluster}/policies", token=token,
                           headers={"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304
    approval = hub_server.cli("approval", "add", "--cluster", cluster, "--policy", "inference-sharing",
                              "--target", "Deployment/inference/llm")
    assert approval.returncode == 0, approval.stderr
    changed = client.request("GET", f"/api/v1/clusters/{cluster}/policies", token=token,
                             headers={"If-None-Match": first.headers["ETag"]})
    assert changed.status_code == 200
    assert changed.json()["approvals"] == [{"policy": "inference-sharing", "target": "Deployment/inference/llm",
                                            "id": approval.stdout.strip(), "expires": None}]
    withdrawn = hub_server.cli("approval", "withdraw", "--cluster", cluster, "--id", approval.stdout.strip())
    assert withdrawn.returncode == 0, withdrawn.stderr
    assert client.request("GET", f"/api/v1/clusters/{cluster}/policies", token=token).json()["approvals"] == []


def test_a_token_reads_only_its_own_cluster(hub_server: HubProcess, cluster: str) -> None:
    a, b = cluster + "-a", cluster + "-b"
    mine = _token(hub_server, "create", a)
    _token(hub_server, "create", b)
    client = hub_server.client()
    assert client.request("GET", f"/api/v1/clusters/{b}/policies", token=mine).status_code == 403
    assert client.request("POST", f"/api/v1/clusters/{b}/actions", token=mine, json={"actions": []},
                          headers={"Idempotency-Key": "k"}).status_code == 403
    assert client.request("GET", f"/api/v1/clusters/{a}/policies").status_code == 401
    assert client.request("GET", f"/api/v1/clusters/{a}/policies", token="kgo_nope").status_code == 401
    assert client.request("GET", "/api/v1/admin/clusters", token=mine).status_code == 401


def test_rotation_overlap_and_revocation(hub_server: HubProcess, cluster: str) -> None:
    old = _token(hub_server, "create", cluster)
    client = hub_server.client()
    path = f"/api/v1/clusters/{cluster}/policies"
    assert client.request("GET", path, token=old).status_code == 200
    new = _token(hub_server, "rotate", cluster)
    assert new != old
    assert client.request("GET", path, token=old).status_code == 200, "the old token works until the new is used"
    assert client.request("GET", path, token=new).status_code == 200
    assert client.request("GET", path, token=old).status_code == 401, "first use of the new token ends the old"
    revoked = hub_server.cli("token", "revoke", "--cluster", cluster)
    assert revoked.returncode == 0, revoked.stderr
    assert client.request("GET", path, token=new).status_code == 401
    clusters = [c for c in client.admin("GET", "/clusters").json()["clusters"] if c["name"] == cluster]
    assert clusters == [{"name": cluster, "state": "disconnected", "lastPoll": clusters[0]["lastPoll"],
                         "lastPollResult": "revoked", "revision": 0, "summary": None}]
    verbs = [e["verb"] for e in client.admin("GET", "/audit").json()["entries"] if e["cluster"] == cluster]
    assert verbs == ["token.revoke", "token.rotate", "token.create"]
    fresh = client.admin("POST", f"/clusters/{cluster}/token")
    assert fresh.status_code == 201
    assert client.request("GET", path, token=fresh.json()["token"]).status_code == 200
    assert client.admin("POST", f"/clusters/{cluster}/token").status_code == 409, "one live token at a time"


def test_old_token_expires_after_24_hours_unused(db_url: str) -> None:
    now = [1_800_000_000.0]
    hub = Hub(open_db(db_url), clock=lambda: now[0])
    old = hub.create_cluster("c", "t")
    hub.rotate("c", "t")
    now[0] += ROTATION_OVERLAP - 60
    assert hub.authenticate("c", old).name == "c"
    now[0] += 120
    try:
        hub.authenticate("c", old)
    except Exception as exc:
        assert getattr(exc, "status", None) == 401
    else:
        raise AssertionError("a rotated-out token still works after 24 hours")


def test_actions_are_stored_exactly_once(hub_server: HubProcess, cluster: str) -> None:
    token = _token(hub_server, "create", cluster)
    client = hub_server.client()
    action = {"id": "a1", "policy": "p", "target": "Deployment/ns/w", "action": "scale to 0", "mode": "Automatic",
              "result": "applied", "time": 1_800_000_000.0}
    path = f"/api/v1/clusters/{cluster}/actions"
    first = client.request("POST", path, token=token, json={"actions": [action]}, headers={"Idempotency-Key": "b1"})
    assert first.json() == {"accepted": 1, "duplicate": False}
    retry = client.request("POST", path, token=token, json={"actions": [action]}, headers={"Idempotency-Key": "b1"})
    assert retry.json() == {"accepted": 1, "duplicate": True}
    other = {**action, "id": "a2"}
    mixed = client.request("POST", path, token=token, json={"actions": [action, other]},
                           headers={"Idempotency-Key": "b2"})
    assert mixed.json() == {"accepted": 1, "duplicate": False}
    logged = client.admin("GET", f"/clusters/{cluster}/actions").json()["actions"]
    assert sorted(a["id"] for a in logged) == ["a1", "a2"]


def test_an_action_time_is_unix_seconds_or_an_rfc_3339_date_time(hub_server: HubProcess, cluster: str) -> None:
    """`time` as unix seconds or as an RFC 3339 date-time with an offset; the list answers unix seconds.
    A string that is no such date-time is a 400 naming the field."""
    token = _token(hub_server, "create", cluster)
    client = hub_server.client()
    path = f"/api/v1/clusters/{cluster}/actions"
    action = {"policy": "p", "target": "Deployment/ns/w", "action": "scale to 0", "mode": "Automatic",
              "result": "applied"}
    times = {"n": 1_777_636_800.5, "z": "2026-05-01T12:00:00Z", "offset": "2026-05-01T14:00:00.5+02:00"}
    sent = client.request("POST", path, token=token, headers={"Idempotency-Key": "t1"},
                          json={"actions": [{**action, "id": name, "time": when} for name, when in times.items()]})
    assert sent.json() == {"accepted": 3, "duplicate": False}, sent.text
    logged = {a["id"]: a["time"] for a in client.admin("GET", f"/clusters/{cluster}/actions").json()["actions"]}
    assert logged == {"n": 1_777_636_800.5, "z": 1_777_636_800.0, "offset": 1_777_636_800.5}
    for bad in ("2026-05-01T12:00:00", "yesterday", True):
        refused = client.request("POST", path, token=token, headers={"Idempotency-Key": f"bad-{bad}"},
                                 json={"actions": [{**action, "id": "x", "time": bad}]})
        assert refused.status_code == 400 and refused.json()["field"] == "actions.0.time", refused.text
        assert "actions.0.time: " in refused.json()["error"], refused.text


def test_bad_input_gets_400_with_a_json_message(hub_server: HubProcess, cluster: str) -> None:
    token = _token(hub_server, "create", cluster)
    client = hub_server.client()
    path = f"/api/v1/clusters/{cluster}/actions"
    key = {"Idempotency-Key": "k", "Content-Type": "application/json"}
    malformed = client.request("POST", path, token=token, data="{not json", headers=key)
    assert malformed.status_code == 400 and "malformed JSON" in malformed.json()["error"]
    oversize = client.request("POST", path, token=token, data=b"[" + b"1," * 600_000 + b"1]", headers=key)
    assert oversize.status_code == 400 and "over the limit" in oversize.json()["error"]
    unknown = client.request("POST", path, token=token, json={"actions": [], "extra": 1}, headers=key)
    assert unknown.status_code == 400 and "'extra' was unexpected" in unknown.json()["error"]
    wrong = client.admin("POST", "/clusters", json={"name": 42})
    assert wrong.status_code == 400 and wrong.json()["field"] == "name"
    bad_spec = client.admin("PUT", f"/clusters/{cluster}/policies/p", json={"spec": {"sharing": {"strategy": "Magic"}}})
    assert bad_spec.status_code == 400 and bad_spec.json()["field"] == "spec.sharing.strategy"
    assert client.admin("GET", f"/clusters/{cluster}/policies").json()["policies"] == []


def test_sql_looking_names_are_stored_literally(hub_server: HubProcess, cluster: str) -> None:
    name = f"x'); DROP TABLE clusters;-- {cluster}"
    client = hub_server.client()
    created = client.admin("POST", "/clusters", json={"name": name})
    assert created.status_code == 201
    names = [c["name"] for c in client.admin("GET", "/clusters").json()["clusters"]]
    assert name in names and all(n != "x')" for n in names)
    token = created.json()["token"]
    quoted = requests.utils.quote(name, safe="")
    assert client.request("GET", f"/api/v1/clusters/{quoted}/policies", token=token).status_code == 200
    refused = client.admin("PUT", f"/clusters/{quoted}/policies/{requests.utils.quote('p; DROP', safe='')}",
                           json={"spec": {"packing": {}}})
    assert refused.status_code == 400 and "'p; DROP'" in refused.json()["error"]


def test_policy_file_errors_name_file_document_and_field(hub_server: HubProcess, cluster: str, tmp_path: Path) -> None:
    _token(hub_server, "create", cluster)
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY.replace("idleFor: 30m", "idleFor: 30m, idelBelow: 3"))
    done = hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(bad))
    assert done.returncode == 2
    assert f"{bad}: document 2 (idle-to-zero): spec.scaleToZero.idelBelow" in done.stderr
    assert "Traceback" not in done.stderr
    listed = hub_server.client().admin("GET", f"/clusters/{cluster}/policies").json()
    assert listed["policies"] == [], "a file with one bad document applies nothing"
    bad.write_text(POLICY.replace("idleFor: 30m", "idleFor: !!int 30m"))  # PyYAML raises a bare ValueError
    done = hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == (f"kubeon-gpu hub: {bad}: not valid YAML at line 13, column 47: "
                           "int value '30m' cannot be read\n"), done.stderr


def test_the_hub_serves_its_contract(hub_server: HubProcess) -> None:
    served = requests.get(hub_server.url + "/openapi.yaml", timeout=5)
    assert served.ok and served.text.startswith("openapi: 3.1")
    assert "WARNING: plain HTTP" in hub_server.log.read_text(), "serving without a cert warns"


def test_the_contract_is_valid_openapi() -> None:
    from openapi_spec_validator import validate

    from hub import contract

    validate(contract.document())


def test_cli_in_a_subprocess_prints_the_token_alone_on_the_last_line(hub_server: HubProcess, cluster: str) -> None:
    from tests.hub.conftest import run_cli

    done = run_cli("--db", hub_server.db, "token", "create", "--cluster", cluster)
    assert done.returncode == 0, done.stderr
    token = done.stdout.splitlines()[-1]
    assert token.startswith("kgo_") and " " not in token
    assert hub_server.client().request("GET", f"/api/v1/clusters/{cluster}/policies", token=token).status_code == 200
    refused = run_cli("--db", hub_server.db, "token", "rotate", "--cluster", cluster + "-missing")
    assert refused.returncode == 2 and "not found" in refused.stderr and "Traceback" not in refused.stderr


def test_a_list_file_as_kubectl_get_o_yaml_writes_applies_its_policies(hub_server: HubProcess, cluster: str,
                                                                      tmp_path: Path) -> None:
    """`kubectl get gpupolicies -o yaml` writes one `kind: List`: its GpuPolicy items are applied, as the
    webhook's --policies reads them (gpupolicy.yamlload.objects_of_kind); other items are noted, skipped."""
    _token(hub_server, "create", cluster)
    items = [doc for doc in yaml.safe_load_all(POLICY) if doc]
    exported = tmp_path / "exported.yaml"
    exported.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                        "items": [*items, {"kind": "Namespace", "metadata": {"name": "x"}}]}))
    done = hub_server.cli("policy", "apply", "--cluster", cluster, "-f", str(exported))
    assert done.returncode == 0, done.stderr
    assert f"{exported}: document 1 (Namespace): not a GpuPolicy, skipped" in done.stderr
    listed = hub_server.client().admin("GET", f"/clusters/{cluster}/policies").json()
    assert sorted(p["name"] for p in listed["policies"]) == ["idle-to-zero", "inference-sharing"]
