"""`kubeon-gpu certs`: make TLS material, and patch the CA into webhook configurations.

    kubeon-gpu certs generate --service S --namespace N --out DIR [--ip 127.0.0.1] [--dns NAME] [--reuse-ca]
    kubeon-gpu certs patch-cabundle --ca-file DIR/ca.crt [--mutating NAME] [--validating NAME] [--kubeconfig P]

`patch-cabundle` reads each named configuration and JSON-patches
clientConfig.caBundle of every webhook by index (a merge patch cannot address
list items), guarded by a `test` op on the resourceVersion it read; when
someone else wrote in between the test fails, so it reads again and retries.
Only the caBundle paths are sent, so fields this client's models do not know
survive. Errors print one line
naming the problem and exit 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from certs.material import CA_CERT, CA_KEY, generate, load_ca
from gpupolicy.k8s.names import dns_label_problem, dns_name_problem

EXIT_USAGE = 2
CONFLICT_RETRIES = 5


class CertsError(Exception):
    """A user-facing failure: the message is printed as is."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    gen = actions.add_parser("generate", help="write ca.crt, ca.key, tls.crt, tls.key for a Service")
    gen.add_argument("--service", required=True, help="Service name (first DNS SAN)")
    gen.add_argument("--namespace", required=True, help="Service namespace")
    gen.add_argument("--out", required=True, type=Path, help="directory to write the four files into")
    gen.add_argument("--ip", action="append", default=[], help="extra IP SAN (repeatable), e.g. 127.0.0.1")
    gen.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    gen.add_argument("--reuse-ca", action="store_true",
                     help="sign with the ca.crt/ca.key already in --out (rotation keeps caBundle valid)")
    patch = actions.add_parser("patch-cabundle", help="set caBundle on every webhook of the named configurations")
    patch.add_argument("--ca-file", required=True, type=Path, help="PEM CA certificate (ca.crt)")
    patch.add_argument("--mutating", action="append", default=[], help="MutatingWebhookConfiguration name")
    patch.add_argument("--validating", action="append", default=[], help="ValidatingWebhookConfiguration name")
    patch.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, else ~/.kube/config)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "generate":
            return _generate(args)
        if args.action == "patch-cabundle":
            return _patch_cabundle(args)
        raise CertsError("choose an action: generate or patch-cabundle")
    except CertsError as exc:
        print(f"kubeon-gpu certs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _generate(args: argparse.Namespace) -> int:
    for field in ("service", "namespace"):
        value = getattr(args, field)
        if not value.strip():
            raise CertsError(f"--{field} must not be empty")
        problem = dns_label_problem(value, f"a {field}")  # a Service's and a namespace's name: one DNS label
        if problem:
            raise CertsError(f"--{field} {value[:80]!r}: not a Kubernetes name ({problem})")
    for name in args.dns:
        problem = dns_name_problem(name)
        if problem:
            raise CertsError(f"--dns {name[:80]!r}: {problem}")
    for ip in args.ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise CertsError(f"--ip {ip!r} is not an IP address") from None
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise CertsError(f"--out {out} exists and is not a directory")
    ca = None
    if args.reuse_ca:
        if not (out / CA_CERT).is_file() or not (out / CA_KEY).is_file():
            raise CertsError(f"--reuse-ca: {out / CA_CERT} or {out / CA_KEY} is missing")
        try:
            ca = load_ca(out)
        except ValueError as exc:
            raise CertsError(f"--reuse-ca: cannot read the CA in {out}: {exc}") from None
    try:
        _, serving = generate(args.service, args.namespace, out, args.dns, args.ip, ca=ca)
    except OSError as exc:
        raise CertsError(f"--out {out}: {exc.strerror or exc}") from None
    print(f"wrote {out}/{{ca.crt,ca.key,tls.crt,tls.key}} (serial {serving.cert.serial_number:x})")
    return 0


def read_ca_bundle(path: Path) -> str:
    """The base64 of a PEM CA file, as caBundle wants it; errors name the file."""
    from cryptography import x509

    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise CertsError(f"--ca-file {path}: {exc.strerror or exc}") from None
    try:
        x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise CertsError(f"--ca-file {path} is not a PEM certificate") from None
    return base64.b64encode(pem).decode()


def _patch_cabundle(args: argparse.Namespace) -> int:
    if not args.mutating and not args.validating:
        raise CertsError("name at least one --mutating or --validating webhook configuration")
    bundle = read_ca_bundle(args.ca_file)
    from kubernetes import client

    from kube.config import KubeConfigError, load_api_client

    try:
        api_client = load_api_client(args.kubeconfig)
    except KubeConfigError as exc:
        raise CertsError(str(exc)) from None
    api = client.AdmissionregistrationV1Api(api_client)
    targets: list[tuple[str, str, Callable[..., Any], Callable[..., Any]]] = [
        *(("MutatingWebhookConfiguration", n, api.read_mutating_webhook_configuration,
           api.patch_mutating_webhook_configuration) for n in args.mutating),
        *(("ValidatingWebhookConfiguration", n, api.read_validating_webhook_configuration,
           api.patch_validating_webhook_configuration) for n in args.validating),
    ]
    try:
        for kind, name, read, patch in targets:
            count = set_ca_bundle(read, patch, name, bundle, kind)
            print(f"patched caBundle into {count} webhook(s) of {kind} {name}")
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
    return 0


def set_ca_bundle(read: Callable[..., Any], patch: Callable[..., Any], name: str, bundle: str,
                  kind: str = "webhook configuration") -> int:
    """JSON-patch every webhook's caBundle, guarded by a `test` of the read resourceVersion.

    Only the caBundle paths travel: the rest of the object (including fields this
    client's models do not know) is never re-sent. A changed object fails the
    test op (409/422 from the server) and is read again. Returns webhooks patched.
    """
    from kubernetes.client.exceptions import ApiException

    from kube.calls import UNREACHABLE

    for _attempt in range(CONFLICT_RETRIES):
        try:
            obj = json.loads(read(name, _preload_content=False).data)
            webhooks = obj.get("webhooks") or []
            if not webhooks:
                raise CertsError(f"{kind} {name} has no webhooks to patch")
            ops: list[dict[str, Any]] = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
            ]
            for index, webhook in enumerate(webhooks):
                if "clientConfig" not in webhook:
                    raise CertsError(f"{kind} {name}: webhooks[{index}] has no clientConfig")
                ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle})
            patch(name, ops)
            return len(webhooks)
        except ApiException as exc:
            if exc.status in (409, 422):
                continue
            if exc.status == 404:
                raise CertsError(f"{kind} {name} not found") from None
            raise CertsError(f"{kind} {name}: API error {exc.status} {exc.reason}") from None
        except UNREACHABLE as exc:
            raise CertsError(f"{kind} {name}: cannot reach the API server: {exc}") from None
    raise CertsError(f"{kind} {name}: still conflicting after {CONFLICT_RETRIES} attempts")
