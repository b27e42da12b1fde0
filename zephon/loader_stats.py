"""``Pipeline.stats()`` through ``Pipeline.dataloader()``: what the loader handed out, from any number of workers.

Why: a DataLoader worker counts the batches it makes in a ``RunStats`` of its own process, which the loader's
process cannot read, and a worker makes its pieces ahead of training (``prefetch_factor``). So each piece carries
its worker's counts *after* it, and the loader takes them when it hands the piece out — never when it is made.

Algorithm: a worker's ``StatsSender`` gives each piece a ``StatsPiece`` — the worker's cumulative documents and
tokens per dataset (two tuples in the plan's dataset order: every runner ``include``s every dataset, so the order
is the same in every worker) and, only when any of the rarer counts changed since its previous piece (skipped
or truncated documents, short rows, the engine, the spot check), a copy of its whole ``RunStats``. ``HandedStats``
keeps, per worker, the counts of the last piece handed out and the last copy seen; ``stats()`` sums them over the
workers.
The counts a runner makes after its last batch (documents skipped at the end of the plan, ``lanes_cut``, the
spot check's totals) come with the worker's last item (``final``) and count once the iteration has ended.
Cost: two tuples a piece (~1 µs to copy and pickle); a full copy only when a rare count changed.

Invariant: after the loader hands out microbatch ``m``, ``stats()`` equals ``Pipeline.stats()`` after iterating
the pipeline itself to ``m`` — for any ``num_workers``, ``prefetch_factor`` and ``pin_memory``; after the last,
its stats after the whole iteration.

Example: 2 workers, datasets (web, code); worker 0's piece of microbatch 5 says documents (10, 3), tokens
(20000, 9000); worker 1's piece of microbatch 5 says (12, 1), (21000, 4000) → after microbatch 5 is handed out,
``documents == {"web": 22, "code": 4}``, ``tokens == {"web": 41000, "code": 13000}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zephon.executor.settings import RunStats
from zephon.tuple_pickling import tuple_pickled

__all__ = ["HandedStats", "StatsPiece", "StatsSender", "copy_stats", "merge_stats"]


@tuple_pickled
@dataclass(frozen=True, slots=True)
class StatsPiece:
    """A worker's counts after one of its pieces: documents and tokens per dataset (the ``RunStats`` dicts' values,
    in their order), and the whole ``RunStats`` when a rarer count changed since its previous piece (else None)."""

    documents: tuple[int, ...]
    tokens: tuple[int, ...]
    full: RunStats | None = None


def copy_stats(stats: RunStats) -> RunStats:
    """A copy of ``stats`` that later counting does not change."""
    return dataclasses.replace(
        stats,
        documents=dict(stats.documents),
        tokens=dict(stats.tokens),
        skipped=dict(stats.skipped),
        truncated=dict(stats.truncated),
        truncated_tokens=dict(stats.truncated_tokens),
        skipped_by_shard={uri: dict(reasons) for uri, reasons in stats.skipped_by_shard.items()},
        refused_engines=dict(stats.refused_engines),
    )


def _rare(stats: RunStats) -> tuple[object, ...]:
    """What changes when a rarer count does (``skipped_by_shard`` changes with ``skipped``)."""
    return (
        sum(stats.skipped.values()),
        sum(stats.truncated.values()),
        stats.short_rows,
        stats.lanes_cut,
        stats.tokenizer_engine,
        len(stats.refused_engines),
        stats.spot_checked,
        stats.spot_check_seconds,
    )


class StatsSender:
    """A worker's side: the ``StatsPiece`` of its counts after each piece it makes."""

    def __init__(self, stats: RunStats) -> None:
        self.stats = stats
        self._rare: tuple[object, ...] | None = None

    def piece(self) -> StatsPiece:
        stats, rare = self.stats, _rare(self.stats)
        full = None
        if rare != self._rare:
            self._rare, full = rare, copy_stats(stats)
        return StatsPiece(tuple(stats.documents.values()), tuple(stats.tokens.values()), full)


def merge_stats(parts: list[RunStats]) -> RunStats:
    """The counts of several workers' ``RunStats`` together: documents, tokens, skipped documents (by reason and
    shard), truncated documents and tokens, short rows, cut lanes and spot-checked documents summed; the engine and
    its refusals are every worker's own (the same tokenizer and engines), taken from the first that has them."""
    out = RunStats()
    for part in parts:
        for mine, theirs in (
            (out.documents, part.documents),
            (out.tokens, part.tokens),
            (out.skipped, part.skipped),
            (out.truncated, part.truncated),
            (out.truncated_tokens, part.truncated_tokens),
        ):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0) + value
        for uri, reasons in part.skipped_by_shard.items():
            shard = out.skipped_by_shard.setdefault(uri, {})
            for reason, value in reasons.items():
                shard[reason] = shard.get(reason, 0) + value
        out.tokenizer_engine = out.tokenizer_engine or part.tokenizer_engine
        out.refused_engines = out.refused_engines or dict(part.refused_engines)
        out.spot_checked += part.spot_checked
        out.spot_check_seconds += part.spot_check_seconds
        out.short_rows += part.short_rows
        out.lanes_cut += part.lanes_cut
        out.tokens_cut += part.tokens_cut
    return out


class HandedStats:
    """The loader's side: each worker's counts after its last piece handed out, and after its whole run once the
    iteration has ended (``finish``)."""

    def __init__(self) -> None:
        self._counts: dict[int, StatsPiece] = {}
        self._full: dict[int, RunStats] = {}
        self._final: dict[int, RunStats] = {}

    def took(self, worker: int, piece: StatsPiece | None) -> None:
        """Worker ``worker``'s piece was handed out, with its counts ``piece``."""
        if piece is None:
            return
        self._counts[worker] = piece
        if piece.full is not None:
            self._full[worker] = piece.full

    def finish(self, finals: dict[int, RunStats]) -> None:
        """The iteration ended: each worker's ``RunStats`` after its run (whatever it counted after its last batch)."""
        self._final = {w: copy_stats(s) for w, s in finals.items()}

    def stats(self) -> RunStats:
        """Every worker's counts, summed (``merge_stats``)."""
        parts = []
        for worker in sorted(self._counts.keys() | self._final.keys()):
            final = self._final.get(worker)
            if final is not None:
                parts.append(final)
                continue
            counts, full = self._counts[worker], self._full.get(worker, RunStats())
            names = list(full.documents)
            part = copy_stats(full)
            part.documents = dict(zip(names, counts.documents, strict=True))
            part.tokens = dict(zip(names, counts.tokens, strict=True))
            parts.append(part)
        return merge_stats(parts)
