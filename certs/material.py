"""TLS material for the webhook and extender: a private CA and a serving cert it signs.

Why our own CA: kube-apiserver calls webhooks over TLS and verifies them
against the caBundle in the webhook configuration, so an install needs a CA
it controls (cert-manager does the same job when present). Keys are ECDSA
P-256: small, fast handshakes, accepted by every Kubernetes and Go TLS stack.

The serving cert carries the DNS names a Service is reached by
(`S`, `S.N`, `S.N.svc`, `S.N.svc.cluster.local`) plus optional extra DNS or
IP SANs (127.0.0.1 for tests and local runs). Files follow the
kubernetes.io/tls Secret layout (`tls.crt`, `tls.key`) plus `ca.crt` and
`ca.key`; keys are written 0600 and every file is replaced atomically, so a
server reloading on change never reads a half-written pair.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
# Tolerate clock skew between the issuing host and the API server.
BACKDATE = dt.timedelta(minutes=5)

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by inside the cluster."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def generate_ca(common_name: str = "kubeon-gpu-optimizer-ca", now: dt.datetime | None = None) -> Issued:
    """A self-signed CA valid for 10 years."""
    now = now or _now()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                          crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def issue_serving_cert(
    ca: Issued,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    now: dt.datetime | None = None,
) -> Issued:
    """A serving cert for `dns_names` + `ip_addresses`, signed by `ca`, valid for 1 year."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    now = now or _now()
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    common_name = dns_names[0] if dns_names else ip_addresses[0]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + SERVING_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False,
                          crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert, key)


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` in one rename, created with `mode` from the start."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_material(out: Path, ca: Issued, serving: Issued) -> None:
    """Write ca.crt, ca.key, tls.crt, tls.key into `out` (keys 0600). The key goes first:
    a watcher that triggers on tls.crt then always finds the matching key."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / CA_KEY, ca.key_pem(), 0o600)
    write_atomically(out / CA_CERT, ca.cert_pem())
    write_atomically(out / TLS_KEY, serving.key_pem(), 0o600)
    write_atomically(out / TLS_CERT, serving.cert_pem())


def load_ca(directory: Path) -> Issued:
    """Read ca.crt + ca.key back, e.g. to issue a rotated serving cert from the same CA."""
    cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / CA_KEY} is not an ECDSA key")
    # what issued certificates would need to verify: kube-apiserver would refuse the webhook's TLS otherwise
    if key.public_key() != cert.public_key():
        raise ValueError(f"{directory / CA_KEY} is not the key of {directory / CA_CERT}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{directory / CA_CERT} is not a CA certificate (no basicConstraints CA:TRUE)")
    return Issued(cert, key)


def generate(
    service: str,
    namespace: str,
    out: Path,
    extra_dns: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    ca: Issued | None = None,
) -> tuple[Issued, Issued]:
    """Make (or reuse) a CA, issue the Service's serving cert, write all four files into `out`."""
    ca = ca or generate_ca()
    dns = [*service_dns_names(service, namespace), *extra_dns]
    serving = issue_serving_cert(ca, dns, ip_addresses)
    write_material(out, ca, serving)
    return ca, serving
