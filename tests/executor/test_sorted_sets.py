"""``zephon.executor.sorted_sets``: NumPy's answers, by a shorter road where the input is sorted already."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.executor.sorted_sets import isin_sorted, non_decreasing, unique_sorted


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000])
@pytest.mark.parametrize("order", ["sorted", "shuffled", "descending"])
def test_unique_sorted_is_numpys_unique(size: int, order: str) -> None:
    x = np.random.default_rng(size).integers(-5, 40, size).astype(np.int64)
    x = np.sort(x) if order == "sorted" else x[::-1].copy() if order == "descending" else x
    got = unique_sorted(x)
    assert got.dtype == np.int64 and got.tolist() == np.unique(x).tolist()
    if size:
        got[0] = 99  # a new array, never a view of the caller's
        assert 99 not in x.tolist()


def test_isin_sorted_is_numpys_isin() -> None:
    rng = np.random.default_rng(3)
    values, members = rng.integers(0, 50, 200), np.unique(rng.integers(0, 50, 20))
    assert isin_sorted(values, members).tolist() == np.isin(values, members).tolist()
    assert not isin_sorted(values, np.empty(0, dtype=np.int64)).any()


def test_non_decreasing() -> None:
    assert non_decreasing(np.array([], dtype=np.int64)) and non_decreasing(np.array([4]))
    assert non_decreasing(np.array([1, 1, 2, 9])) and not non_decreasing(np.array([1, 3, 2]))
