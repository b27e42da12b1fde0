"""Documents ``long_documents="truncate"`` cut short, counted in ``RunStats`` as they are handed out.

A document longer than ``max_tokens`` is cut to it by that policy (``zephon.executor.encode.parts.reshape``):
the tokens past the limit are never trained on, so a run counts them, like every policy that leaves data out —
``RunStats.truncated`` (documents) and ``RunStats.truncated_tokens`` (tokens cut), per dataset.

Counted when handed out, as ``documents`` are: the encoder gives each document's cut (``Encoded.cut``); on the
caller's thread, as a chunk is dealt to the lanes (estimated plans) or taken into the cache (exact plans), the cut
documents are held by plan position (``add``); a batch handed out that holds a piece of one with ``doc_start`` 0 —
its first token, where it counts in ``documents`` — counts it (``count``). So read-ahead, read chunks, threads and
DataLoader workers never change the counts. A held document whose first token this process will not hand out (a
run resumed inside it; another worker's row holds it) is dropped once the run is past it (``drop_before``).

Invariant: after a whole run from the start, the documents counted are those of the run longer than the limit,
each once, and ``tokens + truncated_tokens`` per dataset is what the documents' tokens would be without the limit.

Example: ``max_tokens=4`` with BOS and EOS (a body of 2 tokens): a 9-token text of dataset ``web`` at plan
position 12 keeps 2 and has 7 cut. When a batch hands out position 12 with ``doc_start`` 0:
``truncated["web"] += 1`` and ``truncated_tokens["web"] += 7``.
"""

from __future__ import annotations

import numpy as np

from zephon.executor.settings import RunStats

__all__ = ["Truncations"]

_EMPTY = np.empty(0, dtype=np.int64)


class Truncations:
    """The cut documents not yet counted: their plan positions, datasets (indexes into the plan's names) and
    tokens cut, in three parallel arrays. Used on the caller's thread only."""

    __slots__ = ("_cut", "_datasets", "_positions")

    def __init__(self) -> None:
        self._positions, self._datasets, self._cut = _EMPTY, _EMPTY, _EMPTY

    def __len__(self) -> int:
        return len(self._positions)

    def add(self, positions: np.ndarray, datasets: np.ndarray, cut: np.ndarray | None) -> None:
        """Hold the documents at ``positions`` (of ``datasets``) that ``cut`` says were cut (None: none was); one
        already held (an exact plan's document fetched again) is held once."""
        if cut is None:
            return
        hit = np.flatnonzero(cut > 0)
        if len(self._positions) and len(hit):
            hit = hit[~np.isin(positions[hit], self._positions)]
        if not len(hit):
            return
        self._positions = np.concatenate([self._positions, np.asarray(positions, np.int64)[hit]])
        self._datasets = np.concatenate([self._datasets, np.asarray(datasets, np.int64)[hit]])
        self._cut = np.concatenate([self._cut, np.asarray(cut, np.int64)[hit]])

    def drop_before(self, position: int) -> None:
        """Forget documents before ``position``: the run is past them (their first token was handed out by
        another process, or before the state this run resumed from)."""
        if len(self._positions):
            self._keep(self._positions >= position)

    def count(self, stats: RunStats, names: list[str], pieces: np.ndarray) -> None:
        """Count in ``stats`` the held documents whose first token is among ``pieces`` (``PIECE_DTYPE``: a
        batch handed out), and forget them."""
        if not len(self._positions) or not len(pieces):
            return
        found = np.isin(self._positions, pieces["position"][pieces["doc_start"] == 0])
        if not found.any():
            return
        for dataset, cut in zip(self._datasets[found].tolist(), self._cut[found].tolist(), strict=True):
            stats.truncate(names[dataset], cut)
        self._keep(~found)

    def _keep(self, keep: np.ndarray) -> None:
        self._positions, self._datasets, self._cut = self._positions[keep], self._datasets[keep], self._cut[keep]
