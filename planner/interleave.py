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
denominator above ``MAX_PERIOD`` fall back to the loop over all positions (about 0.4 µs per position;
weights such as 0.4 / 0.25 / 0.15 have S = 100, while float shares like 0.3183098861837907 are exact binary
fractions with a huge S). ``Interleaving`` hands the plan out a block at a time — a periodic schedule is
grouped by dataset in closed form, the stepwise one resumes from its counts — so no schedule is held whole.

Worked example, weights {a: 0.5, b: 0.3, c: 0.2} (S = 10, a's jobs due at 2, 4, 6…, b's at 3.33, 6.67…,
c's at 5, 10): slot 0 → a (due 2), slot 1 → b (3.33; a's next job is not released until time 2),
slot 2 → a (4), slot 3 → c (5), slot 4 → a (6), slot 5 → b (6.67), slot 6 → a (8), slot 7 → b (10, tie
with c broken by index), slot 8 → a (10) … giving ``a b a c a b a b a c`` and then the same again.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

MAX_PERIOD = 1 << 20


class Block(NamedTuple):
    """Positions ``[start, stop)`` of an interleaving, grouped by dataset so each dataset's documents can be
    taken in one run and scattered into place (``column[order] = concatenated runs``).

    Example, the schedule ``a b a c a b a b a c`` of the module docstring, block ``[0, 5)``:
    ``choice = [0, 1, 0, 2, 0]``, ``order = [0, 2, 4, 1, 3]``, ``counts = [3, 1, 1]``.
    """

    #: The dataset (int16) supplying each position of the block, in plan order.
    choice: np.ndarray
    #: The block's positions (offsets from ``start``) grouped by dataset — dataset 0's first, each group in
    #: plan order: ``np.argsort(choice, kind="stable")``.
    order: np.ndarray
    #: Positions of each dataset in the block (int64, one entry per dataset, 0 for a dataset it skips).
    counts: np.ndarray


def exact_fraction(value: float) -> Fraction:
    """``value`` as a fraction: the nearest one with denominator ≤ 10^6 when within 1e-12 (relative), so
    0.1 is 1/10 and 1/3 given as 0.333… is 1/3; else the float's exact binary value."""
    exact = Fraction(value)
    near = exact.limit_denominator(10**6)
    return near if abs(near - exact) <= Fraction(1, 10**12) * abs(exact) else exact


def exact_weights(weights: list[float]) -> list[Fraction]:
    """Normalized weights as fractions summing exactly to 1."""
    fracs = [exact_fraction(w) for w in weights]
    total = sum(fracs)
    return [f / total for f in fracs]


def _edf(numerators: list[int], denominator: int, length: int, counts: list[int] | None = None) -> np.ndarray:
    """Run the EDF scheduler for ``length`` slots; weights are ``numerators[i] / denominator``.

    ``counts`` (documents given to each dataset so far, updated in place) resumes a schedule at slot
    ``sum(counts)``, so a long schedule can be produced a chunk at a time.
    """
    m = len(numerators)
    counts = counts if counts is not None else [0] * m
    start = sum(counts)
    # Deadlines (k+1)/w_i compared as integers: (k+1) * scale_i with scale_i = L / numerator_i.
    lcm = math.lcm(*numerators)
    scale = [lcm // n for n in numerators]
    # Dataset i's next document is released at the first slot with k·S ≤ slot·n_i; both values change only
    # when i is scheduled, so each slot costs m integer comparisons and one division.
    release = [-(-c * denominator // n) for c, n in zip(counts, numerators, strict=True)]
    deadline = [(c + 1) * s for c, s in zip(counts, scale, strict=True)]
    out = np.empty(length, dtype=np.int16)
    datasets = range(m)
    for slot in range(start, start + length):
        best = -1
        for i in datasets:
            if release[i] <= slot and (best < 0 or deadline[i] < deadline[best]):
                best = i
        c = counts[best] + 1
        counts[best] = c
        release[best] = -(-c * denominator // numerators[best])
        deadline[best] += scale[best]
        out[slot - start] = best
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


class Interleaving:
    """The schedule of ``interleave(weights, length)``, handed out in consecutive blocks.

    Periodic schedules (``S ≤ MAX_PERIOD`` and ``S < length``) keep one period and group any block by
    dataset in closed form; others run the stepwise scheduler block by block (2 bytes per position of the
    current block only).
    """

    def __init__(self, weights: list[float], length: int) -> None:
        fracs = exact_weights(weights)
        self._denominator = math.lcm(*(f.denominator for f in fracs))
        self._numerators = [int(f * self._denominator) for f in fracs]
        self.length = length
        self.periodic = self._denominator <= MAX_PERIOD and self._denominator < length
        self._counts = [0] * len(weights)
        if self.periodic:
            self._pattern = _edf(self._numerators, self._denominator, self._denominator)
            self._where = [np.flatnonzero(self._pattern == i) for i in range(len(weights))]

    def positions(self, wanted: list[list[int]]) -> list[list[int | None]]:
        """Position of document ``k`` (0-based) of dataset ``i`` for each ``k`` in ``wanted[i]``; None when it
        is not before ``length``. Closed form when periodic; stepwise, one counting pass (the blocks are
        computed again when handed out)."""
        if self.periodic:
            period = len(self._pattern)
            out = []
            for where, ks in zip(self._where, wanted, strict=True):
                found: list[int | None] = []
                for k in ks:
                    q, r = divmod(k, len(where))
                    p = q * period + int(where[r])
                    found.append(p if p < self.length else None)
                out.append(found)
            return out
        # Stepwise: run the scheduler from the start, counting, without keeping the schedule.
        result: list[list[int | None]] = [[None] * len(ks) for ks in wanted]
        counts = [0] * len(wanted)
        start, stop = 0, self.length
        while start < stop and any(p is None for found in result for p in found):
            seen = np.array(counts, dtype=np.int64)
            choice = _edf(self._numerators, self._denominator, min(stop - start, 1 << 20), counts)
            for i, ks in enumerate(wanted):
                for j, k in enumerate(ks):
                    if result[i][j] is None and seen[i] <= k < counts[i]:
                        result[i][j] = start + int(np.flatnonzero(choice == i)[k - seen[i]])
            start += len(choice)
        return result

    def block(self, start: int, stop: int) -> Block:
        """Positions ``[start, stop)``, each block starting where the previous one stopped."""
        if start != sum(self._counts):
            raise ValueError(f"blocks must follow each other, got start {start} after {sum(self._counts)}")
        m = len(self._numerators)
        if not self.periodic:
            choice = _edf(self._numerators, self._denominator, stop - start, self._counts)
            return Block(choice, np.argsort(choice, kind="stable"), np.bincount(choice, minlength=m))
        period = len(self._pattern)
        first = start % period
        # The pattern repeated from ``first`` on (np.tile: np.resize concatenated one copy per period, 208 ns a
        # position for a one-dataset plan, whose period is 1; this is ~2).
        reps = -(-(stop - start) // period)
        choice = np.tile(np.roll(self._pattern, -first), reps)[: stop - start]
        bases = np.arange(start // period * period, -(-stop // period) * period, period, dtype=np.int64)[:, None]
        parts = []
        for i, where in enumerate(self._where):
            offsets = (bases - start + where[None, :]).ravel()
            lo, hi = np.searchsorted(offsets, [0, stop - start])
            parts.append(offsets[lo:hi])
            self._counts[i] += int(hi - lo)
        return Block(choice, np.concatenate(parts), np.array([len(p) for p in parts], dtype=np.int64))
