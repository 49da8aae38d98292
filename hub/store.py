"""The hub's operations, one transaction each: what the CLI, the admin API and the console call.

Every change to tokens, policies and approvals writes an audit row in the
same transaction, so the audit log cannot miss one. Tokens are random,
shown once, and stored as SHA-256 digests. Rotation keeps the previous token
valid until the new one is first used, or for `ROTATION_OVERLAP` seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpupolicy.model import API_VERSION, KIND, parse_policy
from hub.db import Action, ActionBatch, Approval, Audit, Cluster, Policy, Token

ROTATION_OVERLAP = 24 * 3600.0
CONNECTED_WITHIN = 300.0  # a cluster that polled this recently shows as connected
TOKEN_PREFIX = "kgo_"
# Policy names become GpuPolicy object names in the cluster: a DNS-1123 subdomain.
POLICY_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


MAX_APPROVAL_SECONDS = 100 * 365 * 86400  # an approval's longest expiry


class HubError(Exception):
    """A refused operation: `status` is the HTTP status, `message` names the field or object."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_cluster_name(name: str) -> str:
    """Cluster names are free text (stored and shown literally) but not empty, not '/', printable."""
    if not isinstance(name, str) or not name.strip():
        raise HubError(400, "cluster name must be a non-empty string", "name")
    if len(name) > 253 or "/" in name or not name.isprintable():
        raise HubError(400, f"cluster name {name!r}: at most 253 printable characters, no '/'", "name")
    if name in (".", ".."):  # URL clients remove dot segments: /clusters/../policies is /policies
        raise HubError(400, f"cluster name {name!r}: a URL path cannot hold it", "name")
    return name


