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

Engines. ``tokenizers``' batch encoder runs on all cores (``RAYON_NUM_THREADS`` bounds it). When ``tiktoken``
is importable and the tokenizer is a byte-level BPE that tiktoken can run exactly (no normalizer, a
byte-level pre-tokenizer with one regex, plain BPE merges — checked on the tokenizer.json), the encoder
builds a tiktoken ``Encoding`` from the vocabulary (rank = merge order) and uses it instead, on
``RAYON_NUM_THREADS`` (default: the usable cores) threads: 2-3× faster per core. It is used only after it
gave the same ids as ``tokenizers`` on a fixed probe text (digits, unicode, whitespace runs, special tokens)
and on the first batch of real documents; otherwise the encoder stays on ``tokenizers`` silently.
``Encoder.engine`` says which one encodes (``Encoder.engine_note`` why not tiktoken);
``ZEPHON_TOKENIZER_ENGINE=tokenizers`` turns the fast engine off. The engine is an execution setting: ids, and
so the fingerprint, are the same with either. The tiktoken side (deriving the engine, encoding many texts in
one call) is ``zephon.executor.tiktoken_engine``.

``Encoder.encode_flat`` is the executor's entry point: the ids of a batch of documents in one int64 array plus
each document's size (``Encoded``), optionally in a given order (the executor groups documents by lane), built
with a few numpy calls per batch; ``Encoder.encode`` splits that into one array per document.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import ConfigError, TokenizerError, one_line
from zephon.executor.tiktoken_engine import (
    NotExact,
    encode_buffers,
    encode_joined,
    join_ranks,
    separator,
    tiktoken_engine,
)
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


def _load(tokenizer_id: str) -> tuple[Tokenizer, dict[str, str]]:
    path = Path(tokenizer_id).expanduser()
    if path.is_file():
        return Tokenizer.from_file(str(path)), _special_tokens_from_config(path.parent)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(
                f"tokenizer directory must contain tokenizer.json, got none in {display_path(path)} — save the "
                "tokenizer with save_pretrained() (a fast tokenizer)"
            )
        return Tokenizer.from_file(str(file)), _special_tokens_from_config(path)
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
            return Tokenizer.from_file(str(cached / "tokenizer.json")), _special_tokens_from_config(cached)
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
        return Tokenizer.from_file(str(hub_files / "tokenizer.json")), _special_tokens_from_config(hub_files)
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


#: ``ZEPHON_TOKENIZER_ENGINE``: ``auto`` (default: tiktoken when it is exact for the tokenizer) or ``tokenizers``.
ENGINE_ENV = "ZEPHON_TOKENIZER_ENGINE"
#: Texts both engines must encode identically before the fast one is used: contractions, digit runs, unicode,
#: whitespace of every kind and length, a special token (appended per tokenizer).
_PROBES = (
    "Hello world! It's 2024-06-01: 1234567 items @ $3.50 (≈12%). DON'T we'll I'M they've you'd",
    "def f(x):\n\treturn x**2  # café naïve 東京 привет 🙂🙂 ١٢٣ ½\r\n   \n  trailing   \n\n\n   ",
    " \u00a0nbsp\u2009thin\u3000ideo\u0085nel\u2028ls\u000b\u000cff\u200bzw\ufeffbom x \t\t tabs  ",
    "",
)
#: First-batch verification: at most this many documents, each cut to this many characters.
_SAMPLE_DOCS, _SAMPLE_CHARS = 32, 8192


def tokenizer_threads() -> int:
    """Tokenizer threads: ``RAYON_NUM_THREADS`` (as for ``tokenizers``), else the cores this process may use."""
    value = os.environ.get("RAYON_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class Encoded:
    """Token ids of a batch of documents: ``ids`` (int64) holds every document's ids (prefix, text, EOS) one
    after the other, ``sizes`` how many each has."""

    ids: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)

    def split(self) -> list[np.ndarray]:
        """One int64 view of ``ids`` per document."""
        ends = np.cumsum(self.sizes)
        return [self.ids[a:b] for a, b in zip((ends - self.sizes).tolist(), ends.tolist(), strict=True)]


