"""Which rows and lanes each DataLoader worker of a rank builds: a partition derived from the geometry.

A ``torch.utils.data.DataLoader`` with ``N`` workers fetches *items* from them strictly in turn: item ``k`` of
an iteration comes from worker ``k mod N``. A rank hands out its microbatches in order (running number
``m = step·A + index``, ``zephon.executor.progress``); each microbatch travels as ``c`` items, *pieces* of
consecutive rows (piece ``p`` of ``B`` rows is rows ``[p·B // c, (p+1)·B // c)``), so item
``k = (m − m₀)·c + p`` is piece ``p`` of microbatch ``m``, counted from ``m₀``, the first microbatch of the
iteration (a resumed run starts its items at worker 0 like any other).

* ``c = 1`` — whole microbatches (``Pipeline.to_torch_dataset()``: a plain DataLoader must never receive
  fragments). Worker ``w`` yields microbatches ``m₀ + w, m₀ + w + N, …``.
* ``c = N / gcd(N, A)`` — ``Pipeline.dataloader()``, which joins the pieces again. Then ``A·c`` is a multiple
  of ``N``, so piece ``p`` of index ``a`` of *every* step comes from the same worker, ``((a − m₀)·c + p) mod N``;
  with ``N | A`` that is ``c = 1`` again, otherwise each worker yields rows of every ``N / gcd(N, A)``-th
  microbatch.

An estimated plan's row ``i`` of microbatch ``(s, a)`` is the next row of lane ``j mod L`` (``j`` its sequence,
``zephon.executor.geometry``). A worker packs exactly the lanes its own pieces take rows from — over a whole
cycle of steps after which both the item → worker map and the lanes of each row repeat — and pops rows only of
those lanes. With the default plan (``L = G``, one lane per row of the global batch) row ``i`` of index ``a``
is always lane ``r + D·(a·B + i)``, so with ``c = N / gcd(N, A)`` no lane is packed by two workers: no
document is tokenized twice on a rank (``disjoint``). With ``c = 1`` that holds when ``N | A``; otherwise
workers share lanes and pack them alike (the data never changes, the work repeats).

Worked example: G = 8, D = 1, B = 4 (A = 2), L = 8, so row i of index a is lane 4a + i.

* ``c = 1``, N = 2: worker 0 yields index 0 of every step (lanes 0-3), worker 1 index 1 (lanes 4-7): disjoint.
* ``c = 1``, N = 3: microbatch m goes to worker m mod 3, and every worker meets both indexes: each packs all
  8 lanes (three times the tokenizing).
* ``c = 3``, N = 3: pieces are rows [0, 1), [1, 2), [2, 4); piece p goes to worker (3a + p) mod 3 = p: lanes
  {0, 4}, {1, 5}, {2, 3, 6, 7}, disjoint; the loader joins the three pieces of each microbatch.
* ``c = 2``, N = 4: pieces [0, 2), [2, 4); worker (2a + p) mod 4: lanes {0, 1}, {2, 3}, {4, 5}, {6, 7}.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd, lcm

import numpy as np

from zephon.errors import ConfigError
from zephon.executor.geometry import Geometry

#: The most rows (cycle steps × A × B) a partition inspects; past it a worker packs all of the rank's lanes.
MAX_CYCLE_ROWS = 1 << 22


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerShare:
    """One DataLoader worker's part of its rank's run (see the module docstring).

    Attributes:
        worker: this worker's index ``w`` (0 without a DataLoader).
        workers: DataLoader workers of the rank ``N`` (1 without one).
        pieces: items per microbatch ``c``.
        first: running number ``m₀`` of the iteration's first microbatch.
        microbatch: rows per microbatch ``B``.
        lanes: the lanes this worker packs, sorted (None for an exact plan).
    """

    worker: int
    workers: int
    pieces: int
    first: int
    microbatch: int
    lanes: tuple[int, ...] | None

    def rows(self, running: int) -> tuple[int, int] | None:
        """The rows ``[lo, hi)`` of microbatch ``running`` (``step·A + index``) this worker yields, or None.
        A worker yields at most one piece of a microbatch (``c ≤ N``)."""
        k = (running - self.first) * self.pieces  # the item of piece 0
        p = (self.worker - k) % self.workers
        if p >= self.pieces:
            return None
        b, c = self.microbatch, self.pieces
        return p * b // c, (p + 1) * b // c


def loader_pieces(accumulation: int, workers: int) -> int:
    """Items per microbatch of ``Pipeline.dataloader`` with ``workers`` workers: ``N / gcd(N, A)``."""
    return workers // gcd(workers, accumulation)


def worker_share(geometry: Geometry, *, worker: int, workers: int, pieces: int, first: int) -> WorkerShare:
    """Worker ``worker``'s share of its rank's run, the iteration starting at microbatch ``first``."""
    lanes = None
    if geometry.lanes is not None and workers == 1:
        lanes = tuple(geometry.my_lanes)
    elif geometry.lanes is not None:
        owned = worker_lanes(geometry, workers=workers, pieces=pieces, first=first)
        lanes = tuple(np.flatnonzero(owned[worker]).tolist())
    return WorkerShare(
        worker=worker, workers=workers, pieces=pieces, first=first, microbatch=geometry.microbatch, lanes=lanes
    )


def worker_lanes(geometry: Geometry, *, workers: int, pieces: int, first: int = 0) -> np.ndarray:
    """(N, L) bool: which lanes each worker packs — those its pieces take rows from over a whole cycle of steps
    (every rank lane for every worker when the cycle is too long to inspect)."""
    L, G, A, B = geometry.lanes, geometry.global_batch, geometry.accumulation, geometry.microbatch
    assert L is not None, "exact plans have no lanes"
    owned = np.zeros((workers, L), dtype=bool)
    steps = lcm(workers // gcd(workers, A * pieces), L // gcd(G, L))  # the item map and the lanes repeat
    if steps * A * B > MAX_CYCLE_ROWS:
        owned[:, geometry.my_lanes] = True
        return owned
    s = np.arange(steps, dtype=np.int64)[:, None, None]  # (steps, 1, 1)
    a = np.arange(A, dtype=np.int64)[None, :, None]  # (1, A, 1)
    i = np.arange(B, dtype=np.int64)[None, None, :]  # (1, 1, B)
    sequence = s * G + geometry.dp_rank + geometry.dp_size * (a * B + i)  # (steps, A, B): geometry's formula
    piece = np.searchsorted(np.arange(pieces) * B // pieces, i, side="right") - 1  # (1, 1, B): piece of row i
    item = (s * A + a - first) * pieces + piece  # (steps, A, B)
    owned[item % workers, sequence % L] = True
    return owned


def disjoint(owned: np.ndarray) -> bool:
    """Whether no lane is packed by two workers (``owned``: ``worker_lanes``)."""
    return bool((owned.sum(axis=0) <= 1).all())


def check_loader_workers(geometry: Geometry, workers: int) -> int:
    """``Pipeline.dataloader``'s pieces per microbatch for ``workers`` workers, after refusing a count that
    would leave a worker without rows or make two workers pack the same lane (one line, the counts that work)."""
    if geometry.lanes is None:
        return 1  # exact plans: every worker builds its own microbatches from the plan
    mine = len(geometry.my_lanes)
    if workers > mine or not _fits(geometry, workers):
        fit = [n for n in range(1, min(mine, 64) + 1) if _fits(geometry, n)]
        raise ConfigError(
            f"num_workers must split this rank's {mine} packing lanes (microbatches of {geometry.microbatch} rows, "
            f"{geometry.accumulation} per step) among workers that each own whole lanes, got {workers} — use "
            f"num_workers in {fit}, or Pipeline.to_torch_dataset() with a plain DataLoader (workers then repeat work)"
        )
    return loader_pieces(geometry.accumulation, workers)


def _fits(geometry: Geometry, workers: int) -> bool:
    pieces = loader_pieces(geometry.accumulation, workers)
    return pieces <= geometry.microbatch and disjoint(worker_lanes(geometry, workers=workers, pieces=pieces))