def validate_policy(name: str, spec: Any) -> dict[str, Any]:
    """The spec as given, once the CRD's model accepts it; HubError naming the field otherwise."""
    if not isinstance(name, str) or len(name) > 253 or not POLICY_NAME.match(name):
        raise HubError(400, f"policy name {name!r} is not a Kubernetes object name "
                            "(lowercase letters, digits, '-' and '.')", "metadata.name")
    if not isinstance(spec, dict):
        raise HubError(400, "spec must be an object", "spec")
    try:
        parse_policy({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise HubError(400, f"{where}: {first['msg']}", where) from None
    return spec


@dataclass
class ClusterRow:
    name: str
    state: str  # connected | disconnected | never polled | not polling
    last_poll_at: float | None
    last_poll_result: str | None
    revision: int
    token_hint: str | None


class Hub:
    """The hub's state behind a session factory; `clock` is injectable (token overlap in tests)."""

    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], float] = time.time,
                 summary_retention: int = 10_080) -> None:
        self.sessions = sessions
        self.clock = clock
        self.summary_retention = summary_retention  # cluster summary reports kept per cluster (hub/summaries.py)

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    # -- clusters and tokens --------------------------------------------------
    def _cluster(self, session: Session, name: str) -> Cluster:
        cluster = session.scalar(select(Cluster).where(Cluster.name == name))
        if cluster is None:
            raise HubError(404, f"cluster {name!r} not found")
        return cluster

    def _audit(self, session: Session, actor: str, cluster: str | None, verb: str, detail: str = "") -> None:
        session.add(Audit(at=self.clock(), actor=actor, cluster=cluster, verb=verb, detail=detail))

    def _new_token(self, session: Session, cluster: Cluster) -> str:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        session.add(Token(cluster_id=cluster.id, digest=digest(token), hint=token[:10], state="active",
                          created_at=self.clock()))
        return token

    def create_cluster(self, name: str, actor: str) -> str:
        """A new cluster and its first token (returned once, never stored in clear)."""
        check_cluster_name(name)
        try:
            with self._tx() as session:
                if session.scalar(select(Cluster).where(Cluster.name == name)) is not None:
                    raise HubError(409, f"cluster {name!r} already exists")
                cluster = Cluster(name=name, created_at=self.clock(), revision=0)
                session.add(cluster)
                session.flush()
                token = self._new_token(session, cluster)
                self._audit(session, actor, name, "token.create")
                return token
        except IntegrityError:
            raise HubError(409, f"cluster {name!r} already exists") from None

    def token_create(self, name: str, actor: str) -> str:
        """`token create`: a new cluster with its token, or a fresh token for a cluster with none live."""
        with self._tx() as session:
            cluster = session.scalar(select(Cluster).where(Cluster.name == name))
            if cluster is not None:
                live = [t for t in self._tokens(session, cluster) if t.state in ("active", "previous")]
                if live:
                    raise HubError(409, f"cluster {name!r} has a token: rotate or revoke it")
                token = self._new_token(session, cluster)
                self._audit(session, actor, name, "token.create")
                return token
        return self.create_cluster(name, actor)

    def _tokens(self, session: Session, cluster: Cluster) -> list[Token]:
        return list(session.scalars(select(Token).where(Token.cluster_id == cluster.id)))

    def rotate(self, name: str, actor: str) -> str:
        """A new active token; the old one stays valid until the new one is used, or 24 h."""
        with self._tx() as session:
            cluster = self._cluster(session, name)
            tokens = self._tokens(session, cluster)
            if not any(t.state == "active" for t in tokens):
                raise HubError(409, f"cluster {name!r} has no active token to rotate: create one")
            now = self.clock()
            for token in tokens:
                if token.state == "previous":  # a second rotation ends the first overlap
                    token.state = "revoked"
                elif token.state == "active":
                    token.state, token.expires_at = "previous", now + ROTATION_OVERLAP
            new = self._new_token(session, cluster)
            self._audit(session, actor, name, "token.rotate")
            return new

    def revoke(self, name: str, actor: str) -> int:
        """Revoke every live token of the cluster; returns how many."""
        with self._tx() as session:
            cluster = self._cluster(session, name)
            count = 0
            for token in self._tokens(session, cluster):
                if token.state != "revoked":
                    token.state = "revoked"
                    count += 1
            self._audit(session, actor, name, "token.revoke", f"{count} token(s)")
            return count

    def authenticate(self, name: str, bearer: str | None) -> Cluster:
        """The cluster a token may act for: 401 without a valid token, 403 on another cluster's path.

        A revoked token's poll is remembered on its cluster (the console shows it disconnected).
        """
        if not bearer:
            raise HubError(401, "missing bearer token")
        refusal: HubError | None = None
        with self._tx() as session:
            token = session.scalar(select(Token).where(Token.digest == digest(bearer)))
            if token is None:
                raise HubError(401, "unknown token")
            owner = session.get(Cluster, token.cluster_id)
            assert owner is not None
            now = self.clock()
            if token.state == "previous" and token.expires_at is not None and now >= token.expires_at:
                token.state = "revoked"
            if token.state == "revoked":
                owner.last_poll_at, owner.last_poll_result = now, "revoked"
                refusal = HubError(401, "token revoked")
            elif owner.name != name:
                raise HubError(403, "this token belongs to another cluster")
            elif token.state == "active" and token.first_used_at is None:
                token.first_used_at = now
                for other in self._tokens(session, owner):
                    if other.state == "previous":
                        other.state = "revoked"
            session.flush()
            session.expunge(owner)
        if refusal is not None:
            raise refusal
        return owner

    def record_poll(self, name: str, result: str) -> None:
        with self._tx() as session:
            cluster = self._cluster(session, name)
            cluster.last_poll_at, cluster.last_poll_result = self.clock(), result

    def clusters(self) -> list[ClusterRow]:
        with self._tx() as session:
            rows = []
            now = self.clock()
            for cluster in session.scalars(select(Cluster).order_by(Cluster.name)):
                tokens = self._tokens(session, cluster)
                live = [t for t in tokens if t.state == "active"
                        or (t.state == "previous" and (t.expires_at or 0) > now)]
                active = next((t for t in tokens if t.state == "active"), None)
                if not live:
                    state = "disconnected"
                elif cluster.last_poll_at is None:
                    state = "never polled"
                elif cluster.last_poll_result == "ok" and now - cluster.last_poll_at <= CONNECTED_WITHIN:
                    state = "connected"
                else:
                    state = "not polling"
                rows.append(ClusterRow(cluster.name, state, cluster.last_poll_at, cluster.last_poll_result,
                                       cluster.revision, active.hint if active else None))
            return rows

    def cluster_row(self, name: str) -> ClusterRow:
        for row in self.clusters():
            if row.name == name:
                return row
        raise HubError(404, f"cluster {name!r} not found")

    # -- policies and approvals -----------------------------------------------
    def policies(self, name: str) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
        """(revision, [{name, spec}], live approvals [{policy, target, id, expires}])."""
        with self._tx() as session:
            cluster = self._cluster(session, name)
            policies = [{"name": p.name, "spec": json.loads(p.spec)} for p in session.scalars(
                select(Policy).where(Policy.cluster_id == cluster.id).order_by(Policy.name))]
            now = self.clock()
            approvals = []
            for a in session.scalars(select(Approval).where(Approval.cluster_id == cluster.id,
                                                            Approval.withdrawn.is_(False)).order_by(Approval.id)):
                if a.expires_at is not None and a.expires_at <= now:
                    continue
                approvals.append({"policy": a.policy, "target": a.target, "id": a.id,
                                  "expires": _rfc3339(a.expires_at) if a.expires_at is not None else None})
            return cluster.revision, policies, approvals

    def apply_policy(self, name: str, policy: str, spec: Any, actor: str) -> bool:
        """Create or replace one policy (validated with the CRD's model). Returns whether it changed."""
        wire = validate_policy(policy, spec)
        text = json.dumps(wire, sort_keys=True)
        with self._tx() as session:
            cluster = self._cluster(session, name)
            row = session.scalar(select(Policy).where(Policy.cluster_id == cluster.id, Policy.name == policy))
            if row is not None and row.spec == text:
                return False
            if row is None:
                session.add(Policy(cluster_id=cluster.id, name=policy, spec=text, updated_at=self.clock()))
            else:
                row.spec, row.updated_at = text, self.clock()
            cluster.revision += 1
            self._audit(session, actor, name, "policy.apply", f"{policy}: {text}")
            return True

    def delete_policy(self, name: str, policy: str, actor: str) -> None:
        with self._tx() as session:
            cluster = self._cluster(session, name)
            row = session.scalar(select(Policy).where(Policy.cluster_id == cluster.id, Policy.name == policy))
            if row is None:
                raise HubError(404, f"policy {policy!r} not found in cluster {name!r}")
            session.delete(row)
            # its approvals go with it: a policy created again under the name starts with none
            for approval in session.scalars(select(Approval).where(
                    Approval.cluster_id == cluster.id, Approval.policy == policy, Approval.withdrawn.is_(False))):
                approval.withdrawn = True
            cluster.revision += 1
            self._audit(session, actor, name, "policy.delete", policy)

    def add_approval(self, name: str, policy: str, target: str, actor: str,
                     expires_in: float | None = None) -> str:
        parts = target.split("/") if isinstance(target, str) else []
        if len(parts) != 3 or not all(parts):
            raise HubError(400, f"target {str(target)[:100]!r} is not Kind/namespace/name", "target")
        if len(target) > 800:  # the column's length (hub/db.py), which PostgreSQL enforces: the console's form
            raise HubError(400, f"target: {len(target)} characters, at most 800", "target")
        if expires_in is not None and not 0 < expires_in <= MAX_APPROVAL_SECONDS:
            # past this, the expiry is no date the polls can write (time.gmtime overflows)
            raise HubError(400, f"expiresInSeconds {expires_in!r}: more than 0 and at most {MAX_APPROVAL_SECONDS} "
                                "(100 years); leave it out for no expiry", "expiresInSeconds")
        with self._tx() as session:
            cluster = self._cluster(session, name)
            if session.scalar(select(Policy).where(Policy.cluster_id == cluster.id, Policy.name == policy)) is None:
                raise HubError(404, f"policy {policy!r} not found in cluster {name!r}")
            approval_id = uuid.uuid4().hex
            expires = self.clock() + expires_in if expires_in is not None else None
            session.add(Approval(id=approval_id, cluster_id=cluster.id, policy=policy, target=target,
                                 created_at=self.clock(), expires_at=expires, withdrawn=False))
            cluster.revision += 1
            self._audit(session, actor, name, "approval.add", f"{policy} {target} id={approval_id}")
            return approval_id

    def withdraw_approval(self, name: str, approval_id: str, actor: str) -> None:
        with self._tx() as session:
            cluster = self._cluster(session, name)
            row = session.get(Approval, approval_id)
            if row is None or row.cluster_id != cluster.id:
                raise HubError(404, f"approval {approval_id!r} not found in cluster {name!r}")
            if row.withdrawn:  # nothing changes: no new revision, no second audit entry
                return
            row.withdrawn = True
            cluster.revision += 1
            self._audit(session, actor, name, "approval.withdraw", f"{row.policy} {row.target} id={approval_id}")

    # -- actions and audit ----------------------------------------------------
    def record_actions(self, name: str, key: str, actions: list[dict[str, Any]]) -> tuple[int, bool]:
        """Store a batch once: (actions newly stored, whether the key was seen before).

        Two requests with the same key, or the same action id, at the same time: the second insert
        breaks a unique constraint and its transaction rolls back; it is then read again, and answers
        as a repeat does (the duplicate, or the actions the first one did not store)."""
        for attempt in range(3):
            try:
                return self._record_actions(name, key, actions)
            except IntegrityError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _record_actions(self, name: str, key: str, actions: list[dict[str, Any]]) -> tuple[int, bool]:
        with self._tx() as session:
            cluster = self._cluster(session, name)
            seen = session.scalar(select(ActionBatch).where(ActionBatch.cluster_id == cluster.id,
                                                            ActionBatch.key == key))
            if seen is not None:
                return seen.accepted, True
            known = set(session.scalars(select(Action.action_id).where(
                Action.cluster_id == cluster.id, Action.action_id.in_([a["id"] for a in actions]))))
            accepted = 0
            now = self.clock()
            for item in actions:
                if item["id"] in known:
                    continue
                known.add(item["id"])
                session.add(Action(cluster_id=cluster.id, action_id=item["id"], policy=item["policy"],
                                   target=item["target"], action=item["action"], mode=item["mode"],
                                   result=item["result"], time=item["time"], received_at=now,
                                   gpu_hours_per_month=item.get("estimatedGpuHoursPerMonth")))
                accepted += 1
            session.add(ActionBatch(cluster_id=cluster.id, key=key, accepted=accepted, received_at=now))
            return accepted, False

    def actions(self, name: str, limit: int = 100) -> list[dict[str, Any]]:
        with self._tx() as session:
            cluster = self._cluster(session, name)
            rows = session.scalars(select(Action).where(Action.cluster_id == cluster.id)
                                   .order_by(Action.time.desc(), Action.id.desc()).limit(limit))
            return [{"id": r.action_id, "policy": r.policy, "target": r.target, "action": r.action,
                     "mode": r.mode, "result": r.result, "time": r.time,
                     **({"estimatedGpuHoursPerMonth": r.gpu_hours_per_month}
                        if r.gpu_hours_per_month is not None else {})} for r in rows]

    def pending_proposals(self, name: str) -> list[dict[str, Any]]:
        """Proposals the optimizer reported (result `proposed`) whose target is neither approved nor applied."""
        _, _, approvals = self.policies(name)
        approved = {(a["policy"], a["target"]): a["id"] for a in approvals}
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for row in reversed(self.actions(name, limit=1000)):
            latest[(row["policy"], row["target"])] = row
        pending = []
        for (policy, target), row in sorted(latest.items()):
            if row["result"] == "proposed":
                pending.append({**row, "approval": approved.get((policy, target))})
        return pending

    # Console sessions: the cookie holds a random session id; sign-in and sign-out are audit entries naming
    # its digest, so a copied cookie stops working at sign-out on every worker (the cookie itself is only
    # signed, and its signature stays valid until it expires).
    def console_signed_in(self, session_id: str) -> None:
        with self._tx() as session:
            self._audit(session, "admin (console)", None, "console sign-in", _digest(session_id))

    def console_signed_out(self, session_id: str) -> None:
        with self._tx() as session:
            self._audit(session, "admin (console)", None, "console sign-out", _digest(session_id))

    def console_sign_in_failed(self, client: str) -> None:
        with self._tx() as session:
            self._audit(session, f"console ({client[:200]})", None, "console sign-in failed")

    def console_sign_ins_failed(self, client: str, seconds: float) -> int:
        """Failed console sign-ins from `client` (its address) within the last `seconds`."""
        with self._tx() as session:
            return int(session.scalar(select(func.count()).select_from(Audit).where(
                Audit.verb == "console sign-in failed", Audit.actor == f"console ({client[:200]})",
                Audit.at >= self.clock() - seconds)) or 0)

    def console_session_ended(self, session_id: str) -> bool:
        with self._tx() as session:
            return session.scalar(select(Audit.id).where(Audit.verb == "console sign-out",
                                                         Audit.detail == _digest(session_id)).limit(1)) is not None

    def audit(self, limit: int = 200) -> list[dict[str, Any]]:
        with self._tx() as session:
            rows = session.scalars(select(Audit).order_by(Audit.id.desc()).limit(limit))
            return [{"at": r.at, "actor": r.actor, "cluster": r.cluster, "verb": r.verb, "detail": r.detail}
                    for r in rows]


def _digest(session_id: str) -> str:
    return "session " + hashlib.sha256(session_id.encode()).hexdigest()[:16]


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
