"""The command-line types of the servers' flags, and the check that an address can be listened on.

Why one module: the webhook, the extender, the controller's health server and the hub take the same
kinds of flag (a port, an address to bind, worker and thread counts, a period in seconds, a server's
URL), and a value out of range must be the same usage error (exit 2, argparse's line naming the flag)
for all of them, never an OverflowError from bind(), a gunicorn master with no worker, a loop that
spins on a zero period, or a URL every later request fails on. It imports neither Flask nor gunicorn,
so parsing a command line stays cheap.

`file_bytes` reads a file a flag names: a FIFO nothing writes to would block the command forever, so
only a regular file is read.

`bind_problem` tries the address once, in the master, before gunicorn does: gunicorn would retry five
times a second apart and then exit 1 with its own lines.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import math
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens (63 at most), and a last
# label that is not all digits (so "999.1.1.1" is neither an address nor a name).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}\.?")


def _whole(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def port_number(text: str) -> int:
    """argparse type of a listening port: a whole number 1-65535."""
    value = _whole(text, "a port number (1-65535)")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (1-65535)")
    return value


def port_or_any(text: str) -> int:
    """argparse type of a listening port where 0 asks the system for any free one (the health port)."""
    value = _whole(text, "a port number (0-65535, 0: any)")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535, 0: any)")
    return value


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (workers, threads, a lease's seconds)."""
    value = _whole(text, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def positive_seconds(text: str) -> float:
    """argparse type of a period in seconds: a finite number above 0 (0 would spin, NaN never compares)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of seconds above 0")
    return value


def listen_host(text: str) -> str:
    """argparse type of --bind: an IP address (IPv6 with or without brackets) or a host name."""
    host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if len(host) <= 253 and _HOST_NAME.fullmatch(host) and not host.rstrip(".").rsplit(".", 1)[-1].isdigit():
        return host
    raise argparse.ArgumentTypeError(f"{text!r} is not an IP address or a host name")


def http_url(text: str) -> str:
    """argparse type of a server's URL (Prometheus, the hub): http or https with a host; "" stays unset.
    The chart's schema asks the same of prometheus.url and hub.url."""
    if not text:
        return text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with a host")
    try:
        parts.port  # noqa: B018 - urllib checks the port only when asked
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the port is not a number from 0 to 65535") from None
    return text


def bind_problem(host: str, port: int) -> str:
    """Why a server could not listen on host:port (strerror: in use, not an address of this machine,
    unknown name, permission); "" when it can. Binds and closes at once, with gunicorn's SO_REUSEADDR."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    return ""


def file_bytes(path: str) -> bytes:
    """The bytes of a file a flag names; OSError "not a regular file" for a FIFO, a device or a directory."""
    found = Path(path)
    if found.exists() and not found.is_file():
        raise OSError(errno.EINVAL, "not a regular file")
    return found.read_bytes()
