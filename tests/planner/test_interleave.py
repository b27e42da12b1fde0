"""The low-discrepancy mixture: every prefix holds each dataset's share within ±1 document."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.planner.interleave import exact_weights, interleave


def max_prefix_deviation(choice: np.ndarray, weights: list[Fraction]) -> float:
    n = np.arange(1, len(choice) + 1)
    return max(float(np.abs(np.cumsum(choice == i) - float(w) * n).max()) for i, w in enumerate(weights))


def test_docstring_example_sequence_is_exact() -> None:
    choice = interleave([0.5, 0.3, 0.2], 20)
    assert "".join("abc"[i] for i in choice) == "abacababac" * 2


def test_weights_are_normalized_exactly_and_read_as_simple_fractions() -> None:
    assert exact_weights([7, 3]) == [Fraction(7, 10), Fraction(3, 10)]
    assert exact_weights([1 / 3, 1 / 3, 1 / 3]) == [Fraction(1, 3)] * 3
    assert sum(exact_weights([0.123456789, 0.5, 0.376543211])) == 1


def test_every_prefix_is_within_one_document_for_skewed_weights() -> None:
    weights = [0.05, 0.9, 0.03, 0.02]
    choice = interleave(weights, 50_000)
    assert max_prefix_deviation(choice, exact_weights(weights)) < 1


def test_period_tiling_matches_the_stepwise_schedule() -> None:
    # Weights with denominator 1000: the tiled schedule must equal the stepwise one beyond one period.
    from zephon.planner.interleave import _edf

    tiled = interleave([0.501, 0.499], 5_000)
    stepwise = _edf([501, 499], 1000, 5_000)
    assert np.array_equal(tiled, stepwise)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.001, max_value=100.0), min_size=1, max_size=6), st.integers(1, 3000))
def test_prefix_property_holds_for_any_weights(raw: list[float], length: int) -> None:
    choice = interleave(raw, length)
    assert len(choice) == length
    assert max_prefix_deviation(choice, exact_weights(raw)) < 1 + 1e-9
