"""`kubeon-gpu hub`: serve the hub, or change it from the command line (tokens, policies, approvals).

  kubeon-gpu hub serve --db URL --bind HOST:PORT [--cert FILE --key FILE]
  kubeon-gpu hub --db URL token create|rotate|revoke --cluster NAME
  kubeon-gpu hub --db URL policy apply --cluster NAME -f FILE
  kubeon-gpu hub --db URL policy delete --cluster NAME --name POLICY
  kubeon-gpu hub --db URL approval add --cluster NAME --policy P --target Kind/ns/name [--expires-in 24h]
  kubeon-gpu hub --db URL approval withdraw --cluster NAME --id ID

`token create` and `token rotate` print the new token alone on the last line
of stdout (scripts read it with `tail -n1`); it is never shown again. Every
change is audited with the actor `cli:$USER`. Refusals print one line on
stderr naming the file, document and field, and exit 2.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import re
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpupolicy.k8s.quantity import QuantityError, parse_duration
from gpupolicy.model import KIND
from gpupolicy.yamlload import documents, objects_of_kind
from hub.store import Hub, HubError, validate_policy
from serving.flags import bind_problem, file_bytes, positive_int
from serving.tls import tls_problem

DEFAULT_DB = "sqlite:///hub.db"
ADMIN_ENV = "KUBEON_HUB_ADMIN_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=os.environ.get("KUBEON_HUB_DB", DEFAULT_DB),
                        help=f"database URL (default: $KUBEON_HUB_DB or {DEFAULT_DB}; PostgreSQL: "
                             "postgresql+psycopg://user:pass@host/db)")
    sub = parser.add_subparsers(dest="hub_command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="serve the API and the web console")
    serve.add_argument("--db", dest="serve_db", default=None, help="database URL (overrides the one above)")
    serve.add_argument("--bind", default="127.0.0.1:8800", help="HOST:PORT (default 127.0.0.1:8800)")
    serve.add_argument("--cert", default=None, help="TLS certificate (PEM); without it plain HTTP, with a warning")
    serve.add_argument("--key", default=None, help="TLS private key (PEM)")
    serve.add_argument("--admin-token-file", default=None,
                       help=f"file holding the admin credential (else ${ADMIN_ENV}; else one is generated)")
    serve.add_argument("--workers", type=positive_int, default=2, help="gunicorn worker processes (default: 2)")
    serve.add_argument("--threads", type=positive_int, default=4, help="threads per worker (default: 4)")
    serve.add_argument("--summary-retention", type=positive_int, default=10_080,
                       help="cluster summary reports kept per cluster, oldest deleted first (default: 10080, "
                            "a week at one a minute)")

    token = sub.add_parser("token", help="create, rotate or revoke a cluster's token")
    token.add_argument("verb", choices=["create", "rotate", "revoke"],
                       help="create, rotate or revoke the cluster's token")
    token.add_argument("--cluster", required=True, help="the cluster's name")

    policy = sub.add_parser("policy", help="apply or delete a cluster's policies")
    policy_sub = policy.add_subparsers(dest="verb", required=True)
    apply = policy_sub.add_parser("apply", help="GpuPolicy YAML documents, validated with the CRD's model")
    apply.add_argument("--cluster", required=True, help="the cluster the policy is for")
    apply.add_argument("-f", "--file", required=True, help="GpuPolicy YAML to store on the hub")
    delete = policy_sub.add_parser("delete")
    delete.add_argument("--cluster", required=True, help="the cluster the policy is for")
    delete.add_argument("--name", required=True, help="the GpuPolicy's name")

    approval = sub.add_parser("approval", help="approve a proposal's target, or withdraw an approval")
    approval_sub = approval.add_subparsers(dest="verb", required=True)
    add = approval_sub.add_parser("add")
    add.add_argument("--cluster", required=True, help="the cluster of the policy")
    add.add_argument("--policy", required=True, help="the GpuPolicy (Approve mode) the approval is for")
    add.add_argument("--target", required=True, help="Kind/namespace/name")
    add.add_argument("--expires-in", default=None, help="duration (e.g. 24h); default: no expiry")
    withdraw = approval_sub.add_parser("withdraw")
    withdraw.add_argument("--cluster", required=True, help="the cluster of the approval")
    withdraw.add_argument("--id", required=True, help="the approval's id (as `approval add` printed it)")


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _fail(message: str) -> int:
    print(f"kubeon-gpu hub: {message}", file=sys.stderr)
    return 2


def load_policy_file(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, spec) for every GpuPolicy document; HubError naming file, document and field.

    Documents of other kinds (a Pod beside its policies) are skipped with a note on stderr: the hub
    holds policies only."""
    try:
        policies, others = objects_of_kind(documents(file_bytes(path)), KIND)
    except OSError as exc:
        raise HubError(400, f"{path}: {exc.strerror}") from None
    except ValueError as exc:
        raise HubError(400, f"{path}: {exc}") from None
    for index, kind in others:
        print(f"kubeon-gpu hub: {path}: document {index} ({kind}): not a GpuPolicy, skipped", file=sys.stderr)
    found = []
    for index, doc in policies:
        name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
        extra = set(doc) - {"apiVersion", "kind", "metadata", "spec", "status"}
        try:
            if extra:
                raise HubError(400, f"{sorted(extra)[0]}: unknown field", sorted(extra)[0])
            if not isinstance(name, str) or not name:
                raise HubError(400, "metadata.name: a GpuPolicy needs a name", "metadata.name")
            spec = validate_policy(name, doc.get("spec"))
        except HubError as exc:
            label = f" ({name})" if isinstance(name, str) and name else ""
            raise HubError(400, f"{path}: document {index}{label}: {exc.message}", exc.field) from None
        found.append((str(name), spec))
    if not found:
        raise HubError(400, f"{path}: no GpuPolicy documents")
    return found


