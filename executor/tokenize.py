"""Tokenizing documents: a Hugging Face tokenizer, EOS after every document, BOS by the tokenizer's convention.

``tokenizer_id`` is a Hub id (``"gpt2"``, loaded through transformers and its cache), a local directory
(``tokenizer.json`` plus ``tokenizer_config.json``), or a path to a ``tokenizer.json`` file. Failures say which
it was, at once: an id that can only be a path (``zephon.storage.local.looks_like_local_path``) and does not
exist is refused without asking the Hub; a Hub id gets one request, not retried, and when the Hub cannot be
reached the Hugging Face cache is used, or the error names the endpoint and the fix (a local path, or
``HF_HUB_OFFLINE=1`` with a cached copy); with ``HF_HUB_OFFLINE`` set only the cache is read. Text is encoded
without the tokenizer's own special tokens; then each document gets

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
contiguous slices over them (``zephon.executor.engines.base.encode_on``), the same ids on any number.

``Encoder.encode_flat`` is the executor's entry point: the ids of a batch of documents in one int64 array plus
each document's size (``Encoded``), optionally in a given order (the executor groups documents by lane), built
with a few numpy calls per batch; ``Encoder.encode`` splits that into one array per document.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import TokenizerError, one_line
from zephon.executor.cores import usable_cores
from zephon.executor.engines import ENGINE_ENV, EngineChoice, TokenIds, encode_on
from zephon.executor.engines.base import slice_count
from zephon.executor.engines.spot_check import EngineMismatch, SpotCheck
from zephon.specs import TokenizeSpec
from zephon.storage.local import display_missing, display_path, looks_like_local_path

log = logging.getLogger(__name__)

_EOS_GUESSES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")
#: A Hub model id: ``name`` or ``org/name`` of letters, digits, ``_ - .`` (huggingface_hub's own check, less
#: its length limit, which the Hub reports).
_HUB_ID = re.compile(r"^(?:[\w\-.]+/)?[\w\-.]+$")


def _special_tokens_from_config(directory: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = directory / name
        if file.is_file():
            data = json.loads(file.read_text(encoding="utf-8"))
            for key in ("eos_token", "bos_token", "pad_token"):
                value = data.get(key)
                if isinstance(value, dict):
                    value = value.get("content")
                if isinstance(value, str) and key not in out:
                    out[key] = value
    return out


#: tokenizer.json files loaded in this process, by (path, size, modification time): planning and the executor
#: of one ``Pipeline(work_source)`` parse a large tokenizer.json once (about a second for 6-14 MB).
_LOADED: dict[tuple[str, int, int], Tokenizer] = {}


def _from_file(file: Path) -> Tokenizer:
    st = file.stat()
    key = (str(file.resolve()), st.st_size, st.st_mtime_ns)
    tokenizer = _LOADED.get(key)
    if tokenizer is None:
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception for a truncated or foreign file
            raise TokenizerError(
                f"{display_path(file)} must be a tokenizer.json that tokenizers can load, got: {one_line(exc)} — "
                "restore the file, or save the tokenizer again with save_pretrained()"
            ) from None
        _LOADED[key] = tokenizer
    return tokenizer


def _load(tokenizer_id: str) -> tuple[Tokenizer, dict[str, str]]:
    path = Path(tokenizer_id).expanduser()
    if path.is_file():
        return _from_file(path), _special_tokens_from_config(path.parent)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(
                f"tokenizer directory must contain tokenizer.json, got none in {display_path(path)} — save the "
                "tokenizer with save_pretrained() (a fast tokenizer)"
            )
        return _from_file(file), _special_tokens_from_config(path)
    if looks_like_local_path(tokenizer_id):
        raise TokenizerError(
            "tokenizer_id must be an existing directory or tokenizer.json, or a Hub id, got path "
            f"{display_missing(tokenizer_id)} which does not exist — fix the path"
        )
    if not _HUB_ID.match(tokenizer_id) or "--" in tokenizer_id or ".." in tokenizer_id:
        raise TokenizerError(
            "tokenizer_id must be an existing directory or tokenizer.json, or a Hub id (name or org/name), got "
            f"{tokenizer_id!r}, which is neither — fix it"
        )
    return _load_from_hub(tokenizer_id)


def _load_from_hub(tokenizer_id: str) -> tuple[Tokenizer, dict[str, str]]:
    """A Hub tokenizer: from the Hugging Face cache when offline or when the Hub cannot be reached (one quick
    attempt, no retries: ``_hub_unreachable``), else downloaded (``tokenizer.json``), else through transformers."""
    offline = _offline()
    problem = None if offline else _hub_unreachable(tokenizer_id)
    if offline or problem is not None:
        cached = _hub_tokenizer_files(tokenizer_id, local_files_only=True)
        if cached is not None:
            if problem is not None:
                log.warning(
                    "the Hugging Face Hub could not be reached (%s): tokenizer %r loaded from the cache",
                    problem,
                    tokenizer_id,
                )
            return _from_file(cached / "tokenizer.json"), _special_tokens_from_config(cached)
        if _cached_configs(tokenizer_id):  # a cached repo without tokenizer.json: transformers converts it
            with contextlib.suppress(TokenizerError):
                return _transformers_tokenizer(tokenizer_id, local_files_only=True)
        if problem is None:
            raise TokenizerError(
                f"tokenizer {tokenizer_id!r} must be in the Hugging Face cache while HF_HUB_OFFLINE is set, got no "
                "cached copy — unset HF_HUB_OFFLINE to download it, or pass a local directory or tokenizer.json path"
            )
        raise TokenizerError(
            f"tokenizer {tokenizer_id!r} must be downloadable from the Hugging Face Hub or cached, got {problem} and "
            "no cached copy — pass a local directory or tokenizer.json path, or download it once where the Hub is "
            "reachable and set HF_HUB_OFFLINE=1 to use the cached copy"
        )
    hub_files = _hub_tokenizer_files(tokenizer_id)
    if hub_files is not None:
        return _from_file(hub_files / "tokenizer.json"), _special_tokens_from_config(hub_files)
    return _transformers_tokenizer(tokenizer_id)


def _cached_configs(tokenizer_id: str) -> bool:
    """Whether the Hugging Face cache holds a config of the repo (worth asking transformers, which takes
    seconds to import, to build the tokenizer from the cache)."""
    from huggingface_hub import try_to_load_from_cache

    return any(
        isinstance(try_to_load_from_cache(tokenizer_id, name), str) for name in ("tokenizer_config.json", "config.json")
    )


def _offline() -> bool:
    """``HF_HUB_OFFLINE`` set now, or when huggingface_hub was imported (it reads the variable once)."""
    from huggingface_hub import constants

    set_now = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return set_now or bool(constants.HF_HUB_OFFLINE)


def _hub_unreachable(tokenizer_id: str) -> str | None:
    """Why the Hub cannot be reached (``"no connection to URL (ConnectError: ...)"``, ``"HTTP 503 from URL"``),
    or None when it answered. One HEAD request for the repo's ``tokenizer.json``, not retried: a Hub that
    cannot be reached fails in one connection timeout (``HF_HUB_ETAG_TIMEOUT``, 10 s) instead of
    huggingface_hub's retry loop (about 23 s per file, over a minute for a tokenizer's files)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    from zephon.storage.hub.errors import RETRY_STATUSES, http_status

    url = hf_hub_url(tokenizer_id, "tokenizer.json")
    endpoint = constants.ENDPOINT
    try:
        get_hf_file_metadata(url, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as exc:  # the Hub client raises HTTP errors, network errors of httpx, offline mode
        status = http_status(exc)
        if status is None:
            return f"no connection to {endpoint} ({type(exc).__name__}: {one_line(exc)})"
        if status in (408, *RETRY_STATUSES):
            return f"HTTP {status} from {endpoint}"
    return None  # it answered: found, or a definite answer (404, 401) that the download below reports


def _hub_tokenizer_files(tokenizer_id: str, *, local_files_only: bool = False) -> Path | None:
    """Download a Hub model's ``tokenizer.json`` (and its configs) through the Hugging Face cache
    (``local_files_only``: only look in the cache).

    A Hub tokenizer is read from the same files a local directory holds, so the same tokenizer gets the
    same fingerprint wherever it was loaded from. Returns None when the repo has no ``tokenizer.json``
    (then transformers converts it) or cannot be reached (transformers reports why).
    """
    try:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(tokenizer_id, "tokenizer.json", local_files_only=local_files_only))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            with contextlib.suppress(Exception):  # optional files: absent is fine
                hf_hub_download(tokenizer_id, name, local_files_only=local_files_only)
    except Exception:
        return None
    return path.parent


