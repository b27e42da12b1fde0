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

Streaming merge: each dataset's documents come from a ``zephon.planner.orders.Reader`` a window at a
time. Every generated document of dataset ``i`` has ``F ≤`` its reader's last generated finish time ``T_i``,
and every document not yet generated has ``F ≥ T_i``. So with ``T = min T_i``, all documents with ``F < T``
are known and can be placed, in order, before any later document is generated: the plan comes out a
chunk at a time, identical to sorting everything at once, in memory bounded by the readers' buffers.
Cumulative token counts are exact integers in float64 (below 2^53), so chunked sums equal one long sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from zephon.errors import ConfigError
from zephon.planner.orders import Reader

#: Documents each reader keeps buffered ahead of the placed prefix.
FILL = 1 << 18


def _budget(
    epoch_tokens: list[int], weights: list[float], *, passes: int, stop: bool, open_ended: bool
) -> tuple[float, list[int | None]]:
    """The last finish time the plan may place, and the epochs each dataset may read."""
    pass_finish = [passes * max(1, e) / w for e, w in zip(epoch_tokens, weights, strict=True)]
    limit = min(pass_finish) if stop else math.inf
    if open_ended:
        return limit, [passes if stop else None] * len(weights)
    horizon = min(limit, max(pass_finish))
    caps: list[int | None] = [
        max(1, int(np.ceil(horizon * w / max(1, e)))) + (0 if stop else 1)
        for e, w in zip(epoch_tokens, weights, strict=True)
    ]
    return horizon, caps


def schedule(
    reader: Callable[[int, int | None], Reader],
    epoch_tokens: list[int],
    weights: list[float],
    *,
    passes: int,
    stop: bool,
    num_documents: int | None,
    num_tokens: int | None,
) -> Iterator[tuple[np.ndarray, ...]]:
    """Yield the plan in order, in chunks of ``(dataset, shard, row, epoch, tokens)``.

    ``reader(i, max_epochs)`` opens dataset ``i``'s documents. Budget rules as in ``zephon.planner.layout``:
    with neither ``num_documents`` nor ``num_tokens``, every document whose finish time is at most
    ``min(stop limit, largest finish of E passes)``; otherwise the first documents up to the budget, never
    past the stop limit (the finish time at which the first dataset completes ``passes`` passes).
    """
    for i, e in enumerate(epoch_tokens):
        if e <= 0:
            raise ConfigError(
                f"a token mixture needs documents with tokens, got 0 tokens in dataset {i} — count tokens "
                "with BOS/EOS, or mix by samples"
            )
    open_ended = num_documents is not None or num_tokens is not None
    horizon, caps = _budget(epoch_tokens, weights, passes=passes, stop=stop, open_ended=open_ended)
    readers = [reader(i, cap) for i, cap in enumerate(caps)]
    carry = [0.0] * len(readers)  # tokens already placed per dataset
    placed_documents = placed_tokens = 0
    while True:
        finish = []
        for i, (r, w) in enumerate(zip(readers, weights, strict=True)):
            r.fill(FILL)
            finish.append((carry[i] + np.cumsum(r.peek(3), dtype=np.float64)) / w)
        live = [f[-1] for r, f in zip(readers, finish, strict=True) if not r.exhausted]
        bound = min(live, default=math.inf)
        final = bound > horizon
        counts = [
            int(np.searchsorted(f, horizon, side="right") if final else np.searchsorted(f, bound, side="left"))
            for f in finish
        ]
        if not final and not any(counts):
            # Every document buffered ends at the bound: read further in the readers that set it.
            for r, f in zip(readers, finish, strict=True):
                if not r.exhausted and f[-1] == bound:
                    r.grow()
            continue
        parts = [r.take(k) for r, k in zip(readers, counts, strict=True)]
        keys = np.concatenate([f[:k] for f, k in zip(finish, counts, strict=True)])
        dataset = np.concatenate([np.full(k, i, np.int16) for i, k in enumerate(counts)])
        # Runs are concatenated by dataset, each in reading order: a stable sort by finish time alone gives
        # (finish, dataset, reading order), merging the sorted runs.
        order = np.argsort(keys, kind="stable")
        cols = [dataset[order]] + [np.concatenate([p[c] for p in parts])[order] for c in range(4)]
        for i, p in enumerate(parts):
            carry[i] += float(p[3].sum())
        n = len(order)
        done = final
        if num_tokens is not None:
            reached = int(np.searchsorted(placed_tokens + np.cumsum(cols[4]), num_tokens, side="left"))
            if reached < n:
                n, done = reached + 1, True
        elif num_documents is not None and placed_documents + n >= num_documents:
            n, done = num_documents - placed_documents, True
        if n:
            yield tuple(c[:n] for c in cols)
        placed_documents += n
        placed_tokens += int(cols[4][:n].sum())
        if done:
            return
