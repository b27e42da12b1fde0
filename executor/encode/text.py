"""Tokenizing documents: a Hugging Face tokenizer, EOS after every document, BOS by the tokenizer's convention.

``tokenizer_id`` is a Hub id, a local directory or a path to a ``tokenizer.json`` file, loaded by
``zephon.executor.encode.load``. Text is encoded without the tokenizer's own special tokens; then each document
gets

* ``bos``: with ``add_bos=None`` (default) the tokens that the tokenizer itself puts before a text when asked
  for special tokens (Llama-style tokenizers prepend ``<s>``; GPT-2 adds nothing); ``True`` forces the BOS
  token, ``False`` never adds one;
* the document's tokens;
* ``eos``: always one EOS token (``eos_token`` overrides the tokenizer's), so document boundaries survive
  packing.

Example with GPT-2: "Hello world" → [15496, 995, 50256].

Engines. The ids are always Hugging Face ``tokenizers``' ids for the tokenizer.json; what runs it is the
fastest engine verified to give exactly those ids (``zephon.executor.engines``: fastokens, gigatoken, tiktoken,
kitoken when installed — ``pip install 'zephon[fast]'`` — else ``tokenizers`` itself), checked on tricky probe
texts when first chosen and on the first batch of every run's own documents, the verdicts cached by tokenizer
content. ``Encoder.engine`` says which one encodes, ``Encoder.refused`` why faster ones were refused;
``ZEPHON_TOKENIZER_ENGINE=NAME`` forces one (refused with one line if it differs). A batch the engine cannot
encode (a lone surrogate) is encoded by ``tokenizers``, which gives its own ids or its own error. The engine
is an execution setting: ids, and so the fingerprint, are the same with any. Threads: ``threads``
(``ExecutorSpec.tokenizer_threads``), else ``RAYON_NUM_THREADS``, else the usable cores; one call is split in
contiguous slices over them (``zephon.executor.engines.base.encode_on``), the same ids on any number. An engine
with helper threads of its own (fastokens) gets as many as leave the cores to our calls (``CALLS_AT_ONCE``).

``Encoder.encode_flat`` is the executor's entry point: the ids of a batch of documents in one int32 array plus
each document's size (``Encoded``), optionally in a given order (the executor groups documents by lane), built
with a few numpy calls per batch; ``Encoder.encode`` splits that into one array per document.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.errors import TokenizerError
from zephon.executor.cores import usable_cores
from zephon.executor.encode.flags import ID
from zephon.executor.encode.load import EOS_GUESSES, load_tokenizer, tokenizer_config
from zephon.executor.encode.surrogates import UnencodableText
from zephon.executor.engines import ENGINE_ENV, EngineChoice, TokenIds
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.engines.base import encode_timed
from zephon.executor.engines.spot_check import EngineMismatch, SpotCheck
from zephon.executor.engines.vendors import size_fastokens
from zephon.specs import TokenizeSpec

#: Our engine calls that run at once in a run's steady state, at most: the chunks the read-ahead keeps ready
#: ahead of the caller (``zephon.executor.read.ahead.DEPTH``), each encoded whole on one of ``threads`` pool
#: threads. Sizes fastokens' helpers (``zephon.executor.engines.vendors.size_fastokens``); never changes an id.
CALLS_AT_ONCE = 2


def encode_on_one_thread() -> None:
    """This process is one of several worker processes that each encode on one thread (the count pass's, local
    or Ray, and ``zephon tokenize``'s): Rayon's pool (the ``tokenizers`` engine) at 1 thread, and fastokens'
    threads a call at 1 unless the user set them (``size_fastokens``: the value the parent sized for all its
    cores is sized again, here for one). Call it before the encoder is made."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    size_fastokens(1, 1)


def tokenizer_threads(setting: int | None = None) -> int:
    """Tokenizer threads: ``setting`` (``ExecutorSpec.tokenizer_threads``) when given, else
    ``RAYON_NUM_THREADS`` (as for ``tokenizers``), else the cores this process may use."""
    if setting is not None:
        return setting
    value = os.environ.get("RAYON_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return usable_cores()


@dataclass(frozen=True, slots=True)
class Encoded(TokenIds):
    """Token ids of a batch of documents, framed: ``ids`` (int32, or ``flags.FLAGGED`` records) holds every
    document's ids (prefix, text, EOS) one after the other, ``sizes`` how many each has (``split`` gives one view
    per document); ``cut`` how many tokens ``long_documents="truncate"`` cut from each (int64), None when it cut
    none (``zephon.executor.truncations`` counts them as they are handed out)."""

    cut: np.ndarray | None = None


def _frame(got: TokenIds, prefix: list[int], eos: int) -> Encoded:
    """Each text's ids with ``prefix`` before and ``eos`` after, in one int32 array: a few numpy calls per
    batch instead of per document. The engine's ids go to the slots a boolean mask leaves free (one byte a token;
    a gather by an int64 index per token cost ten times as much: 6.6 against 0.64 ns a token, 1,024 documents of
    20-4,000 tokens), then the prefix and EOS columns are written.

    Example: sizes [2, 1], prefix [B], eos E: mask [0 1 1 0 | 0 1 0] → [B a a E | B b E]."""
    n = len(got.sizes)
    if not n:
        return Encoded(np.empty(0, dtype=ID), np.empty(0, dtype=np.int64))
    k = len(prefix)
    sizes = got.sizes.astype(np.int64) + (k + 1)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    out = np.empty(int(ends[-1]), dtype=ID)
    free = np.ones(len(out), dtype=bool)
    for j in range(k):
        free[starts + j] = False
    free[ends - 1] = False
    out[free] = got.ids
    for j, token in enumerate(prefix):
        out[starts + j] = token
    out[ends - 1] = eos
    return Encoded(out, sizes)


class Encoder:
    """Encodes batches of texts into per-document token arrays with BOS/EOS applied."""

    def __init__(self, spec: TokenizeSpec, *, engine: str | None = None, threads: int | None = None) -> None:
        self.spec = spec
        tokenizer, specials = load_tokenizer(spec.tokenizer_id)
        self.tokenizer = tokenizer
        eos = spec.eos_token or specials.get("eos_token")
        if eos is None:
            eos = next((t for t in EOS_GUESSES if tokenizer.token_to_id(t) is not None), None)
        eos_id = tokenizer.token_to_id(eos) if eos is not None else None
        if eos_id is None:
            raise TokenizerError(
                f"tokenizer {spec.tokenizer_id!r} must have an EOS token, got {eos!r} — pass "
                "tokenize(eos_token=...) with a token in its vocabulary"
            )
        self.eos_id: int = eos_id
        self._eos_text: str | None = eos
        bos = specials.get("bos_token")
        self.bos_id: int | None = tokenizer.token_to_id(bos) if bos else None
        pad = specials.get("pad_token")
        pad_id = tokenizer.token_to_id(pad) if pad else None
        #: The tokenizer's pad token, else EOS (a pad token at id 0 is a pad token, not a missing one).
        self.pad_id: int = self.eos_id if pad_id is None else pad_id
        self.prefix: list[int] = self._bos_prefix(spec.add_bos)
        config = tokenizer_config(tokenizer)  # serialized once per tokenizer (a worker inherits it)
        # The fingerprint is the tokenizer and the specials added — never the engine (an execution setting).
        self.fingerprint = hashlib.sha256((config + json.dumps([self.prefix, self.eos_id])).encode()).hexdigest()
        #: Threads one ``encode_flat`` call may use (``tokenizer_threads``); never changes the ids.
        self.threads = tokenizer_threads(threads)
        if threads is not None and "RAYON_NUM_THREADS" not in os.environ:
            os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizers engine's own pool, sized at first use
        size_fastokens(usable_cores(), min(self.threads, CALLS_AT_ONCE))  # before any engine encodes
        self._choice = EngineChoice(tokenizer, config, eos_text=eos, setting=engine or os.environ.get(ENGINE_ENV))
        self._settle_lock = threading.Lock()
        #: the seeded comparison of each batch's sample with ``tokenizers`` (``zephon.executor.engines.spot_check``)
        self.spot_check = SpotCheck(tokenizer)
        self._pool: tuple[int, ThreadPoolExecutor] | None = None

    @property
    def engine(self) -> str:
        """The chosen engine: the fastest candidate verified to give ``tokenizers``' ids."""
        return self._choice.name

    @property
    def refused(self) -> dict[str, str]:
        """Faster candidates refused for this tokenizer: name → reason (``zephon.executor.engines.choose``)."""
        return dict(self._choice.refused)

    @property
    def releases_gil(self) -> bool:
        """Whether calls on several threads encode at once (``Engine.releases_gil``; the count pass uses it)."""
        return self._choice.engine.releases_gil

    @property
    def settled(self) -> bool:
        """Whether the engine has been checked on the run's own documents (after the first ``encode_flat``)."""
        return self._choice.settled

    @property
    def engine_note(self) -> str:
        """Why faster engines are not used, in one line (empty when none was refused)."""
        return "; ".join(f"{name}: {reason}" for name, reason in self.refused.items())

    def _bos_prefix(self, add_bos: bool | None) -> list[int]:
        if add_bos is False:
            return []
        if add_bos is True:
            if self.bos_id is None:
                raise TokenizerError(
                    f"tokenizer {self.spec.tokenizer_id!r} must define a BOS token for add_bos=True, got none "
                    "— use add_bos=None or False"
                )
            return [self.bos_id]
        probe = "zephon"
        with_special = self.tokenizer.encode(probe, add_special_tokens=True).ids
        plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
        for cut in range(len(with_special) - len(plain) + 1):
            if with_special[cut : cut + len(plain)] == plain:
                return with_special[:cut]
        return []

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()  # a forked child (DataLoader worker) gets threads of its own
        if self._pool is None or self._pool[0] != pid:
            self._pool = (pid, ThreadPoolExecutor(max(1, self.threads - 1), thread_name_prefix="zephon-tokenize"))
        return self._pool[1]

    def close(self) -> None:
        """Stop this encoder's thread pool (at the end of a run; the next call makes a new one)."""
        pool, self._pool = self._pool, None
        if pool is not None and pool[0] == os.getpid():
            pool[1].shutdown(wait=True)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (int32) of each text, with the BOS prefix and one EOS."""
        return self.encode_flat(texts).split()

    def encode_flat(self, texts: list[str], order: np.ndarray | None = None, *, split: bool = True) -> Encoded:
        """Token ids of the texts (BOS prefix, text, EOS), concatenated in one array; with ``order``, the
        documents come in that order (``texts[order[0]]`` first), so a caller can group them for free.

        ``split=False`` encodes on the calling thread alone (for callers that encode several batches at once,
        each on its own thread); the first call always splits and checks the engine on the run's own documents
        (calls on other threads meanwhile wait for it)."""
        if order is not None:
            texts = [texts[i] for i in order.tolist()]
        try:
            return _frame(self._ids(texts, split), self.prefix, self.eos_id)
        except AtDocument as exc:  # the index of the caller's texts
            if order is None:
                raise
            raise exc.at(int(order[exc.index])) from None

    def lengths(self, texts: list[str], *, split: bool = True) -> np.ndarray:
        """How many tokens each text becomes (BOS prefix and EOS included), int64: ``encode_flat(texts).sizes``
        without building the ids (the count pass)."""
        return self._ids(texts, split).sizes.astype(np.int64) + (len(self.prefix) + 1)

    def ids(self, texts: list[str], *, split: bool = True) -> TokenIds:
        """The engine's ids of the texts, without BOS/EOS (the chat encoder frames them itself)."""
        return self._ids(texts, split)

    def _ids(self, texts: list[str], split: bool) -> TokenIds:
        """The engine's ids of the texts (no BOS/EOS); the first call checks the engine on them."""
        choice = self._choice
        if not choice.settled:
            with self._settle_lock:  # the first call checks the engine; calls on other threads wait for it
                choice.settle(texts)
            split = True
        engine = choice.engine
        threads = self.threads if split else 1
        pool = self._executor() if threads > 1 else None
        try:
            got, cpu = encode_timed(engine, texts, threads, pool)
        except Exception:  # e.g. a lone surrogate: tokenizers gives its own ids, or its own error
            try:
                if engine is choice.fallback:
                    raise
                return choice.fallback.encode(texts)
            except Exception:
                UnencodableText.raise_found(texts)  # looked for only now: a good run pays nothing
                raise
        if engine is not choice.fallback:  # its CPU: the thread CPU of every slice, which the check's budget shares
            self.spot_check.encoded(cpu)
            try:
                self.spot_check.check(texts, got, engine.name)
            except EngineMismatch as exc:
                choice.refuse_running(exc.detail)
                raise
        return got

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None  # threads do not travel
        del state["_settle_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._settle_lock = threading.Lock()
