"""Token-share interleaving: the dataset furthest behind its token target goes next.

Each dataset ``i`` reads its documents in its own epoch order; let ``C_i(k)`` be the tokens of its first
``k`` documents. Its ``k``-th document gets the virtual finish time ``F = C_i(k) / w_i``, and the plan is all
documents sorted by ``F`` (ties: lower dataset index first, then reading order). This is weighted fair
queueing: taking documents in order of ``F`` always serves the dataset whose token count is furthest behind
``w_i × total``.

Invariant: in every prefix, dataset ``i``'s tokens ``T_i`` satisfy
``w_i·F* − L_i < T_i ≤ w_i·F*``, where ``F*`` is the prefix's last finish time and ``L_i`` is the length of
``i``'s next document; so each share deviates from its target by at most about one document's tokens,
and a window of ``W`` tokens holds each share within ``(L_max,i + L_max,j)/W``.

Worked example, weights a 0.5 / b 0.5, a's documents 10, 10, 10 tokens, b's 30, 30: finish times
a: 20, 40, 60; b: 60, 120. Order: a(20) a(40) a(60) b(60) b(120) — after 4 documents both have 30 tokens.

The streams are generated lazily, one epoch at a time, until the budget is met: only documents whose
finish time is at most every generated stream's last finish time are placed, so more epochs never
reorder an already placed prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Stream:
    """One dataset's documents in reading order, extended an epoch at a time."""

    next_epoch: Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]]  # epoch → (shard, row, tokens)
    epoch_tokens: int
    shard: list[np.ndarray] = field(default_factory=list)
    row: list[np.ndarray] = field(default_factory=list)
    epoch: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return len(self.shard)

    def extend_to(self, epochs: int) -> None:
        while self.epochs < epochs:
            s, r, t = self.next_epoch(self.epochs)
            self.shard.append(s)
            self.row.append(r)
            self.epoch.append(np.full(len(s), self.epochs, dtype=np.int32))
            self.tokens.append(t)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.concatenate(self.shard),
            np.concatenate(self.row),
            np.concatenate(self.epoch),
            np.concatenate(self.tokens),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Merged:
    """The plan in global order."""

    dataset: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    epoch: np.ndarray
    tokens: np.ndarray


def merge(streams: list[Stream], weights: list[float], horizon: float) -> Merged:
    """All generated documents with finish time ≤ ``horizon``, in finish-time order."""
    parts = []
    for i, (s, w) in enumerate(zip(streams, weights, strict=True)):
        shard, row, epoch, tokens = s.arrays()
        finish = np.cumsum(tokens, dtype=np.float64) / w
        keep = finish <= horizon
        parts.append(
            (np.full(int(keep.sum()), i, np.int16), shard[keep], row[keep], epoch[keep], tokens[keep], finish[keep])
        )
    dataset = np.concatenate([p[0] for p in parts])
    finish = np.concatenate([p[5] for p in parts])
    order = np.lexsort((np.arange(len(finish)), dataset, finish))
    return Merged(
        dataset=dataset[order],
        shard=np.concatenate([p[1] for p in parts])[order],
        row=np.concatenate([p[2] for p in parts])[order],
        epoch=np.concatenate([p[3] for p in parts])[order],
        tokens=np.concatenate([p[4] for p in parts])[order],
    )


def schedule(
    streams: list[Stream],
    weights: list[float],
    *,
    passes: int,
    stop: bool,
    num_documents: int | None,
    num_tokens: int | None,
) -> Merged:
    """Place documents by finish time under the budget rules of ``zephon.planner.build``."""
    pass_finish = [passes * s.epoch_tokens / w for s, w in zip(streams, weights, strict=True)]
    limit = min(pass_finish) if stop else float("inf")
    if num_documents is None and num_tokens is None:
        horizon = min(limit, max(pass_finish))
        for s, w in zip(streams, weights, strict=True):
            s.extend_to(max(1, int(np.ceil(horizon * w / s.epoch_tokens))) + (0 if stop else 1))
        return merge(streams, weights, horizon)
    # Open-ended budgets: grow every stream until the safely placed prefix covers the budget.
    epochs = 1
    while True:
        for s in streams:
            s.extend_to(min(epochs, passes) if stop else epochs)
        safe = min(s.epochs * s.epoch_tokens / w for s, w in zip(streams, weights, strict=True))
        merged = merge(streams, weights, min(safe, limit))
        n = len(merged.dataset)
        if num_tokens is not None:
            reached = np.searchsorted(np.cumsum(merged.tokens), num_tokens, side="left")
            if reached < n or safe >= limit:
                n = min(n, int(reached) + 1)
                break
        elif n >= (num_documents or 0) or safe >= limit:
            n = min(n, num_documents or n)
            break
        epochs *= 2
    return Merged(
        dataset=merged.dataset[:n],
        shard=merged.shard[:n],
        row=merged.row[:n],
        epoch=merged.epoch[:n],
        tokens=merged.tokens[:n],
    )