def _flat(parts: list[np.ndarray], prefix: list[int], eos: int) -> Encoded:
    """The parts with ``prefix`` before and ``eos`` after each, in one int64 array: a few numpy calls per
    batch instead of per document."""
    if not parts:
        return Encoded(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    lengths = np.fromiter(map(len, parts), np.int64, len(parts))
    extra = len(prefix) + 1
    ends = np.cumsum(lengths + extra)
    starts = ends - lengths - extra
    out = np.empty(int(ends[-1]), dtype=np.int64)
    body = np.concatenate(parts)
    shift = np.repeat(np.arange(len(parts), dtype=np.int64) * extra + len(prefix), lengths)
    out[np.arange(len(body)) + shift] = body
    for j, token in enumerate(prefix):
        out[starts + j] = token
    out[ends - 1] = eos
    return Encoded(out, lengths + extra)


class Encoder:
    """Encodes batches of texts into per-document token arrays with BOS/EOS applied."""

    def __init__(self, spec: TokenizeSpec, *, engine: str | None = None) -> None:
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
        self.pad_id: int = (tokenizer.token_to_id(pad) if pad else None) or self.eos_id
        self.prefix: list[int] = self._bos_prefix(spec.add_bos)
        config = tokenizer.to_str()
        # The fingerprint is the tokenizer and the specials added — never the engine (an execution setting).
        self.fingerprint = hashlib.sha256((config + json.dumps([self.prefix, self.eos_id])).encode()).hexdigest()
        #: The engine encoding now: "tokenizers", or "tiktoken" once it matched on the probe and first batch.
        self.engine = "tokenizers"
        #: Why the fast engine is not used (empty while it is, or is still to be verified on the first batch).
        self.engine_note = ""
        self._fast: Any = None  # tiktoken Encoding awaiting (or past) first-batch verification
        self._fast_ids: np.ndarray | None = None  # rank → id table (None: the ranks are the ids)
        self._sep: tuple[str, int] | None = None  # the special token texts are joined with, and its rank
        self._verified = False
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        choice = (engine or os.environ.get(ENGINE_ENV) or "auto").lower()
        if choice not in ("auto", "tokenizers"):
            raise ConfigError(f'{ENGINE_ENV} must be "auto" or "tokenizers", got {choice!r}')
        if choice == "auto":
            self._try_fast(config)
        else:
            self.engine_note = f"{ENGINE_ENV}=tokenizers"

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

    # -- engines --------------------------------------------------------------------------------------------

    def _try_fast(self, config_text: str) -> None:
        """Build the tiktoken engine if it is exact for this tokenizer and matches on the probe texts."""
        try:
            self._fast, self._fast_ids = tiktoken_engine(config_text)
        except NotExact as exc:
            self.engine_note = f"tiktoken not exact for this tokenizer: {exc}"
            return
        self._sep = separator(self._fast, self._eos_text)
        specials = self.tokenizer.get_added_tokens_decoder().values()
        probes = [*_PROBES, "".join(f"a{t.content}b " for t in specials)]
        if not self._same(probes, *self._encode_fast(probes)):
            self._fast = None
            self.engine_note = "tiktoken ids differ from tokenizers on the probe text"

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()  # a forked child (DataLoader worker) gets threads of its own
        if self._pool is None or self._pool[0] != pid:
            self._pool = (
                pid,
                ThreadPoolExecutor(max(1, tokenizer_threads() - 1), thread_name_prefix="zephon-tokenize"),
            )
        return self._pool[1]

    def _encode_fast(self, texts: list[str], *, split: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """tiktoken ranks of the texts, each followed by one separator rank (uint32), and the size of each, on
        ``tokenizer_threads()`` threads: contiguous slices of about equal characters, the calling thread taking the last
        one (tiktoken releases the GIL while it encodes)."""
        run = self._fast_run
        n = min(tokenizer_threads(), max(1, len(texts) // 8)) if split else 1
        if n == 1:
            return run(texts)
        sizes = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
        cuts = [0, *np.searchsorted(sizes, sizes[-1] * np.arange(1, n) / n).tolist(), len(texts)]
        pool = self._executor()
        futures = [pool.submit(run, texts[a:b]) for a, b in itertools.pairwise(cuts[:-1])]
        last = run(texts[cuts[-2] :])  # while the pool encodes the other slices
        parts = [*(f.result() for f in futures), last]
        return np.concatenate([r for r, _ in parts]), np.concatenate([z for _, z in parts])

    def _fast_run(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``_encode_fast`` on this thread: the texts joined in one tiktoken call when that is exact, else one
        call per text (``zephon.executor.tiktoken_engine``)."""
        if self._sep is not None:
            joined = encode_joined(self._fast, texts, *self._sep)
            if joined is not None:
                return joined
        return join_ranks(encode_buffers(self._fast, texts), (), (self._sep[1] if self._sep else 0,))

    def _ids(self, ranks: np.ndarray) -> np.ndarray:
        return ranks if self._fast_ids is None else self._fast_ids[ranks]

    def _same(self, texts: list[str], ranks: np.ndarray, sizes: np.ndarray) -> bool:
        """Whether tiktoken's ranks (each text's followed by a separator) are ``tokenizers``' ids for ``texts``."""
        reference = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ends = np.cumsum(sizes[: len(texts)])
        return len(sizes) >= len(texts) and all(
            np.array_equal(self._ids(ranks[a : b - 1]), e.ids)
            for a, b, e in zip((ends - sizes[: len(texts)]).tolist(), ends.tolist(), reference, strict=True)
        )

    def _verify(self, texts: list[str], ranks: np.ndarray, sizes: np.ndarray) -> None:
        """Keep tiktoken only if it matches ``tokenizers`` on the first documents (each cut to a few KB)."""
        docs = texts[:_SAMPLE_DOCS]
        if any(len(t) > _SAMPLE_CHARS for t in docs):
            docs = [t[:_SAMPLE_CHARS] for t in docs]
            ranks, sizes = self._encode_fast(docs)
        self._verified = True
        if self._same(docs, ranks, sizes):
            self.engine = "tiktoken"
        else:
            self._fast = None
            self.engine_note = "tiktoken ids differ from tokenizers on the first documents"

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (int64) of each text, with the BOS prefix and one EOS."""
        return self.encode_flat(texts).split()

    def encode_flat(self, texts: list[str], order: np.ndarray | None = None, *, split: bool = True) -> Encoded:
        """Token ids of the texts (BOS prefix, text, EOS), concatenated in one array; with ``order``, the
        documents come in that order (``texts[order[0]]`` first), so a caller can group them for free.

        ``split=False`` encodes on the calling thread alone (for callers that encode several batches at once,
        each on its own thread); the first call always splits, and must not run alongside another, because it
        verifies the fast engine."""
        if order is not None:
            texts = [texts[i] for i in order.tolist()]
        if self._fast is not None:
            try:
                fast = self._encode_fast(texts, split=split or not self._verified)
            except (UnicodeEncodeError, ValueError):  # e.g. lone surrogates: tokenizers handles (or refuses) them
                fast = None
            if fast is not None and not self._verified:
                self._verify(texts, *fast)
            if fast is not None and self._fast is not None:
                ranks, sizes = fast
                ids = ranks.astype(np.int64) if self._fast_ids is None else self._fast_ids[ranks]
                ends = np.cumsum(sizes)
                ids[ends - 1] = self.eos_id  # each text's separator becomes its EOS
                if self.prefix:
                    k = len(self.prefix)
                    ids = np.insert(ids, np.repeat(ends - sizes, k), np.tile(self.prefix, len(sizes)))
                    sizes = sizes + k
                return Encoded(ids, sizes)
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return _flat([np.array(e.ids, dtype=np.int64) for e in encodings], self.prefix, self.eos_id)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None  # threads do not travel
        return state
