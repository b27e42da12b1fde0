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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from zephon.errors import ConfigError
from zephon.planner.orders import Documents, Reader
from zephon.planner.phases import Stage
from zephon.planner.placement import Placement

#: Documents each reader keeps buffered ahead of the placed prefix.
FILL = 1 << 18


@dataclass(frozen=True, kw_only=True, slots=True)
class _Budget:
    """How far the first stage's merge may run, and how many epochs each dataset's reader may produce."""

    #: The last finish time the plan may place (``math.inf`` when only a document or token budget ends it).
    horizon: float
    #: Per dataset, the epochs its reader may read; None for no cap.
    max_epochs: tuple[int | None, ...]


def _budget(
    epoch_tokens: list[int],
    weights: list[float],
    consumed: list[int],
    *,
    passes: int,
    stop: bool,
    open_ended: bool,
    amount: int | None = None,
) -> _Budget:
    """The budget of the first stage's merge over datasets of ``epoch_tokens`` tokens per pass, of which
    ``consumed`` tokens were read before it (a continued plan's prefix; zeros otherwise).

    ``amount`` (a ``num_tokens``/``num_cost`` budget, less a prefix's): the plan ends with the document that brings
    its tokens to ``amount``, so dataset ``i`` places fewer than ``amount`` tokens before it plus at most one
    document (≤ ``epoch_tokens[i]``): its reader never needs more than ``ceil((consumed + amount) / epoch) + 1``
    passes. Capping it there (one more for margin) changes nothing placed, and keeps a tiny dataset from
    buffering ``FILL`` documents of thousands of passes."""
    pass_finish = [
        max(0, passes * max(1, e) - c) / w if w else math.inf  # w = 0: a continued plan's phase not reading it
        for e, w, c in zip(epoch_tokens, weights, consumed, strict=True)
    ]
    limit = min(pass_finish) if stop else math.inf
    if open_ended:
        caps: tuple[int | None, ...] = (passes if stop else None,) * len(weights)
        if amount is not None:
            need = [math.ceil((c + amount) / max(1, e)) + 2 for e, c in zip(epoch_tokens, consumed, strict=True)]
            caps = tuple(n if cap is None else min(cap, n) for cap, n in zip(caps, need, strict=True))
        return _Budget(horizon=limit, max_epochs=caps)
    horizon = min(limit, max(f for f, w in zip(pass_finish, weights, strict=True) if w))  # datasets read only
    caps = tuple(
        max(1, int(np.ceil((c + horizon * w) / max(1, e)))) + (0 if stop else 1)
        for e, w, c in zip(epoch_tokens, weights, consumed, strict=True)
    )
    return _Budget(horizon=horizon, max_epochs=caps)


def schedule(
    reader: Callable[[int, int | None], Reader],
    epoch_tokens: list[int],
    stages: Sequence[Stage],
    *,
    passes: int,
    stop: bool,
    num_documents: int | None,
    num_tokens: int | None,
    consumed: list[int] | None = None,
) -> Iterator[Placement]:
    """Yield the plan in order, a chunk of positions at a time (``tokens`` always set).

    ``reader(i, max_epochs)`` opens dataset ``i``'s documents. Budget rules as in ``zephon.planner.layout``:
    with neither ``num_documents`` nor ``num_tokens``, every document whose finish time is at most
    ``min(stop limit, largest finish of E passes)``; otherwise the first documents up to the budget, never
    past the stop limit (the finish time at which the first dataset completes ``passes`` passes).

    Stages (``zephon.planner.phases``): each runs the merge above from where the readers are, with its own
    weights and fresh finish times (a phase's shares count from its own start); it ends at the next stage's
    start (a position, or the document that reaches a token count) and the stop limit is measured from the
    tokens each dataset has left in its ``passes`` passes.

    ``consumed``: tokens per dataset read before the first stage (a continued plan's prefix, whose readers
    start after them; ``zephon.planner.segment``), counted against the ``passes`` passes.
    """
    for i, e in enumerate(epoch_tokens):
        if e <= 0:
            raise ConfigError(
                f"a token mixture needs documents with tokens, got 0 tokens in dataset {i} — count tokens "
                "with BOS/EOS, or mix by samples"
            )
    open_ended = num_documents is not None or num_tokens is not None
    if not open_ended and len(stages) > 1:
        raise ConfigError("phases must come with a num_documents or num_tokens budget, got none — set one")
    first = [float(f) for f in stages[0].fractions()]
    before = consumed if consumed is not None else [0] * len(epoch_tokens)
    budget = _budget(
        epoch_tokens, first, before, passes=passes, stop=stop, open_ended=open_ended, amount=num_tokens
    )
    horizon = budget.horizon
    merge = _Merge([reader(i, cap) for i, cap in enumerate(budget.max_epochs)])
    merge.consumed = list(before)
    for k, stage in enumerate(stages):
        later = stages[k + 1] if k + 1 < len(stages) else None
        end_documents = later.start_position if later is not None else num_documents
        end_tokens = later.start_tokens if later is not None else num_tokens
        weights = [float(f) for f in stage.fractions()]
        if open_ended and stop:
            horizon = min((passes * epoch_tokens[i] - merge.consumed[i]) / weights[i] for i in stage.active)
        yield from merge.run(weights, horizon, stage=stage.index, end_documents=end_documents, end_tokens=end_tokens)
        if merge.ended:
            return


