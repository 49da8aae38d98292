"""The servers' TLS context, and why the certificates, keys and CAs given on the command line do not load.

Why here: `serving.server.RotatingTLS` builds the context for every new certificate it finds on disk,
and the commands (webhook, extender, hub) check the pair once before gunicorn starts, so that a file
that is not PEM, or a key that is not the certificate's, is one line naming the file and exit code 2
instead of an `ssl.SSLError` traceback from the master. Imports neither Flask nor gunicorn.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving `certfile` with `keyfile` (ssl.SSLError, OSError when they do not
    load)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=str(certfile), keyfile=str(keyfile))
    return context


def tls_problem(certfile: Path, keyfile: Path) -> str:
    """Why `certfile` and `keyfile` cannot serve TLS, naming the file; "" when they can."""
    try:
        server_context(certfile, keyfile)
    except ssl.SSLError as exc:  # OpenSSL says "PEM lib": say which file is not what it should be
        for path, marker, what in ((certfile, b"-----BEGIN CERTIFICATE-----", "a PEM certificate"),
                                   (keyfile, b"PRIVATE KEY-----", "a PEM private key")):
            try:
                if marker not in path.read_bytes():
                    return f"{path}: not {what}"
            except OSError as error:
                return f"{path}: {error.strerror or error}"
        return f"{certfile} with {keyfile}: {exc.reason or exc}"  # e.g. KEY_VALUES_MISMATCH
    except OSError as exc:
        return f"{exc.filename or certfile}: {exc.strerror or exc}"
    return ""


def cert_dir_problem(cert_dir: Path) -> str:
    """Why `cert_dir` (a Secret mounted as tls.crt and tls.key) cannot serve TLS; "" when it can."""
    for name in ("tls.crt", "tls.key"):
        if not (cert_dir / name).is_file():
            return f"{name} missing"
    return tls_problem(cert_dir / "tls.crt", cert_dir / "tls.key")


def ca_problem(cafile: Path) -> str:
    """Why `cafile` cannot verify a server (the controller's --hub-ca-file: requests reads it on every poll,
    so an unusable file is refused at start, once); "" when it can."""
    try:
        ssl.create_default_context(cafile=str(cafile))
    except ssl.SSLError as exc:
        return f"not a PEM CA certificate ({exc.reason})"
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""
