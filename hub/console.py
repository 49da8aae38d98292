"""The web console: the self-hosted counterpart of KubeOn's "GPU > Optimizer" pages.

Server-rendered Jinja templates, plain HTML forms, no JavaScript needed. Sign
in with the admin credential; the session is a signed, HttpOnly, SameSite=Lax
cookie. Every form carries a CSRF token kept in the session and compared in
constant time; a POST without it is refused with 400. Names are shown as
text (Jinja escapes them), never interpreted.
"""

from __future__ import annotations

import functools
import hmac
import secrets
import time
from collections.abc import Callable
from typing import Any

import yaml
from flask import Blueprint, Response, abort, redirect, render_template, request, session, url_for

from gpupolicy.model import Mode
from gpupolicy.yamlload import describe_error, safe_load
from hub import summaries
from hub.api import admin_ok, figures, hub
from hub.charts import Series, line_chart
from hub.store import HubError

console = Blueprint("console", __name__, url_prefix="/console", template_folder="templates",
                    static_folder="static")
ACTOR = "admin (console)"
RANGES = {"24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0}  # what the cluster page's charts can span


# Failed sign-ins allowed per client address and window (audit entries, so every worker counts them): an
# admin credential chosen by a person (--admin-token-file) can be guessed online otherwise.
SIGN_IN_TRIES, SIGN_IN_WINDOW = 10, 60.0


def csrf_token() -> str:
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return token


@console.app_context_processor
def _template_globals() -> dict[str, Any]:
    return {"csrf_token": csrf_token, "modes": [m.value for m in Mode]}


@console.app_template_filter("money")
def _money(value: float | None) -> str:
    return "none" if value is None else f"${value:,.2f}"


@console.app_template_filter("ts")
def _timestamp(value: float | None) -> str:
    if value is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))


@console.before_request
def _check_csrf() -> None:
    if request.method == "POST":
        sent = request.form.get("csrf_token", "")
        expected = session.get("csrf")
        if not isinstance(expected, str) or not hmac.compare_digest(sent.encode(), expected.encode()):
            abort(Response(render_template("error.html", status=400,
                                           message="This form has no valid CSRF token: reload the page and "
                                                   "try again."), status=400))


