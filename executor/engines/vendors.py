"""The engines of other Rust tokenizer libraries, each optional (``pip install 'zephon[fast]'``).

Each loads the tokenizer.json text as it is and encodes without post-processor tokens; whether its ids are
``tokenizers``' ids for a given tokenizer is never assumed — ``zephon.executor.engines.choose`` checks it.

* ``fastokens`` — ``Tokenizer.from_json_str`` and ``encode_batch_flat``: the ids of a whole batch as one
  uint32 buffer plus offsets, no Python object per document; releases the GIL (sliced over our threads). It
  also spreads each call over helper threads of its own, ``FASTOKENS_BPE_THREADS`` a call (the caller
  included; its default: the cores, so ``cores - 1`` helpers shared by all calls), read once a process at its
  first encode: ``size_fastokens`` sets it, unless the user did, so that the helpers and our calls together
  fill the cores instead of oversubscribing them.
* ``gigatoken`` — ``Tokenizer.from_json`` and ``encode_batch(parallel=False)`` (an awkward list array whose
  offsets and content are read as numpy arrays); ``parallel=False`` keeps it off its process-global Rayon
  pool, which hangs after a fork (DataLoader workers); releases the GIL, so it is sliced over our threads.
* ``kitoken`` — ``Kitoken.from_tokenizers`` and ``encode_all`` with every special token recognised (as
  ``tokenizers`` matches added tokens); returns lists; holds the GIL.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.executor.engines.base import Engine, EngineUnavailable, TokenIds, from_lists


def _import(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EngineUnavailable(f"{module} is not installed (pip install 'zephon[fast]')") from exc


def _refused(exc: BaseException) -> EngineUnavailable:
    """The library's refusal to load a tokenizer.json: lasting unless the machine, not the content, failed."""
    text = " ".join(str(exc).split())
    lasting = not isinstance(exc, MemoryError | OSError)
    return EngineUnavailable(f"cannot load this tokenizer ({type(exc).__name__}: {text[:160]})", lasting=lasting)


#: fastokens' threads a call — the calling thread and its helpers — read by fastokens once a process.
FASTOKENS_THREADS_ENV = "FASTOKENS_BPE_THREADS"
#: Which process wrote the value, and the value, as ``PID:VALUE``: a process started from ours (a spawned
#: DataLoader worker) inherits both, and so knows the value is Zephon's, sized for its parent's cores.
SIZED_ENV = "ZEPHON_FASTOKENS_SIZED"


def size_fastokens(cores: int, calls: int) -> None:
    """Unless the user set it (or fastokens already encoded in this process, which fixes it): fastokens' threads a
    call when ``calls`` of our calls run at once on ``cores`` cores — ``cores - calls + 1``, at least 1: each
    call's thread plus ``cores - calls`` shared helpers fill the cores. fastokens' own default is ``cores`` a
    call, ``cores - 1`` helpers beside our ``calls`` threads. Example: 2 cores, 2 of our encode threads → 1 (no
    helper: on 2 cores the engine then spent ~15 % less CPU a token and a run gave 8-9 % more tokens a second,
    docs/performance.md); 16 cores, 2 calls at once → 15 (one helper fewer than its default). Never changes
    an id.

    Who set it decides: unset → sized here; set by this function in this process → kept (the first encoder's
    sizing stands, as fastokens reads it once); set by this function in another process (``SIZED_ENV`` names
    it: the parent of a DataLoader worker started by spawn, whose environment the worker inherits) → sized
    again for this process's cores — the parent's 15 on 16 cores would give each of 8 workers of 2 cores 15
    threads a call, where 1 fills its share; set by the user (no ``SIZED_ENV``, or another value) → never
    changed."""
    current = os.environ.get(FASTOKENS_THREADS_ENV)
    pid, _, sized = os.environ.get(SIZED_ENV, "").partition(":")
    if current is None or (current == sized and pid != str(os.getpid())):
        value = str(max(1, cores - calls + 1))
        os.environ[FASTOKENS_THREADS_ENV] = value
        os.environ[SIZED_ENV] = f"{os.getpid()}:{value}"


class FastokensEngine(Engine):
    name = "fastokens"
    package = "fastokens"

    def __init__(self, config_text: str) -> None:
        super().__init__(config_text)
        module = _import("fastokens")
        try:
            self._tok = module.Tokenizer.from_json_str(config_text)
        except BaseException as exc:  # a Rust panic is a BaseException
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise _refused(exc) from exc

    def encode(self, texts: Sequence[str]) -> TokenIds:
        ids, offsets = self._tok.encode_batch_flat(list(texts), add_special_tokens=False)
        ends = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        return TokenIds(np.frombuffer(ids, dtype=np.uint32), np.diff(ends))


class GigatokenEngine(Engine):
    name = "gigatoken"
    package = "gigatoken"

    def __init__(self, config_text: str) -> None:
        super().__init__(config_text)
        module = _import("gigatoken")
        try:
            self._tok = module.Tokenizer.from_json(config_text)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise _refused(exc) from exc

    def encode(self, texts: Sequence[str]) -> TokenIds:
        layout = self._tok.encode_batch(list(texts), parallel=False).layout
        offsets = np.asarray(layout.offsets, dtype=np.int64)
        ids = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
        return TokenIds(ids, np.diff(offsets))


class KitokenEngine(Engine):
    name = "kitoken"
    package = "kitoken"
    releases_gil = False  # measured: two threads encode no faster than one
    crash_prone = True  # its loader segfaulted on a SentencePiece Unigram tokenizer (docs/performance.md)
    confined = True  # its encode segfaulted on objects built on a thread that had exited (docs/performance.md)

    def __init__(self, config_text: str) -> None:
        super().__init__(config_text)
        module = _import("kitoken")
        try:
            self._tok = module.Kitoken.from_tokenizers(config_text.encode())
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise _refused(exc) from exc

    def encode(self, texts: Sequence[str]) -> TokenIds:
        return from_lists(self._tok.encode_all(list(texts), True))
