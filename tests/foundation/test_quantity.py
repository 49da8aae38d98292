"""Quantities and durations parse as the API server reads them. Pure: nothing faked."""

import math
import time
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupolicy.k8s.quantity import QuantityError, parse_bytes_mib, parse_duration, parse_nanos, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("8Gi", Decimal(8 * 2**30), id="binary-suffix"),
        pytest.param("500m", Decimal("0.5"), id="milli"),
        pytest.param("2", Decimal(2), id="plain"),
        pytest.param("1.5G", Decimal("1.5e9"), id="decimal-suffix"),
        pytest.param("1e3", Decimal(1000), id="exponent"),
        pytest.param(3, Decimal(3), id="int"),
    ],
)
def test_quantities(text: str | int, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["8Gx", "", "Gi", "1e3Gi", "abc", True])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_memory_in_mib() -> None:
    assert parse_bytes_mib("16Gi") == 16384.0
    assert parse_bytes_mib("1G") == pytest.approx(953.674, rel=1e-4)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("30m", 1800), ("1h30m", 5400), ("7d", 604800), ("1w", 604800), ("250ms", 0.25), (45, 45)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "m30", "1h 30m", "", "-5s", "5y", "9" * 400 + "s", 1e300, float("nan")])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_duration(text)


# --- upstream's grammar and bounds (k8s.io/apimachinery/pkg/api/resource) ---

@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        pytest.param("1n", 1, id="nano"),
        pytest.param("0.1n", 1, id="below-nano-rounds-up"),
        pytest.param("-0.1n", -1, id="negative-rounds-away-from-zero"),
        pytest.param("1.0000000001", 1_000_000_001, id="tenth-digit-rounds-up"),
        pytest.param("1.0000000001Ki", 1_024_000_000_103, id="binary-fraction-rounds-up"),
        pytest.param("5.", 5 * 10**9, id="trailing-dot"),
        pytest.param(".5", 5 * 10**8, id="leading-dot"),
        pytest.param("1E", 10**27, id="exa-suffix-not-exponent"),
        pytest.param("5e-0001", 5 * 10**8, id="exponent-leading-zeros"),
        pytest.param("9223372036854775807", (2**63 - 1) * 10**9, id="largest"),
        pytest.param("7.99Ei", 9_211_842_821_808_707_338_240_000_000, id="just-under-8Ei"),
        pytest.param("1e-1000000", 1, id="tiny-exponent-rounds-up"),
        pytest.param(" 2 ", 2 * 10**9, id="json-trims-space"),
        pytest.param(2.5, 2_500_000_000, id="float"),
    ],
)
def test_upstream_grammar(text: str | float, nanos: int) -> None:
    assert parse_nanos(text) == nanos


@pytest.mark.parametrize(
    "text",
    ["1e1000000", "9223372036854775808", "8Ei", "1e2147483647", "1e2147483648", "1" * 100_000, ".", "+", "1e",
     "1K", "\uff11", "1e5Gi", 1e308, float("nan"), float("inf"), 2**70, None, [], {}],
)
def test_outside_upstream_is_a_clear_error(text: object) -> None:
    with pytest.raises(QuantityError) as info:
        parse_nanos(text)  # type: ignore[arg-type]
    assert len(str(info.value)) < 120 and str(info.value).isascii()


def test_overflow_regression_is_an_error_not_decimal_overflow() -> None:
    """Issue 15 defect 1: `1e1000000` raised decimal.Overflow, which nothing caught."""
    with pytest.raises(QuantityError, match="largest quantity"):
        parse_quantity("1e1000000")


@pytest.mark.parametrize(("text", "nanos"), [
    ("1e999990", None), ("1e-999990", 1), ("0." + "0" * 1_000_000 + "1", 1),
    ("1e" + "0" * 1_000_000 + "3", 1000 * 10**9), ("9" * 1_000_000, None)])
def test_parse_time_is_bounded(text: str, nanos: int | None) -> None:
    """Issue 15 defect 2: `int(Decimal("1e999990"))` took 23 s on one extender request. The answer is
    upstream's (rounded up to 1n; None: over 2^63-1, an error), in CPU time linear in the length: a
    1 MB string takes ~10 ms, not 23 s (CPU time, so a stalled machine does not fail the test)."""
    start = time.thread_time()
    if nanos is None:
        with pytest.raises(QuantityError, match="largest quantity"):
            parse_nanos(text)
    else:
        assert parse_nanos(text) == nanos
    assert time.thread_time() - start < 1.0


def _reference_nanos(sign: str, whole: str, frac: str, suffix: str) -> int | None:
    """Exact rational arithmetic, as upstream's inf.Dec path does: None when over 2^63-1."""
    factor = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
              "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
              "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40)}
    if suffix.startswith("e"):
        exp = int(suffix[1:])
        scale = Fraction(10) ** exp
    else:
        scale = factor[suffix]
    value = (int(whole or "0") + Fraction(int(frac or "0"), 10 ** len(frac))) * scale
    if value > 2**63 - 1:
        return None
    nanos = math.ceil(value * 10**9)
    return -nanos if sign == "-" else nanos


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    st.sampled_from(["", "+", "-"]),
    st.text("0123456789", max_size=22),
    st.text("0123456789", max_size=30),
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"])
    | st.integers(-40, 40).map(lambda e: f"e{e}"),
)
def test_matches_exact_arithmetic(sign: str, whole: str, frac: str, suffix: str) -> None:
    if not whole and not frac:
        return
    text = f"{sign}{whole}.{frac}{suffix}" if frac else f"{sign}{whole}{suffix}"
    expected = _reference_nanos(sign, whole, frac, suffix)
    if expected is None:
        with pytest.raises(QuantityError):
            parse_nanos(text)
    else:
        assert parse_nanos(text) == expected
