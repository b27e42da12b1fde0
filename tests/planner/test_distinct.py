"""``sorted_distinct`` returns what ``np.unique`` returns (it is only faster on many distinct values)."""

from __future__ import annotations

import numpy as np

from zephon.planner.distinct import sorted_distinct


def test_sorted_distinct_is_np_unique() -> None:
    rng = np.random.default_rng(3)
    cases = [np.empty(0, np.int64), np.array([4]), np.array([2, 2]), np.array([9, -1, 9, 3])]
    cases += [rng.integers(-(2**40), 2**40, n) for n in (10, 1000)] + [rng.integers(0, 5, 200).astype(np.int32)]
    for values in cases:
        got = sorted_distinct(values)
        assert np.array_equal(got, np.unique(values)) and got.dtype == values.dtype