def admin_token(args: argparse.Namespace) -> str:
    if args.admin_token_file:
        try:
            value = file_bytes(args.admin_token_file).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise HubError(400, f"--admin-token-file {args.admin_token_file}: {why}") from None
        if not value:
            raise HubError(400, f"--admin-token-file {args.admin_token_file}: empty")
        return value
    if os.environ.get(ADMIN_ENV):
        return os.environ[ADMIN_ENV]
    generated = secrets.token_urlsafe(24)
    print(f"kubeon-gpu hub: no --admin-token-file or ${ADMIN_ENV}: generated admin credential {generated}",
          file=sys.stderr)
    return generated


def _split_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise HubError(400, f"--bind {bind!r}: expected HOST:PORT, the port 1-65535")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(args: argparse.Namespace) -> int:
    from hub.app import create_app
    from hub.db import open_db
    from serving.server import serve as gunicorn_serve

    url = args.serve_db or args.db
    host, port = _split_bind(args.bind)
    if bool(args.cert) != bool(args.key):
        return _fail("--cert and --key go together")
    for flag, path in (("--cert", args.cert), ("--key", args.key)):
        if path and not os.path.isfile(path):
            return _fail(f"{flag} {path}: no such file")
    if args.cert and (problem := tls_problem(Path(args.cert), Path(args.key))):
        return _fail(f"--cert/--key: {problem}")
    if problem := bind_problem(host, port):
        return _fail(f"--bind {args.bind}: cannot listen: {problem}")
    token = admin_token(args)
    open_database(url)  # migrate once, in the master, before the workers fork
    # random, made once in the master and inherited by the workers it forks: a key derived from the admin
    # credential let anyone holding a cookie (every visitor gets one) guess the credential offline
    secret = secrets.token_hex(32)
    cert_dir = None
    if args.cert:
        cert_dir = tempfile.mkdtemp(prefix="kubeon-hub-tls-")
        os.symlink(os.path.abspath(args.cert), os.path.join(cert_dir, "tls.crt"))
        os.symlink(os.path.abspath(args.key), os.path.join(cert_dir, "tls.key"))
    else:
        print("kubeon-gpu hub: WARNING: plain HTTP (no --cert/--key): cluster tokens and the admin credential "
              "cross the network in clear", file=sys.stderr)

    def factory() -> Any:
        hub = Hub(open_db(url, upgrade=False), summary_retention=args.summary_retention)
        return create_app(hub, token, secret_key=secret, secure_cookies=cert_dir is not None)

    gunicorn_serve(factory, bind=host, port=port, cert_dir=cert_dir, workers=args.workers, threads=args.threads,
                   access_log=True)
    return 0


def open_database(url: str) -> Any:
    """`hub.db.open_db(url)` (migrated); HubError naming --db when the URL is not one SQLAlchemy reads or
    the database cannot be reached (the URL's password is never shown)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from hub.db import open_db

    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except (SQLAlchemyError, ValueError):
        hidden = re.sub(r"(//[^/:@]*:)[^/@]*@", r"\1***@", url)  # a URL that does not parse may still hold one
        raise HubError(400, f"--db {hidden!r}: not a database URL (sqlite:///FILE, "
                            "postgresql+psycopg://user:pass@host/db)") from None
    try:
        return open_db(url)
    except (SQLAlchemyError, ImportError, OSError) as exc:
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HubError(400, f"--db {shown}: cannot open the database: {first}") from None


def run(args: argparse.Namespace) -> int:
    # serve logs its requests, one line per fact (gunicorn says where it listens, hub.db which schema the
    # database holds); the other commands print their answer alone. alembic's INFO lines repeat the schema.
    level = logging.INFO if args.hub_command == "serve" else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        if args.hub_command == "serve":
            return serve(args)
        hub = Hub(open_database(args.db))
        actor = _actor()
        if args.hub_command == "token":
            if args.verb == "revoke":
                count = hub.revoke(args.cluster, actor)
                print(f"revoked {count} token(s) of cluster {args.cluster}")
                return 0
            token = hub.token_create(args.cluster, actor) if args.verb == "create" else hub.rotate(args.cluster, actor)
            print(f"new token for cluster {args.cluster} (shown once):")
            print(token)
            return 0
        if args.hub_command == "policy":
            if args.verb == "apply":
                for name, spec in load_policy_file(args.file):
                    changed = hub.apply_policy(args.cluster, name, spec, actor)
                    print(f"policy {name} {'applied' if changed else 'unchanged'}")
            else:
                hub.delete_policy(args.cluster, args.name, actor)
                print(f"policy {args.name} deleted")
            return 0
        if args.verb == "add":
            expires = None
            if args.expires_in:
                try:
                    expires = parse_duration(args.expires_in)
                except QuantityError as exc:
                    return _fail(f"--expires-in: {exc}")
            approval_id = hub.add_approval(args.cluster, args.policy, args.target, actor, expires)
            print(approval_id)
            return 0
        hub.withdraw_approval(args.cluster, args.id, actor)
        print(f"approval {args.id} withdrawn")
        return 0
    except HubError as exc:
        return _fail(exc.message)
