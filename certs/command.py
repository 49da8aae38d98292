"""`kubeon-gpu certs`: make TLS material, and patch the CA into webhook configurations.

    kubeon-gpu certs generate --service S --namespace N --out DIR [--ip 127.0.0.1] [--dns NAME] [--reuse-ca]
    kubeon-gpu certs patch-cabundle --ca-file DIR/ca.crt [--mutating NAME] [--validating NAME] [--kubeconfig P]

`patch-cabundle` reads each named configuration, sets clientConfig.caBundle
on every webhook and replaces the object with the resourceVersion it read
(a JSON merge patch cannot address list items); a 409 Conflict means someone
else wrote in between, so it reads again and retries. Errors print one line
naming the problem and exit 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from certs.material import CA_CERT, CA_KEY, generate, load_ca

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
        if not getattr(args, field).strip():
            raise CertsError(f"--{field} must not be empty")
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
           api.replace_mutating_webhook_configuration) for n in args.mutating),
        *(("ValidatingWebhookConfiguration", n, api.read_validating_webhook_configuration,
           api.replace_validating_webhook_configuration) for n in args.validating),
    ]
    try:
        for kind, name, read, replace in targets:
            count = set_ca_bundle(read, replace, name, bundle, kind)
            print(f"patched caBundle into {count} webhook(s) of {kind} {name}")
    finally:
        api_client.close()
    return 0


def set_ca_bundle(read: Callable[..., Any], replace: Callable[..., Any], name: str, bundle: str,
                  kind: str = "webhook configuration") -> int:
    """Read-modify-replace with the read resourceVersion; retry on 409. Returns webhooks patched."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    for _attempt in range(CONFLICT_RETRIES):
        try:
            obj = read(name)
            webhooks = obj.webhooks or []
            if not webhooks:
                raise CertsError(f"{kind} {name} has no webhooks to patch")
            for webhook in webhooks:
                webhook.client_config.ca_bundle = bundle
            replace(name, obj)
            return len(webhooks)
        except ApiException as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                raise CertsError(f"{kind} {name} not found") from None
            raise CertsError(f"{kind} {name}: API error {exc.status} {exc.reason}") from None
        except (HTTPError, OSError) as exc:
            raise CertsError(f"{kind} {name}: cannot reach the API server: {exc}") from None
    raise CertsError(f"{kind} {name}: still conflicting after {CONFLICT_RETRIES} attempts")
