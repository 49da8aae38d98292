"""The hub's HTTP API: the cluster endpoints (bearer cluster token) and the admin endpoints (admin credential).

Every request body is capped and checked against hub/openapi.yaml before the
store sees it; every refusal is `{"error": ..., "field": ...}` with a 4xx
status, never a traceback. An oversize body is a 400 too, as all bad input is, with
the limit in the message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, current_app, request

from hub import contract, summaries
from hub.store import Hub, HubError

MAX_BODY_BYTES = 1024 * 1024

api = Blueprint("api", __name__)


def hub() -> Hub:
    found: Hub = current_app.extensions["kubeon_hub"]
    return found


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json", headers=headers)


def error_response(exc: HubError) -> Response:
    return _json({"error": exc.message, "field": exc.field}, exc.status)


def _not_json(name: str) -> Any:
    """Python's json module reads NaN and Infinity; JSON has neither."""
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is past the largest number the hub stores")
    return value


def read_body(schema: str) -> Any:
    """The request's JSON body, checked against `schema`; HubError(400) naming the problem."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise HubError(400, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES} bytes")
    data = request.stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        raise HubError(400, f"request body is over the limit of {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(data, parse_constant=_not_json, parse_float=_finite)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubError(400, f"malformed JSON: {exc}") from None
    except ValueError as exc:  # NaN, Infinity, or a number past a float's range
        raise HubError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise HubError(400, "malformed JSON: nested too deeply") from None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # "\ud800": JSON may escape half a UTF-16 pair; no stored text can hold it
        raise HubError(400, "malformed JSON: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    except RecursionError:
        raise HubError(400, "malformed JSON: nested too deeply") from None
    found = contract.problem(schema, body)
    if found is not None:
        raise HubError(400, found[1], found[0])
    return body


def epoch_seconds(value: float | str, field: str) -> float:
    """An action's `time` as unix seconds: a number as it is, an RFC 3339 date-time with an offset
    converted; HubError(400) naming `field` for a string that is neither."""
    if not isinstance(value, str):
        return float(value)
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise HubError(400, f"{field}: {value[:60]!r} is neither unix seconds (a number) nor an RFC 3339 date-time "
                            "with an offset (2026-05-01T12:00:00Z)", field)
    return parsed.timestamp()


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def admin_ok(candidate: str | None) -> bool:
    expected: str = current_app.config["KUBEON_ADMIN_TOKEN"]
    return candidate is not None and hmac.compare_digest(candidate.encode(), expected.encode())


def _admin() -> str:
    """The actor name for the audit log; 401 without the admin credential."""
    if not admin_ok(_bearer()):
        raise HubError(401, "admin credential required")
    return "admin (api)"


# -- the cluster side ------------------------------------------------------------
@api.get("/api/v1/clusters/<cluster>/policies")
def cluster_policies(cluster: str) -> Response:
    hub().authenticate(cluster, _bearer())
    revision, policies, approvals = hub().policies(cluster)
    body = {"revision": revision, "policies": policies, "approvals": approvals}
    text = json.dumps(body, sort_keys=True)
    etag = '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'
    hub().record_poll(cluster, "ok")
    if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        return Response(status=304, headers={"ETag": etag})
    return Response(text, mimetype="application/json", headers={"ETag": etag})


@api.post("/api/v1/clusters/<cluster>/actions")
def cluster_actions(cluster: str) -> Response:
    hub().authenticate(cluster, _bearer())
    key = request.headers.get("Idempotency-Key", "").strip()
    if not key or len(key) > 128:
        raise HubError(400, "Idempotency-Key header required (1-128 characters)", "Idempotency-Key")
    body = read_body("ActionBatch")
    actions = [{**item, "time": epoch_seconds(item["time"], f"actions.{i}.time")}
               for i, item in enumerate(body["actions"])]
    accepted, duplicate = hub().record_actions(cluster, key, actions)
    return _json({"accepted": accepted, "duplicate": duplicate})


@api.post("/api/v1/clusters/<cluster>/summaries")
def cluster_summaries(cluster: str) -> Response:
    """Summary reports (one per poll): each stored once by its id, so a retried batch is stored once."""
    hub().authenticate(cluster, _bearer())
    body = read_body("SummaryBatch")
    accepted, duplicate = summaries.record(hub(), cluster, body["summaries"])
    return _json({"accepted": accepted, "duplicate": duplicate})


# -- the admin side --------------------------------------------------------------
def figures(name: str) -> dict[str, Any] | None:
    """The newest report's figures and the month's savings (the overview's columns), None before a report."""
    points = summaries.history(hub(), name, limit=1)
    if not points:
        return None
    last = points[-1]
    return {"time": last.time, "gpus": last.gpus, "allocatedGpus": last.allocated, "idleGpus": last.idle,
            "pendingGpuPods": last.pending, "costPerHour": last.cost_per_hour,
            "savedThisMonth": round(summaries.saved_this_month(hub(), name), 2)}


@api.get("/api/v1/admin/clusters")
def admin_clusters() -> Response:
    _admin()
    rows = [{"name": r.name, "state": r.state, "lastPoll": r.last_poll_at, "lastPollResult": r.last_poll_result,
             "revision": r.revision, "summary": figures(r.name)} for r in hub().clusters()]
    return _json({"clusters": rows})


@api.get("/api/v1/admin/clusters/<cluster>/summaries")
def admin_summaries(cluster: str) -> Response:
    _admin()
    text = request.args.get("limit")
    if text is not None and (not text.isdigit() or int(text) < 1):
        raise HubError(400, f"limit {text[:40]!r}: a whole number of at least 1", "limit")
    points = summaries.history(hub(), cluster, int(text) if text else None)
    return _json({"cluster": cluster, "latest": summaries.latest(hub(), cluster),
                  "savedThisMonth": round(summaries.saved_this_month(hub(), cluster), 2),
                  "points": [point_json(p) for p in points]})


def point_json(p: summaries.Point) -> dict[str, Any]:
    return {"time": p.time, "gpus": p.gpus, "allocatedGpus": p.allocated, "idleGpus": p.idle,
            "pendingGpuPods": p.pending, "actionsApplied": p.actions_applied, "costPerHour": p.cost_per_hour,
            "savingsPerHour": p.savings_per_hour,
            "savingsRate": p.savings_rate}


@api.post("/api/v1/admin/clusters")
def admin_add_cluster() -> Response:
    actor = _admin()
    body = read_body("ClusterCreate")
    token = hub().create_cluster(body["name"], actor)
    return _json({"cluster": body["name"], "token": token}, 201)


@api.post("/api/v1/admin/clusters/<cluster>/token")
def admin_new_token(cluster: str) -> Response:
    """A token for a cluster that has none live (after a revocation)."""
    actor = _admin()
    hub().cluster_row(cluster)
    return _json({"cluster": cluster, "token": hub().token_create(cluster, actor)}, 201)


@api.post("/api/v1/admin/clusters/<cluster>/token/rotate")
def admin_rotate(cluster: str) -> Response:
    token = hub().rotate(cluster, _admin())
    return _json({"cluster": cluster, "token": token})


@api.post("/api/v1/admin/clusters/<cluster>/token/revoke")
def admin_revoke(cluster: str) -> Response:
    hub().revoke(cluster, _admin())
    return _json({"ok": True})


@api.get("/api/v1/admin/clusters/<cluster>/policies")
def admin_policies(cluster: str) -> Response:
    _admin()
    revision, policies, approvals = hub().policies(cluster)
    return _json({"revision": revision, "policies": policies, "approvals": approvals})


@api.put("/api/v1/admin/clusters/<cluster>/policies/<policy>")
def admin_put_policy(cluster: str, policy: str) -> Response:
    actor = _admin()
    body = read_body("PolicyPut")
    changed = hub().apply_policy(cluster, policy, body["spec"], actor)
    revision, _, _ = hub().policies(cluster)
    return _json({"name": policy, "changed": changed, "revision": revision})


@api.delete("/api/v1/admin/clusters/<cluster>/policies/<policy>")
def admin_delete_policy(cluster: str, policy: str) -> Response:
    hub().delete_policy(cluster, policy, _admin())
    return _json({"ok": True})


@api.post("/api/v1/admin/clusters/<cluster>/approvals")
def admin_add_approval(cluster: str) -> Response:
    actor = _admin()
    body = read_body("ApprovalCreate")
    approval_id = hub().add_approval(cluster, body["policy"], body["target"], actor, body.get("expiresInSeconds"))
    return _json({"id": approval_id}, 201)


@api.delete("/api/v1/admin/clusters/<cluster>/approvals/<approval_id>")
def admin_withdraw(cluster: str, approval_id: str) -> Response:
    hub().withdraw_approval(cluster, approval_id, _admin())
    return _json({"ok": True})


@api.get("/api/v1/admin/clusters/<cluster>/actions")
def admin_actions(cluster: str) -> Response:
    _admin()
    return _json({"actions": hub().actions(cluster)})


@api.get("/api/v1/admin/audit")
def admin_audit() -> Response:
    _admin()
    return _json({"entries": hub().audit()})


@api.get("/metrics")
def metrics() -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    from hub.metrics import exposition

    _admin()
    return Response(exposition(hub()), headers={"Content-Type": CONTENT_TYPE_LATEST})


@api.get("/openapi.yaml")
def openapi() -> Response:
    return Response(contract.OPENAPI_FILE.read_bytes(), mimetype="application/yaml")
