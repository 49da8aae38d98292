"""Quantities and durations parse as the API server reads them. Pure: nothing faked."""

from decimal import Decimal

import pytest

from gpupolicy.quantity import QuantityError, parse_bytes_mib, parse_duration, parse_quantity


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


@pytest.mark.parametrize("text", ["30", "m30", "1h 30m", "", "-5s", "5y"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_duration(text)
