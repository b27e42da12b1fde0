"""The spot check: a seeded sample of the run's documents re-encoded with ``tokenizers`` and compared, id for id.

The engine was verified on probes and on the run's first documents (``zephon.executor.engines.choose``); a
document deep in the run that the probes did not foresee could still get other ids. So every encoded batch
passes here before its ids are used: each document is picked with probability ``FRACTION``, seeded by ``SEED``
and the batch's own shape (its number of documents and the number of ids the engine gave them) — the same batch
is checked the same way in every run, on every thread, whatever the order of the calls — and the picked ones are
encoded again by ``tokenizers`` on the calling thread. A difference raises ``EngineMismatch`` with the index of
the document in the batch; the executor turns it into one line naming dataset, shard, row and engine, and the
engine's refusal is cached, so the next run picks another engine.

The sample without a generator per batch: ``PERIOD`` seeded uniform draws are made once per process, and the
positions of those below ``FRACTION`` kept (``_hits``, ~4,096 of 2**20). A batch of ``n`` documents reads the
window of ``n`` draws that starts at an offset hashed from its shape, so within a batch every document is picked
independently with probability ``FRACTION``; its picks are the hits inside that window, found by two binary
searches (~3 µs), where a generator seeded per batch, a draw per document and a sum of the texts' lengths cost
~50 µs a batch of 1,024 (0.6 ns a token on the tokens plan of ``bench_stages.py``: 2 % of the engine by
themselves).

Cost: ``tokenizers`` on one thread runs at 1/3 to 1/40 of a fast engine's speed (DeepSeek V4 on fastokens: 1/40),
so checking 1/256 of the documents could cost up to 16 % of the encoding. A budget bounds it by CPU time: a
pick is checked only while the check's thread CPU time (all of it: picks, comparisons, the re-encoding) plus what
the pick is expected to cost (its characters × the check's CPU a character so far: one long code file checked
whole cost up to 14 ms) stays within ``BUDGET`` (2 %) of the engine's CPU time so far (the caller adds it,
``encoded``: each slice's thread CPU, ``zephon.executor.engines.base.encode_timed`` — never the wall time, which a
loaded machine stretches; an engine's own helper threads are not seen — fastokens runs about a third of each call
on one — so the budget is a little tighter than 2 % of its whole CPU); the picks past it are counted as
``deferred``. The first pick of a run is checked whatever it costs. The sample is seeded;
which picks fit the budget depends on timing, never the data. ``benchmarks/bench_engine_safety.py`` and
``benchmarks/bench_stages.py`` measure the share.

Example: a batch of 1,000 documents given 400,000 ids, ``FRACTION`` 1/256 → about 4 documents picked; the
encoding so far took 10 CPU s and the check 0.15 s for 600,000 characters (0.25 µs a character): a pick of 8,000
characters is expected to cost 2 ms, within the 0.05 s left of 2 % → re-encoded; its ids equal the engine's →
the batch goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import TokenizerError
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.engines.base import TokenIds

#: Share of the documents picked (each independently with this probability).
FRACTION = 1 / 256
#: The check's CPU budget: picked documents are checked while the check's CPU time stays within this share of the
#: CPU time spent encoding so far; picks past it are counted (``deferred``), not checked.
BUDGET = 0.02
#: The sample's seed (with each batch's document and id counts).
SEED = 20261202
#: Draws made once per process; a batch reads a window of them (a batch of more documents is drawn for on its own).
PERIOD = 1 << 20
_HITS: dict[float, np.ndarray] = {}


def _hits(fraction: float) -> np.ndarray:
    """The positions of the ``PERIOD`` seeded draws below ``fraction`` (made once per process and fraction)."""
    hits = _HITS.get(fraction)
    if hits is None:
        hits = _HITS[fraction] = np.flatnonzero(np.random.default_rng(SEED).random(PERIOD) < fraction)
    return hits


def _offset(count: int, tokens: int) -> int:
    """Where a batch's window of draws starts: a 64-bit mix of its shape (the same in every process)."""
    x = (count * 0x9E3779B97F4A7C15 + tokens * 0xC2B2AE3D27D4EB4F + SEED) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 31)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 29)) % PERIOD


class EngineMismatch(TokenizerError, AtDocument):
    """The engine's ids for document ``index`` of a batch differ from ``tokenizers``'. The executor adds where
    the document comes from (``located``)."""

    def __init__(self, message: str, *, engine: str, index: int, detail: str) -> None:
        super().__init__(message)
        self.engine, self.index, self.detail = engine, index, detail

    def relabel(self, where: str, index: int) -> EngineMismatch:
        message = mismatch_message(self.engine, where, self.detail)
        return EngineMismatch(message, engine=self.engine, index=index, detail=self.detail)


