"""Kubernetes quantities and Go-style durations, parsed the way the API server does.

Policies and pods carry sizes ("8Gi", "500m") and periods ("30m", "7d"); the
core needs plain numbers. Parsing lives here once so the webhook, controller
and validation all accept and refuse exactly the same strings.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)")
_DURATION_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity or duration."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Return the quantity's value in base units (bytes, cores, ...). Pure."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{value!r} is not a quantity (examples: 8Gi, 500m, 2)")
    number, exponent, suffix = match.group(1), match.group(2), match.group(3) or ""
    try:
        base = Decimal(number + (exponent or ""))
    except InvalidOperation as exc:
        raise QuantityError(f"{value!r} is not a quantity") from exc
    if exponent and suffix:
        raise QuantityError(f"{value!r} mixes an exponent and a suffix")
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix]


def parse_bytes_mib(value: str | int | float) -> float:
    """A memory quantity in MiB (the unit GFD labels and DCGM use)."""
    return float(parse_quantity(value) / (2**20))


def parse_duration(value: str | int | float) -> float:
    """Seconds in a duration such as "30m", "1h30m", "7d" (days and weeks allowed). Pure."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise QuantityError(f"{value!r} is negative")
        return float(value)
    text = str(value).strip()
    if not text:
        raise QuantityError("empty duration")
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNIT[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise QuantityError(f"{value!r} is not a duration (examples: 30s, 30m, 1h30m, 7d)")
    return total