def signed_in(view: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sid = session.get("sid")
        if not session.get("admin") or not isinstance(sid, str) or hub().console_session_ended(sid):
            session.clear()
            return redirect(url_for("console.sign_in", next=request.path))
        try:
            return view(*args, **kwargs)
        except HubError as exc:
            return Response(render_template("error.html", status=exc.status, message=exc.message),
                            status=exc.status)
    return wrapper


@console.get("/sign-in")
def sign_in() -> str:
    return render_template("sign_in.html", error=None, next=request.args.get("next", ""))


@console.post("/sign-in")
def sign_in_post() -> Any:
    client = request.remote_addr or "unknown"
    if hub().console_sign_ins_failed(client, SIGN_IN_WINDOW) >= SIGN_IN_TRIES:
        return Response(render_template("sign_in.html", error=f"Too many failed sign-ins from {client}: try "
                                        "again in a minute.", next=request.form.get("next", "")), status=429)
    if not admin_ok(request.form.get("credential", "")):
        hub().console_sign_in_failed(client)
        return Response(render_template("sign_in.html", error="That is not the admin credential.",
                                        next=request.form.get("next", "")), status=401)
    session.clear()
    session["admin"] = True
    session["sid"] = secrets.token_urlsafe(32)
    session["csrf"] = secrets.token_urlsafe(32)
    hub().console_signed_in(session["sid"])
    target = request.form.get("next", "")
    return redirect(target if target.startswith("/console/") else url_for("console.clusters"))


@console.post("/sign-out")
def sign_out() -> Any:
    sid = session.get("sid")
    if session.get("admin") and isinstance(sid, str):
        hub().console_signed_out(sid)  # the cookie, copied or not, is refused from now on
    session.clear()
    return redirect(url_for("console.sign_in"))


@console.get("/")
@signed_in
def clusters() -> str:
    return render_template("clusters.html", clusters=_overview(), error=None)


def _overview() -> list[tuple[Any, dict[str, Any] | None]]:
    """Each cluster with its newest summary's figures (None before its first report)."""
    return [(row, figures(row.name)) for row in hub().clusters()]


@console.post("/clusters")
@signed_in
def add_cluster() -> Any:
    name = request.form.get("name", "")
    try:
        token = hub().create_cluster(name, ACTOR)
    except HubError as exc:
        return Response(render_template("clusters.html", clusters=_overview(), error=exc.message,
                                        name=name), status=exc.status)
    return render_template("token.html", cluster=name, token=token, verb="created")


@console.get("/clusters/<cluster>")
@signed_in
def cluster(cluster: str) -> str:
    row = hub().cluster_row(cluster)
    _, policies, approvals = hub().policies(cluster)
    listed = []
    for item in policies:
        spec = item["spec"]
        kind = next((k for k in ("sharing", "scaleToZero", "packing", "typeFit", "capacity", "guardrail")
                     if k in spec), "?")
        listed.append({"name": item["name"], "mode": spec.get("mode") or "default", "kind": kind})
    span = request.args.get("range", "24h")
    if span not in RANGES:
        raise HubError(400, f"range {span[:20]!r}: one of {', '.join(RANGES)}", "range")
    points = summaries.history(hub(), cluster, since=hub().clock() - RANGES[span])
    latest = summaries.latest(hub(), cluster)
    price = latest["pricePerGpuHour"] if latest else None
    proposals = [{**p, "saving": (p["estimatedGpuHoursPerMonth"] * price
                                  if price is not None and "estimatedGpuHoursPerMonth" in p else None)}
                 for p in hub().pending_proposals(cluster)]
    return render_template("cluster.html", row=row, policies=listed, approvals=approvals, proposals=proposals,
                           actions=hub().actions(cluster, limit=50), latest=latest, figures=figures(cluster),
                           charts=_charts(points), span=span, ranges=list(RANGES))


def _charts(points: list[summaries.Point]) -> list[Any]:
    """The cluster page's charts over the stored history: GPUs allocated and idle, cost per hour, savings."""
    idle = [(p.time, float(p.idle)) for p in points if p.idle is not None]
    charts = [
        ("chart-gpus", "GPUs: total, allocated, idle", "", [
            Series("GPUs", "s-total", [(p.time, float(p.gpus)) for p in points]),
            Series("Allocated", "s-allocated", [(p.time, float(p.allocated)) for p in points]),
            Series("Idle (DCGM)", "s-idle", idle)]),
        ("chart-cost", "Cost per hour of the GPU nodes", "$",
         [Series("Cost per hour", "s-cost", [(p.time, p.cost_per_hour) for p in points])]),
        ("chart-savings", "Savings per hour of the actions applied (est.)", "$",
         [Series("Saved per hour", "s-savings", [(p.time, p.savings_rate) for p in points])]),
    ]
    now = hub().clock()
    return [(title, line_chart(chart_id, title, series, unit, until=now)) for chart_id, title, unit, series in charts]


@console.get("/clusters/<cluster>/<any(rotate, revoke):verb>")
@signed_in
def confirm(cluster: str, verb: str) -> str:
    hub().cluster_row(cluster)
    return render_template("confirm.html", cluster=cluster, verb=verb)


@console.post("/clusters/<cluster>/rotate")
@signed_in
def rotate(cluster: str) -> str:
    return render_template("token.html", cluster=cluster, token=hub().rotate(cluster, ACTOR), verb="rotated")


@console.post("/clusters/<cluster>/token")
@signed_in
def new_token(cluster: str) -> str:
    hub().cluster_row(cluster)
    return render_template("token.html", cluster=cluster, token=hub().token_create(cluster, ACTOR), verb="created")


@console.post("/clusters/<cluster>/revoke")
@signed_in
def revoke(cluster: str) -> Any:
    hub().revoke(cluster, ACTOR)
    return redirect(url_for("console.cluster", cluster=cluster))


def _spec_text(spec: dict[str, Any]) -> str:
    body = {k: v for k, v in spec.items() if k != "mode"}
    return yaml.safe_dump(body, sort_keys=False, default_flow_style=False) if body else ""


@console.get("/clusters/<cluster>/policies/new")
@signed_in
def new_policy(cluster: str) -> str:
    hub().cluster_row(cluster)
    return render_template("policy.html", cluster=cluster, name="", new=True, mode="Recommend",
                           spec_text="sharing:\n  strategy: MIG\n", errors={})


@console.get("/clusters/<cluster>/policies/<policy>")
@signed_in
def policy(cluster: str, policy: str) -> str:
    _, policies, _ = hub().policies(cluster)
    found = next((p for p in policies if p["name"] == policy), None)
    if found is None:
        raise HubError(404, f"policy {policy!r} not found in cluster {cluster!r}")
    return render_template("policy.html", cluster=cluster, name=policy, new=False,
                           mode=found["spec"].get("mode") or "", spec_text=_spec_text(found["spec"]), errors={})


@console.post("/clusters/<cluster>/policies")
@signed_in
def save_policy(cluster: str) -> Any:
    name = request.form.get("name", "").strip()
    mode = request.form.get("mode", "")
    text = request.form.get("spec", "")
    new = request.form.get("new") == "1"
    errors: dict[str, str] = {}
    spec: Any = None
    try:
        spec = safe_load(text) if text.strip() else {}
        if not isinstance(spec, dict):
            errors["spec"] = "the spec must be a YAML mapping (key: value lines)"
    except yaml.YAMLError as exc:
        errors["spec"] = describe_error(exc)
    if not errors:
        if mode:
            spec = {"mode": mode, **spec}
        try:
            hub().apply_policy(cluster, name, spec, ACTOR)
        except HubError as exc:
            field = exc.field or ""
            key = "name" if field == "metadata.name" else "mode" if field == "spec.mode" else "spec"
            errors[key] = exc.message
    if errors:
        return Response(render_template("policy.html", cluster=cluster, name=name, new=new, mode=mode,
                                        spec_text=text, errors=errors), status=400)
    return redirect(url_for("console.cluster", cluster=cluster))


@console.post("/clusters/<cluster>/policies/<policy>/mode")
@signed_in
def set_mode(cluster: str, policy: str) -> Any:
    _, policies, _ = hub().policies(cluster)
    found = next((p for p in policies if p["name"] == policy), None)
    if found is None:
        raise HubError(404, f"policy {policy!r} not found in cluster {cluster!r}")
    hub().apply_policy(cluster, policy, {**found["spec"], "mode": request.form.get("mode", "")}, ACTOR)
    return redirect(url_for("console.cluster", cluster=cluster))


@console.post("/clusters/<cluster>/policies/<policy>/delete")
@signed_in
def delete_policy(cluster: str, policy: str) -> Any:
    hub().delete_policy(cluster, policy, ACTOR)
    return redirect(url_for("console.cluster", cluster=cluster))


@console.post("/clusters/<cluster>/approvals")
@signed_in
def approve(cluster: str) -> Any:
    hub().add_approval(cluster, request.form.get("policy", ""), request.form.get("target", ""), ACTOR)
    return redirect(url_for("console.cluster", cluster=cluster))


@console.post("/clusters/<cluster>/approvals/<approval_id>/withdraw")
@signed_in
def withdraw(cluster: str, approval_id: str) -> Any:
    hub().withdraw_approval(cluster, approval_id, ACTOR)
    return redirect(url_for("console.cluster", cluster=cluster))


@console.get("/audit")
@signed_in
def audit() -> str:
    return render_template("audit.html", entries=hub().audit())
