"""The spot check: a seeded sample of the run's documents re-encoded with ``tokenizers`` and compared, id for id.

The engine was verified on probes and on the run's first documents (``zephon.executor.engines.choose``); a
document deep in the run that the probes did not foresee could still get other ids. So every encoded batch
passes here before its ids are used: each document is picked with probability ``FRACTION`` by a generator
seeded with ``SEED`` and the batch's own shape (its number of documents and characters) — the same batch is
checked the same way in every run, on every thread, whatever the order of the calls — and the picked ones are
encoded again by ``tokenizers`` on the calling thread. A difference raises ``EngineMismatch`` with the index of
the document in the batch; the executor turns it into one line naming dataset, shard, row and engine, and the
engine's refusal is cached, so the next run picks another engine.

Cost: ``tokenizers`` on one thread runs at 1/3 to 1/40 of a fast engine's speed (DeepSeek V4 on fastokens: 1/40),
so checking 1/256 of the documents could cost up to 16 % of the encoding. A budget bounds it: a picked document
is checked only while the check's CPU time is within ``BUDGET`` (2 %) of the encoding's so far (the caller adds
it: ``encoded``); the picks past it are counted as ``deferred``. The sample is seeded; which picks fit the budget
depends on timing, never the data. ``benchmarks/bench_engine_safety.py`` measures the share.

Example: a batch of 1,000 documents of 2,000 characters, ``FRACTION`` 1/256 → about 4 documents picked; the
encoding so far took 10 CPU s and the check 0.15 s, within 2 % → they are re-encoded, their ids equal the
engine's → the batch goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import TokenizerError
from zephon.executor.engines.base import TokenIds
from zephon.plan.records import ShardRef

#: Share of the documents picked (each independently with this probability).
FRACTION = 1 / 256
#: The check's CPU budget: picked documents are checked while the check's CPU time stays within this share of the
#: CPU time spent encoding so far; picks past it are counted (``deferred``), not checked.
BUDGET = 0.02
#: The sample's seed (with each batch's document and character counts).
SEED = 20261202


class EngineMismatch(TokenizerError):
    """The engine's ids for document ``index`` of a batch differ from ``tokenizers``'. The executor adds where
    the document comes from (``located``)."""

    def __init__(self, message: str, *, engine: str, index: int, detail: str) -> None:
        super().__init__(message)
        self.engine, self.index, self.detail = engine, index, detail

    def at(self, index: int) -> EngineMismatch:
        """The same mismatch at another index (the caller's order of the batch)."""
        where = f"document {index} of a batch"
        return EngineMismatch(
            mismatch_message(self.engine, where, self.detail), engine=self.engine, index=index, detail=self.detail
        )

    def located(self, ref: ShardRef, row: int) -> EngineMismatch:
        """The same mismatch, its message naming the document: dataset, shard and row."""
        where = f"dataset {ref.dataset!r}: shard {ref.uri} row {row}"
        return EngineMismatch(
            mismatch_message(self.engine, where, self.detail), engine=self.engine, index=self.index, detail=self.detail
        )


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

    def picks(self, texts: Sequence[str]) -> np.ndarray:
        """Indices of the batch's documents to check (seeded by the batch's shape, so always the same)."""
        chars = sum(map(len, texts))
        draws = np.random.default_rng((SEED, len(texts), chars)).random(len(texts))
        return np.flatnonzero(draws < self.fraction)

    def check(self, texts: Sequence[str], got: TokenIds, engine: str) -> None:
        """Raise ``EngineMismatch`` if a picked document's ids (without BOS/EOS) differ from ``tokenizers``'."""
        picked = self.picks(texts)
        if not len(picked):
            return
        if self.seconds > self.budget * self.encoding_seconds:
            with self._lock:
                self.deferred += len(picked)
            return
        start = time.thread_time()
        ends = np.cumsum(got.sizes)
        for i in picked.tolist():
            ids = got.ids[ends[i] - got.sizes[i] : ends[i]]
            try:
                want = np.asarray(self.reference.encode(texts[i], add_special_tokens=False).ids, dtype=np.int64)
            except Exception as exc:  # tokenizers refuses what the engine encoded
                detail = f"tokenizers refuses this text ({type(exc).__name__}), the engine encoded it"
            else:
                if len(ids) == len(want) and np.array_equal(ids, want):
                    continue
                differ = np.flatnonzero(ids[: len(want)] != want[: len(ids)])
                at = int(differ[0]) if len(differ) else min(len(ids), len(want))
                detail = f"{len(ids)} tokens against {len(want)}, first difference at token {at}"
            where = f"document {i} of a batch"
            raise EngineMismatch(mismatch_message(engine, where, detail), engine=engine, index=i, detail=detail)
        with self._lock:
            self.documents += len(picked)
            self.characters += sum(len(texts[i]) for i in picked.tolist())
            self.seconds += time.thread_time() - start