def mismatch_message(engine: str, where: str, detail: str) -> str:
    return (
        f"tokenizer engine {engine} must give tokenizers' ids, got other ids for {where} ({detail}) — the run "
        f"stopped before using them and {engine} is refused for this tokenizer from now on: rerun (the next "
        f"fastest verified engine is picked), or set ZEPHON_TOKENIZER_ENGINE=tokenizers"
    )


class SpotCheck:
    """Compares a seeded sample of each batch with ``tokenizers`` (``check``); counts what it checked."""

    def __init__(self, reference: Tokenizer, *, fraction: float | None = None) -> None:
        self.reference = reference
        self.fraction = FRACTION if fraction is None else fraction
        self._lock = threading.Lock()
        self.budget = BUDGET
        #: documents checked, their characters, the thread CPU seconds spent checking, picks skipped by the budget
        self.documents = 0
        self.characters = 0
        self.seconds = 0.0
        self.deferred = 0
        #: CPU seconds spent encoding (``encoded``), which the budget is a share of
        self.encoding_seconds = 0.0

    def encoded(self, seconds: float) -> None:
        """Add the CPU time of an encoding (the budget grows with it)."""
        with self._lock:
            self.encoding_seconds += seconds

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def picks(self, count: int, tokens: int) -> np.ndarray:
        """Indices of a batch's documents to check, from its shape — ``count`` documents given ``tokens`` ids by the
        engine — so always the same for the same batch. Example: ``picks(1024, 80_000)`` → about 4 indices."""
        if self.fraction >= 1:
            return np.arange(count, dtype=np.int64)
        if count > PERIOD:  # a batch longer than the window: drawn for on its own
            return np.flatnonzero(np.random.default_rng((SEED, count, tokens)).random(count) < self.fraction)
        hits, start = _hits(self.fraction), _offset(count, tokens)
        end = start + count  # the window [start, end) of the draws, wrapping past PERIOD
        lo, hi = hits.searchsorted(start), hits.searchsorted(min(end, PERIOD))
        at = hits[lo:hi] - start
        if end > PERIOD:
            at = np.concatenate([at, hits[: hits.searchsorted(end - PERIOD)] + (PERIOD - start)])
        return at

    def check(self, texts: Sequence[str], got: TokenIds, engine: str) -> None:
        """Raise ``EngineMismatch`` if a picked document's ids (without BOS/EOS) differ from ``tokenizers``'."""
        start = time.thread_time()  # from here: picking counts toward the budget too
        picked = self.picks(len(texts), len(got.ids))
        if not len(picked):
            self._spent(start)
            return
        room = self.budget * self.encoding_seconds - self.seconds
        rate = self.seconds / self.characters if self.characters else 0.0  # CPU s a character checked, so far
        ends = np.cumsum(got.sizes)
        checked, deferred, characters = 0, 0, 0
        for i in picked.tolist():
            first = not (checked or self.documents)  # the run's first pick is checked whatever it costs
            if room < 0 or (not first and rate * len(texts[i]) > room - (time.thread_time() - start)):
                deferred += 1  # over the budget, or expected to go over it
                continue
            ids = got.ids[ends[i] - got.sizes[i] : ends[i]]
            try:
                want = np.asarray(self.reference.encode(texts[i], add_special_tokens=False).ids, dtype=np.int64)
            except Exception as exc:  # tokenizers refuses what the engine encoded
                detail = f"tokenizers refuses this text ({type(exc).__name__}), the engine encoded it"
            else:
                if len(ids) == len(want) and np.array_equal(ids, want):
                    checked, characters = checked + 1, characters + len(texts[i])
                    continue
                differ = np.flatnonzero(ids[: len(want)] != want[: len(ids)])
                at = int(differ[0]) if len(differ) else min(len(ids), len(want))
                detail = f"{len(ids)} tokens against {len(want)}, first difference at token {at}"
            where = f"document {i} of a batch"
            raise EngineMismatch(mismatch_message(engine, where, detail), engine=engine, index=i, detail=detail)
        with self._lock:
            self.documents += checked
            self.characters += characters
            self.deferred += deferred
        self._spent(start)

    def _spent(self, start: float) -> None:
        with self._lock:
            self.seconds += time.thread_time() - start
