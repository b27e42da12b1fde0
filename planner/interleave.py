"""Low-discrepancy interleaving of datasets: which dataset supplies each position of the plan.

Invariant: for every prefix of ``n`` positions and every dataset ``i`` with normalized weight ``w_i``,
the count ``c_i(n)`` of positions given to ``i`` satisfies ``|c_i(n) - w_i·n| < 1``. No random draws are
involved: shares hold in every window of training, not only on average.

Algorithm: earliest deadline first over unit jobs. Dataset ``i``'s ``k``-th document (0-based) is released at
time ``k / w_i`` and due at ``(k + 1) / w_i``. At slot ``n`` (0-based) the released document with the
earliest deadline is scheduled; ties go to the lower dataset index. With weights summing to 1 a released
document always exists and every deadline is met, which gives ``floor(w_i·n) ≤ c_i(n) ≤ ceil(w_i·n)``.
Arithmetic is exact: weights become fractions (a float within 1e-12 of a fraction with denominator ≤ 10^6
is read as that fraction, so 1/3 given as 0.333… is exactly 1/3) over a common denominator ``S``.

The schedule is periodic: after ``S`` slots every dataset has exactly ``S·w_i`` documents and the state is
the initial one. So one period is computed with a Python loop (``S`` steps) and tiled; only weights with a
denominator above ``MAX_PERIOD`` fall back to the loop over all positions.

Worked example, weights {a: 0.5, b: 0.3, c: 0.2} (S = 10, a's jobs due at 2, 4, 6…, b's at 3.33, 6.67…,
c's at 5, 10): slot 0 → a (due 2), slot 1 → b (3.33; a's next job is not released until time 2),
slot 2 → a (4), slot 3 → c (5), slot 4 → a (6), slot 5 → b (6.67), slot 6 → a (8), slot 7 → b (10, tie
with c broken by index), slot 8 → a (10) … giving ``a b a c a b a b a c`` and then the same again.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

MAX_PERIOD = 1 << 20


def exact_weights(weights: list[float]) -> list[Fraction]:
    """Normalized weights as fractions summing exactly to 1."""
    fracs = []
    for w in weights:
        exact = Fraction(w)
        near = exact.limit_denominator(10**6)
        fracs.append(near if abs(near - exact) <= Fraction(1, 10**12) * exact else exact)
    total = sum(fracs)
    return [f / total for f in fracs]


def _edf(numerators: list[int], denominator: int, length: int) -> np.ndarray:
    """Run the EDF scheduler for ``length`` slots; weights are ``numerators[i] / denominator``."""
    m = len(numerators)
    counts = [0] * m
    # Deadlines (k+1)/w_i compared as integers: (k+1) * scale_i with scale_i = L / numerator_i.
    lcm = math.lcm(*numerators)
    scale = [lcm // n for n in numerators]
    out = np.empty(length, dtype=np.int16)
    for slot in range(length):
        best = -1
        best_deadline = 0
        for i in range(m):
            c = counts[i]
            # Released when k/w_i ≤ slot, i.e. k·S ≤ slot·n_i.
            if c * denominator <= slot * numerators[i]:
                deadline = (c + 1) * scale[i]
                if best < 0 or deadline < best_deadline:
                    best, best_deadline = i, deadline
        counts[best] += 1
        out[slot] = best
    return out


def interleave(weights: list[float], length: int) -> np.ndarray:
    """Dataset index (int16) of each of the first ``length`` plan positions."""
    fracs = exact_weights(weights)
    denominator = math.lcm(*(f.denominator for f in fracs))
    numerators = [int(f * denominator) for f in fracs]
    if denominator <= MAX_PERIOD and denominator < length:
        period = _edf(numerators, denominator, denominator)
        reps = -(-length // denominator)
        return np.tile(period, reps)[:length]
    return _edf(numerators, denominator, length)
