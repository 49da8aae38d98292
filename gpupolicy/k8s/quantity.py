"""Kubernetes quantities and Go-style durations, parsed the way the API server does.

Policies, pods and nodes carry sizes ("8Gi", "500m") and periods ("30m", "7d");
the core needs plain numbers. This is the project's one quantity parser, so
the webhook, the extender, the controller and validation accept and refuse
exactly the same strings.

Grammar and bounds follow k8s.io/apimachinery/pkg/api/resource (quantity.go,
suffix.go):

    <quantity>  ::= <sign>? <number> <suffix>?
    <number>    ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>    ::= Ki | Mi | Gi | Ti | Pi | Ei | n | u | m | k | M | G | T | P | E
                  | (e|E) <sign>? <digits>

"no quantity may represent a number greater than 2^63-1 in magnitude" and
precision stops at nano units: a non-zero value is rounded up (away from
zero) to the next 1n, as ParseQuantity does. Upstream caps an oversized
binary quantity and cannot express a larger decimal one as an int64; here
anything beyond the bound is refused, because capping "1e1000000" would hide
the mistake. Three of upstream's code-path quirks are not copied: "." and a
bare sign (which its scanner reads as 0), and exponents beyond int32 (which it
wraps): the grammar has none of them.

The work is bounded whatever the input: the size is estimated from the digit
count and exponent before any arithmetic, and only the ~30 digits that can
matter are ever turned into a number (`int(Decimal("1e999990"))` once took
23 s on one extender request).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

MAX_MAGNITUDE = 2**63 - 1
"""The largest quantity in base units (bytes, cores, ...) upstream represents."""

_NANO = 10**9
_MAX_NANOS = MAX_MAGNITUDE * _NANO
_INT32 = 2**31 - 1
_LOG10_2 = math.log10(2)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?[0-9]+))?", re.ASCII)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)", re.ASCII)
_DURATION_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_MAX_DURATION_S = MAX_MAGNITUDE / _NANO  # Go's time.Duration: int64 nanoseconds, ~292 years
_SPACE = " \t\n\r\v\f"  # Quantity.UnmarshalJSON trims these before ParseQuantity
_SHOWN = 40  # characters of a refused value quoted back in a message


# The same grammar as a JSON-Schema pattern, for the CRD (the API server refuses before our code runs).
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+$"
MAX_TEXT = 64  # longest quantity or duration the CRD admits (canonical quantities are under 30)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity or duration."""


def shown(value: object) -> str:
    """A refused value for an error message: short and ASCII-only, so the answer always encodes."""
    if isinstance(value, str):
        return ascii(value[:_SHOWN] + ("..." if len(value) > _SHOWN else ""))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a number over 30 digits"
    if isinstance(value, bool | int | float):
        return repr(value)
    return f"a {type(value).__name__}"


def _number_text(value: int | float) -> str:
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            raise QuantityError(f"{shown(value)} is larger than the largest quantity (2^63-1)")
        return str(value)
    if not math.isfinite(value):
        raise QuantityError(f"{value!r} is not a quantity")
    return repr(value)


# nanos of each short quantity text already parsed (a cluster repeats a few dozen); dropped whole when full
_NANOS_BY_TEXT: dict[str, int] = {}
_NANOS_BY_TEXT_MAX = 4096


def parse_nanos(value: str | int | float) -> int:
    """The quantity in nano base units (an int), rounded up to 1n like upstream. Pure, bounded time."""
    if type(value) is str and len(value) <= 64:
        found = _NANOS_BY_TEXT.get(value)
        if found is None:
            found = _parse_nanos(value)  # QuantityError: not remembered
            if len(_NANOS_BY_TEXT) >= _NANOS_BY_TEXT_MAX:
                _NANOS_BY_TEXT.clear()
            _NANOS_BY_TEXT[value] = found
        return found
    return _parse_nanos(value)


def _parse_nanos(value: str | int | float) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(f"{shown(value)} is not a quantity (examples: 8Gi, 500m, 2)")
    text = _number_text(value) if not isinstance(value, str) else value.strip(_SPACE)
    match = _QUANTITY.fullmatch(text)
    if match is None or not (match.group(2) or match.group(3)):
        raise QuantityError(f"{shown(value)} is not a quantity (examples: 8Gi, 500m, 2)")
    sign, whole, frac, suffix, exponent = match.groups()
    frac = (frac or "").rstrip("0")
    digits = (whole + frac).lstrip("0")
    if not digits:
        return 0
    e10, b2 = -len(frac), 0
    if suffix in _BINARY:
        b2 = _BINARY[suffix]
    elif exponent is not None:
        body = exponent.lstrip("+-").lstrip("0") or "0"
        if len(body) > 10 or int(body) > _INT32:
            raise QuantityError(f"{shown(value)}: exponent out of range")
        e10 += -int(body) if exponent.startswith("-") else int(body)
    else:
        e10 += _DECIMAL[suffix or ""]
    # Size from the digit count alone: refuse before any big arithmetic.
    if len(digits) - 1 + e10 + b2 * _LOG10_2 >= 19:
        raise QuantityError(f"{shown(value)} is larger than the largest quantity (2^63-1)")
    nanos = _ceil_nanos(digits, e10 + 9, b2)
    if nanos > _MAX_NANOS:
        raise QuantityError(f"{shown(value)} is larger than the largest quantity (2^63-1)")
    return -nanos if sign == "-" else nanos


def _ceil_nanos(digits: str, k: int, b2: int) -> int:
    """ceil(int(digits) * 2^b2 * 10^k) without ever building the long part of `digits`.

    Trailing digits whose weight is below what 10^k * 2^b2 can turn into a
    whole nano are dropped (j of them); they only decide whether to round up.
    """
    if k >= 0:
        return int(digits) * (1 << b2) * int(10**k)
    drop = max(0, -k - b2)
    if drop >= len(digits):
        return 1  # below 1n: rounded up
    head, tail = digits[: len(digits) - drop], digits[len(digits) - drop:]
    scale = -(k + drop)  # 0 <= scale <= b2
    whole, rest = divmod(int(head) * (1 << b2), int(10**scale))
    return whole + (1 if rest or tail.strip("0") else 0)


def parse_quantity(value: str | int | float) -> Decimal:
    """The quantity's value in base units (bytes, cores, ...), exact to the nano. Pure."""
    return Decimal(parse_nanos(value)).scaleb(-9)


def parse_bytes_mib(value: str | int | float) -> float:
    """A memory quantity in MiB (the unit GFD labels and DCGM use)."""
    return parse_nanos(value) / (_NANO * 2**20)


def parse_duration(value: str | int | float) -> float:
    """Seconds in a duration such as "30m", "1h30m", "7d" (days and weeks allowed). Pure.

    Bounded like Go's time.Duration (int64 nanoseconds, about 292 years).
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0 or value > _MAX_DURATION_S:
            raise QuantityError(f"{shown(value)} is not a duration between 0 and 292 years")
        return float(value)
    if not isinstance(value, str):
        raise QuantityError(f"{shown(value)} is not a duration (examples: 30s, 30m, 1h30m, 7d)")
    text = value.strip()
    if not text:
        raise QuantityError("empty duration")
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNIT[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise QuantityError(f"{shown(value)} is not a duration (examples: 30s, 30m, 1h30m, 7d)")
    if total > _MAX_DURATION_S:
        raise QuantityError(f"{shown(value)} is longer than the longest duration (about 292 years)")
    return total