class _Merge:
    """The WFQ merge over all datasets' readers, run one stage at a time."""

    def __init__(self, readers: list[Reader]) -> None:
        self.readers = readers
        self.documents = 0  # placed so far, all stages
        self.tokens = 0
        self.consumed = [0] * len(readers)  # tokens placed per dataset, all stages
        self.ended = False  # the plan ended (stop limit or epochs budget) before the stage's end

    def run(
        self,
        weights: list[float],
        horizon: float,
        *,
        stage: int,
        end_documents: int | None,
        end_tokens: int | None,
    ) -> Iterator[Placement]:
        """Place documents by finish time with ``weights`` until ``end_documents`` positions or the document
        that reaches ``end_tokens`` tokens (in the whole plan), or the ``horizon``; as placements of
        ``stage``."""
        active = [i for i, w in enumerate(weights) if w > 0]
        readers = [self.readers[i] for i in active]
        w = [weights[i] for i in active]
        carry = [0.0] * len(active)  # tokens this stage placed per active dataset
        while True:
            if (end_documents is not None and self.documents >= end_documents) or (
                end_tokens is not None and self.tokens >= end_tokens
            ):
                return
            finish = []
            for j, r in enumerate(readers):
                r.fill(FILL)
                finish.append((carry[j] + np.cumsum(r.peek("tokens"), dtype=np.float64)) / w[j])
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
            keys = np.concatenate([f[:k] for f, k in zip(finish, counts, strict=True)])
            tokens = np.concatenate([r.peek("tokens")[:k] for r, k in zip(readers, counts, strict=True)])
            slot = np.concatenate([np.full(k, j, np.int16) for j, k in enumerate(counts)])
            # Runs are concatenated by dataset, each in reading order: a stable sort by finish time alone gives
            # (finish, dataset, reading order), merging the sorted runs.
            order = np.argsort(keys, kind="stable")
            n = len(order)
            done = final
            if end_tokens is not None:
                reached = int(np.searchsorted(self.tokens + np.cumsum(tokens[order]), end_tokens, side="left"))
                if reached < n:
                    n, done = reached + 1, True
            elif end_documents is not None and self.documents + n >= end_documents:
                n, done = end_documents - self.documents, True
            if n < len(order):
                # The first n of a stable merge are a prefix of each run: take only those, merge them again.
                counts = np.bincount(slot[order[:n]], minlength=len(readers)).tolist()
                keys = np.concatenate([f[:k] for f, k in zip(finish, counts, strict=True)])
                slot = np.concatenate([np.full(k, j, np.int16) for j, k in enumerate(counts)])
                order = np.argsort(keys, kind="stable")
            parts = [r.take(k) for r, k in zip(readers, counts, strict=True)]
            for j, p in enumerate(parts):
                assert p.tokens is not None, "a token mixture's readers have token counts"
                placed = int(p.tokens.sum())
                carry[j] += float(placed)
                self.consumed[active[j]] += placed
            # Runs concatenated by dataset; ``order`` gathers them into plan order.
            runs = Documents.concat(parts)
            assert runs.tokens is not None
            ordered_tokens = runs.tokens[order]
            if n:
                yield Placement(
                    stage=stage,
                    dataset_id=np.asarray(active, np.int16)[slot][order],
                    shard_id=runs.shard_id[order],
                    row=runs.row[order],
                    epoch=runs.epoch[order],
                    tokens=ordered_tokens,
                )
            self.documents += n
            self.tokens += int(ordered_tokens.sum())
            if final:
                self.ended = True
            if done:
                return