def _transformers_tokenizer(tokenizer_id: str, *, local_files_only: bool = False) -> tuple[Tokenizer, dict[str, str]]:
    """A Hub tokenizer without ``tokenizer.json``, converted by transformers (which must give a fast one)."""
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(tokenizer_id, local_files_only=local_files_only)
    except Exception as exc:  # transformers raises many types: OSError, ValueError, HTTP errors
        raise TokenizerError(
            f"tokenizer {tokenizer_id!r} could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0]}) "
            "— pass a local directory or tokenizer.json path, or make the Hub reachable (HF_TOKEN for gated models)"
        ) from exc
    if not getattr(hf, "is_fast", False):
        raise TokenizerError(f"tokenizer {tokenizer_id!r} must have a fast (Rust) version, got a slow one")
    specials = {k: v for k in ("eos_token", "bos_token", "pad_token") if isinstance(v := getattr(hf, k, None), str)}
    return hf.backend_tokenizer, specials


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
    """Token ids of a batch of documents, framed: ``ids`` (int64) holds every document's ids (prefix, text,
    EOS) one after the other, ``sizes`` how many each has (``split`` gives one view per document)."""


def _frame(got: TokenIds, prefix: list[int], eos: int) -> Encoded:
    """Each text's ids with ``prefix`` before and ``eos`` after, in one int64 array: a few numpy calls per
    batch instead of per document."""
    n = len(got.sizes)
    if not n:
        return Encoded(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    k = len(prefix)
    sizes = got.sizes.astype(np.int64) + (k + 1)
    ends = np.cumsum(sizes)
    out = np.empty(int(ends[-1]), dtype=np.int64)
    shift = np.repeat(np.arange(k, k + n * (k + 1), k + 1, dtype=np.int64), got.sizes)
    shift += np.arange(len(got.ids), dtype=np.int64)
    out[shift] = got.ids
    starts = ends - sizes
    for j, token in enumerate(prefix):
        out[starts + j] = token
    out[ends - 1] = eos
    return Encoded(out, sizes)


class Encoder:
    """Encodes batches of texts into per-document token arrays with BOS/EOS applied."""

    def __init__(self, spec: TokenizeSpec, *, engine: str | None = None, threads: int | None = None) -> None:
        self.spec = spec
        tokenizer, specials = _load(spec.tokenizer_id)
        self.tokenizer = tokenizer
        eos = spec.eos_token or specials.get("eos_token")
        if eos is None:
            eos = next((t for t in _EOS_GUESSES if tokenizer.token_to_id(t) is not None), None)
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
        config = tokenizer.to_str()
        # The fingerprint is the tokenizer and the specials added — never the engine (an execution setting).
        self.fingerprint = hashlib.sha256((config + json.dumps([self.prefix, self.eos_id])).encode()).hexdigest()
        #: Threads one ``encode_flat`` call may use (``tokenizer_threads``); never changes the ids.
        self.threads = tokenizer_threads(threads)
        if threads is not None and "RAYON_NUM_THREADS" not in os.environ:
            os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizers engine's own pool, sized at first use
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
        """Token ids (int64) of each text, with the BOS prefix and one EOS."""
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
        except EngineMismatch as exc:  # the index of the caller's texts
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
        started = time.perf_counter()
        try:
            got = encode_on(engine, texts, threads, pool)
        except Exception:  # e.g. a lone surrogate: tokenizers gives its own ids, or its own error
            if engine is choice.fallback:
                raise
            return choice.fallback.encode(texts)
        if engine is not choice.fallback:  # its CPU: the wall time on the threads the call was split over
            slices = slice_count(engine, len(texts), threads, pool is not None)
            self.spot_check.encoded((time.perf_counter() - started) * slices)
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
