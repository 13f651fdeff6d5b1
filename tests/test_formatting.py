"""Directed rounding of printed numbers: the text parsed back is on the chosen side of the value."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest

from dpnoise.formatting import decimals, significant_digits


def random_floats(count: int, seed: int = 0) -> np.ndarray:
    """Floats of every size (mantissas uniform, exponents over the whole double range but the subnormals)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(1, 10, count) * 10.0 ** rng.integers(-300, 300, count)


@pytest.mark.parametrize("digits", [1, 3, 4, 6, 10, 15])
def test_parsed_back_is_on_the_chosen_side_within_one_unit_of_the_last_digit(digits):
    for value in [*random_floats(500, seed=digits), 1.185465, 0.08041335630078805, 9.9999996, 1e-320 * 1e10]:
        for sign in (1.0, -1.0):
            x = float(sign * value)
            up, down = significant_digits(x, digits, "up"), significant_digits(x, digits, "down")
            assert float(down) <= x <= float(up), (x, digits, down, up)
            unit = Decimal(1).scaleb(Decimal(x).adjusted() - digits + 1)
            assert Decimal(up) - Decimal(down) <= unit, (x, digits, down, up)
            mantissa = up.split("e")[0].replace("-", "").replace(".", "").lstrip("0")
            assert len(mantissa) <= digits, up


def test_agrees_with_nearest_when_the_value_has_that_many_digits():
    for x, digits in [(0.5, 6), (1.25, 3), (2.0, 1), (123456.0, 6), (0.001, 4), (1e-5, 2)]:
        assert significant_digits(x, digits, "up") == significant_digits(x, digits, "down") == format(x, f".{digits}g")


def test_the_two_directions_at_the_issues_values():
    assert (significant_digits(1.1854650001, 6, "down"), significant_digits(1.1854650001, 6, "up")) == \
        ("1.18546", "1.18547")
    assert significant_digits(0.08041335630078805, 6, "down") == "0.0804133"  # nearest: 0.0804134
    assert significant_digits(9.9999996, 6, "up") == "10"


def test_zero_infinities_and_nan_print_as_they_are():
    for x in (0.0, -0.0, math.inf, -math.inf):
        assert significant_digits(x, 6, "up") == significant_digits(x, 6, "down") == format(x, ".6g")
    assert significant_digits(math.nan, 6, "up") == "nan"


@pytest.mark.parametrize("digits", [0, 16])
def test_digits_out_of_range_are_refused(digits):
    with pytest.raises(ValueError, match="digits"):
        significant_digits(1.0, digits, "up")


@pytest.mark.parametrize("places", [0, 1, 3, 4, 6, 12])
def test_decimals_parsed_back_are_on_the_chosen_side_within_one_unit_of_the_last_decimal(places):
    rng = np.random.default_rng(places)
    values = [*(rng.uniform(0, 1, 300) * 10.0 ** rng.integers(-12, 12, 300)), 35.02970000001, 0.12345, 2.0**60 + 0.5,
              5e-324, 1e300]
    for value in values:
        for sign in (1.0, -1.0):
            x = float(sign * value)
            up, down = decimals(x, places, "up"), decimals(x, places, "down")
            assert float(down) <= x <= float(up), (x, places, down, up)
            assert Decimal(up) - Decimal(down) <= Decimal(1).scaleb(-places), (x, places, down, up)
            for text in (up, down):  # the look of ".{places}f": that many decimals, no exponent
                assert "e" not in text and len(text.partition(".")[2]) == places, text


def test_decimals_round_in_the_given_direction_and_keep_exact_values():
    assert (decimals(0.12341, 4, "up"), decimals(0.12341, 4, "down")) == ("0.1235", "0.1234")
    assert (decimals(-0.12341, 4, "up"), decimals(-0.12341, 4, "down")) == ("-0.1234", "-0.1235")
    assert decimals(35.02971, 4, "down") == "35.0297" and decimals(35.02971, 4, "up") == "35.0298"
    assert decimals(0.99999, 4, "up") == "1.0000" and decimals(1e-9, 4, "up") == "0.0001"
    for x in (1.0, 0.1, 0.5, 35.0297, 0.0, 123.0):  # the nearest text already parses back to the float itself
        assert decimals(x, 4, "up") == decimals(x, 4, "down") == format(x, ".4f")


def test_decimals_of_infinities_and_nan_and_places_out_of_range():
    for x in (math.inf, -math.inf, math.nan):
        assert decimals(x, 4, "up") == decimals(x, 4, "down") == format(x, ".4f")
    for places in (-1, 21):
        with pytest.raises(ValueError, match="places"):
            decimals(1.0, places, "up")
