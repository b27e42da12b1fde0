"""The tokenizer-engine interface: encode a batch of texts to token ids, exactly as Hugging Face ``tokenizers``.

An engine is built from a tokenizer.json's text and encodes a batch of texts the way
``Tokenizer.encode_batch_fast(texts, add_special_tokens=False)`` does: no post-processor tokens (the
``Encoder`` adds the plan's BOS and EOS itself), added tokens written in a text encoded as those tokens. The
result is ``TokenIds``: every text's ids one after the other in one array, plus how many each has — no Python
object per document.

``Engine.encode`` runs on the calling thread (``engine.own_threads`` engines fan out to threads of their own);
``encode_on(pool, texts, threads)`` splits a batch into contiguous slices of about equal characters, one per
thread, the calling thread taking the last. Example: 1,000 texts on 2 threads → texts[:k] on the pool,
texts[k:] here, where the first k hold about half the characters; the slices' ids are concatenated in order,
so the result is the same on any number of threads. ``encode_timed`` is the same call that also says how much CPU
it took: each slice's thread CPU clock, summed (``Engine.encode_cpu``; a confined engine reads the clock of the
thread that owns it), which the spot check's budget is a share of (``zephon.executor.engines.spot_check``).

An engine may raise on a text ``tokenizers`` refuses too (a lone surrogate from a JSONL ``"\\ud800"``
escape); the ``Encoder`` then encodes that batch with ``tokenizers``, which gives its own ids or its own error.
"""

from __future__ import annotations

import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

import numpy as np


class EngineUnavailable(Exception):
    """The engine cannot run this tokenizer here (not installed, or refuses it); the message says why.

    ``lasting``: the engine's own library refused this tokenizer.json (a parse error, an unsupported model or
    pre-tokenizer, a tiktoken table that is not exact) — a function of the content and the engine's version, the
    same in every process, so ``zephon.executor.engines.choose`` caches it as a refusal instead of loading the
    file again (0.8 s for fastokens on a 128k-token BPE) on every start. Not lasting: not installed, or the
    load ran out of memory — tried again next time."""

    def __init__(self, message: str, *, lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting


@dataclass(frozen=True, slots=True)
class TokenIds:
    """Token ids of a batch of texts: ``ids`` (uint32 or int64) holds each text's ids in order, ``sizes``
    (int64) how many each has."""

    ids: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)

    def split(self) -> list[np.ndarray]:
        """One view of ``ids`` per text."""
        ends = np.cumsum(self.sizes)
        return [self.ids[a:b] for a, b in zip((ends - self.sizes).tolist(), ends.tolist(), strict=True)]

    @staticmethod
    def empty() -> TokenIds:
        return TokenIds(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))

    @staticmethod
    def concat(parts: Sequence[TokenIds]) -> TokenIds:
        if len(parts) == 1:
            return parts[0]
        ids = [p.ids for p in parts]
        common = np.result_type(*ids) if ids else np.int64
        return TokenIds(np.concatenate(ids).astype(common, copy=False), np.concatenate([p.sizes for p in parts]))


def from_lists(lists: Sequence[Sequence[int]]) -> TokenIds:
    """``TokenIds`` of per-text lists of ids (engines whose Python API returns lists)."""
    sizes = np.fromiter(map(len, lists), np.int64, len(lists))
    ids = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(sizes.sum()))
    return TokenIds(ids, sizes)


class Engine(ABC):
    """One way of running a tokenizer.json. Subclasses set ``name`` (what ``ZEPHON_TOKENIZER_ENGINE`` and
    ``Pipeline.stats()`` call it) and ``package`` (the distribution whose version keys a cached verdict)."""

    name: ClassVar[str]
    package: ClassVar[str]
    #: The engine spreads one call over threads of its own (``tokenizers``' Rayon pool): never sliced.
    own_threads: ClassVar[bool] = False
    #: Calls on several Python threads run at once (the engine releases the GIL while it encodes).
    releases_gil: ClassVar[bool] = True
    #: Its loader has crashed a process (``zephon.executor.engines.trial``): the first load of each tokenizer runs
    #: in a trial process. The others were seen to refuse what they cannot load with an exception.
    crash_prone: ClassVar[bool] = False
    #: Its objects are unsafe on threads other than the one that built them (kitoken: a run crashed when that
    #: thread had exited): built, called and freed on one thread of its own (``zephon.executor.engines.owned``).
    confined: ClassVar[bool] = False

    def __init__(self, config_text: str) -> None:
        self.config_text = config_text

    @abstractmethod
    def encode(self, texts: Sequence[str]) -> TokenIds:
        """The ids of ``texts`` on this thread (``add_special_tokens=False``); may raise on invalid text."""

    def encode_cpu(self, texts: Sequence[str]) -> tuple[TokenIds, float]:
        """``encode(texts)`` and the CPU seconds it took: the calling thread's clock (an engine that runs the call on
        another thread reads that thread's)."""
        start = time.thread_time()
        got = self.encode(texts)
        return got, time.thread_time() - start

    def close(self) -> None:
        """Free what the engine holds beyond memory (a confined engine's thread); the object is not used again."""
        return None

    def __reduce__(self) -> tuple[object, tuple[str]]:  # Rust objects do not pickle: rebuild from the json
        return (type(self), (self.config_text,))


def slice_count(engine: Engine, texts: int, threads: int, pooled: bool) -> int:
    """How many threads ``encode_on`` splits a call of ``texts`` texts over: one unless there is a pool and the
    engine releases the GIL without threads of its own; at most ``threads``, and 8 texts a slice at least."""
    sliced = pooled and not engine.own_threads and engine.releases_gil
    return min(threads, max(1, texts // 8)) if sliced else 1


def encode_on(engine: Engine, texts: Sequence[str], threads: int, pool: ThreadPoolExecutor | None) -> TokenIds:
    """``engine.encode(texts)`` split over ``threads`` threads (``pool`` plus this one) in contiguous slices of
    about equal characters; identical to one call."""
    n = slice_count(engine, len(texts), threads, pool is not None)
    if n <= 1:
        return engine.encode(texts)
    return TokenIds.concat([got for got, _ in _sliced(engine, texts, n, pool)])  # type: ignore[arg-type]


def encode_timed(
    engine: Engine, texts: Sequence[str], threads: int, pool: ThreadPoolExecutor | None
) -> tuple[TokenIds, float]:
    """``encode_on`` and the CPU seconds the engine spent on it: the thread CPU of every slice, summed (not the
    wall time, which a loaded machine stretches). Example: 2 slices of 1.1 and 0.9 ms of CPU → 2.0e-3."""
    n = slice_count(engine, len(texts), threads, pool is not None)
    if n <= 1:
        return engine.encode_cpu(texts)
    parts = _sliced(engine, texts, n, pool)  # type: ignore[arg-type]
    return TokenIds.concat([got for got, _ in parts]), sum(cpu for _, cpu in parts)


def _sliced(engine: Engine, texts: Sequence[str], n: int, pool: ThreadPoolExecutor) -> list[tuple[TokenIds, float]]:
    """``engine.encode_cpu`` of ``n`` contiguous slices of about equal characters, the last on this thread."""
    sizes = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
    cuts = [0, *np.searchsorted(sizes, sizes[-1] * np.arange(1, n) / n).tolist(), len(texts)]
    futures = [pool.submit(engine.encode_cpu, texts[a:b]) for a, b in itertools.pairwise(cuts[:-1])]
    last = engine.encode_cpu(texts[cuts[-2] :])  # while the pool encodes the other slices
    return [*(f.result() for f in futures), last]
