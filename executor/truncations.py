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

#: Held documents past which ``drop_before`` looks for ones to forget (then twice what is left, at least this).
DROP_AT = 4096


class Truncations:
    """The cut documents not yet counted: plan position → (dataset index into the plan's names, tokens cut). A
    batch looks up its first pieces' positions (a few dozen), so counting costs ~0.1 µs a piece however many are
    held (``np.isin`` over the held ones cost ~25 µs a batch). Used on the caller's thread only."""

    __slots__ = ("_held", "_limit")

    def __init__(self) -> None:
        self._held: dict[int, tuple[int, int]] = {}
        self._limit = DROP_AT

    def __len__(self) -> int:
        return len(self._held)

    def add(self, positions: np.ndarray, datasets: np.ndarray, cut: np.ndarray | None) -> None:
        """Hold the documents at ``positions`` (of ``datasets``) that ``cut`` says were cut (None: none was); one
        already held (an exact plan's document fetched again) is held once."""
        if cut is None:
            return
        hit = np.flatnonzero(cut > 0)
        if len(hit):
            held = self._held
            for position, dataset, tokens in zip(
                positions[hit].tolist(), datasets[hit].tolist(), cut[hit].tolist(), strict=True
            ):
                held.setdefault(position, (dataset, tokens))

    def drop_before(self, position: int) -> None:
        """Forget documents before ``position``: the run is past them (their first token was handed out by
        another process, or before the state this run resumed from). Looked at only once more than ``_limit``
        are held: the documents a run holds are those of its lanes' buffers, so this is rare."""
        if len(self._held) > self._limit:
            self._held = {p: v for p, v in self._held.items() if p >= position}
            self._limit = max(DROP_AT, 2 * len(self._held))

    def count(self, stats: RunStats, names: list[str], pieces: np.ndarray) -> None:
        """Count in ``stats`` the held documents whose first token is among ``pieces`` (``PIECE_DTYPE``: a
        batch handed out), and forget them."""
        if not self._held or not len(pieces):
            return
        held = self._held
        for position in pieces["position"][pieces["doc_start"] == 0].tolist():
            found = held.pop(position, None)
            if found is not None:
                stats.truncate(names[found[0]], found[1])
