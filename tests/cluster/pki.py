"""TLS material for the loopback control plane, in kwokctl's shape (pkg/kwokctl/pki/pki.go).

One CA and one "admin" certificate (O=system:masters, server and client use, SANs 127.0.0.1 and
localhost): the API server's serving certificate, every component's client certificate and the
service-account signing key. Test-grade on purpose: the components trust each other as kwokctl's
binary runtime makes them; what the optimizer may do is decided by RBAC on its own ServiceAccount
token, not by this certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "kubeon-test-ca"
VALIDITY = dt.timedelta(days=30)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def write_pki(directory: Path) -> dict[str, Path]:
    """Write ca.crt, ca.key, admin.crt, admin.key into `directory`; return their paths by stem."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + VALIDITY)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    admin_key = _key()
    admin = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                                      x509.NameAttribute(NameOID.COMMON_NAME, "kubeon-test-admin")]))
             .issuer_name(ca_name).public_key(admin_key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now).not_valid_after(now + VALIDITY)
             .add_extension(x509.SubjectAlternativeName([
                 x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                   ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
             .sign(ca_key, hashes.SHA256()))
    files = {"ca.crt": ca.public_bytes(serialization.Encoding.PEM), "ca.key": _pem_key(ca_key),
             "admin.crt": admin.public_bytes(serialization.Encoding.PEM), "admin.key": _pem_key(admin_key)}
    paths = {}
    for name, data in files.items():
        (directory / name).write_bytes(data)
        paths[name.replace(".", "_")] = directory / name
    return paths


def write_serving_pair(directory: Path, ca_dir: Path, common_name: str, dns: list[str],
                       ips: list[str]) -> dict[str, Path]:
    """Write ca.crt, tls.crt, tls.key (the layout KEDA's --cert-dir reads: pkg/metricsservice/utils/tls.go)
    into `directory`: a server and client certificate signed by the cluster CA in `ca_dir`, for a
    component reached by name (`dns`, e.g. a Service's `<name>.<namespace>.svc`) or address (`ips`)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, rsa.RSAPrivateKey)
    key = _key()
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = {"ca.crt": ca.public_bytes(serialization.Encoding.PEM),
             "tls.crt": cert.public_bytes(serialization.Encoding.PEM), "tls.key": _pem_key(key)}
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return {name.replace(".", "_"): directory / name for name in files}
