"""Tokenizing documents: a Hugging Face tokenizer, EOS after every document, BOS by the tokenizer's convention.

``tokenizer_id`` is a Hub id (``"gpt2"``, loaded through transformers and its cache), a local directory
(``tokenizer.json`` plus ``tokenizer_config.json``), or a path to a ``tokenizer.json`` file. Text is encoded
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
so the fingerprint, are the same with either.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import ConfigError, TokenizerError

_EOS_GUESSES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizeSpec:
    """Settings of ``Pipeline.tokenize``.

    Attributes:
        tokenizer_id: Hub id, local directory, or tokenizer.json path.
        field: the text column (Parquet) or key (JSONL).
        add_bos: None follows the tokenizer's convention; True/False force it.
        eos_token: EOS token string; None uses the tokenizer's.
    """

    tokenizer_id: str
    field: str = "text"
    add_bos: bool | None = None
    eos_token: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer_id, str) or not self.tokenizer_id:
            raise ConfigError(f"tokenizer_id must be a non-empty string, got {self.tokenizer_id!r}")
        if not isinstance(self.field, str) or not self.field:
            raise ConfigError(f"field must be a non-empty column name, got {self.field!r}")


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
                f"tokenizer directory must contain tokenizer.json, got none in {path} — save the tokenizer "
                "with save_pretrained() (a fast tokenizer)"
            )
        return Tokenizer.from_file(str(file)), _special_tokens_from_config(path)
    hub_files = _hub_tokenizer_files(tokenizer_id)
    if hub_files is not None:
        return Tokenizer.from_file(str(hub_files / "tokenizer.json")), _special_tokens_from_config(hub_files)
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(tokenizer_id)
    except Exception as exc:  # transformers raises many types: OSError, ValueError, HTTP errors
        raise TokenizerError(
            f"tokenizer {tokenizer_id!r} could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0]}) "
            "— pass a local directory or tokenizer.json path, or make the Hub reachable (HF_TOKEN for gated models)"
        ) from exc
    if not getattr(hf, "is_fast", False):
        raise TokenizerError(f"tokenizer {tokenizer_id!r} must have a fast (Rust) version, got a slow one")
    specials = {k: v for k in ("eos_token", "bos_token", "pad_token") if isinstance(v := getattr(hf, k, None), str)}
    return hf.backend_tokenizer, specials


def _hub_tokenizer_files(tokenizer_id: str) -> Path | None:
    """Download a Hub model's ``tokenizer.json`` (and its configs) through the Hugging Face cache.

    A Hub tokenizer is read from the same files a local directory holds, so the same tokenizer gets the
    same fingerprint wherever it was loaded from. Returns None when the repo has no ``tokenizer.json``
    (then transformers converts it) or cannot be reached (transformers reports why).
    """
    try:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(tokenizer_id, "tokenizer.json"))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            with contextlib.suppress(Exception):  # optional files: absent is fine
                hf_hub_download(tokenizer_id, name)
    except Exception:
        return None
    return path.parent


#: ``ZEPHON_TOKENIZER_ENGINE``: ``auto`` (default: tiktoken when it is exact for the tokenizer) or ``tokenizers``.
ENGINE_ENV = "ZEPHON_TOKENIZER_ENGINE"
#: GPT-2's pre-tokenization regex (``ByteLevel(use_regex=True)`` in ``tokenizers``).
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
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


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable character → byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in keep:
            out[chr(256 + extra)] = b
            extra += 1
    return out


class _NotExact(Exception):
    """The tokenizer uses a feature tiktoken does not reproduce; the message says which."""


def _pattern(pre: dict[str, Any] | None) -> str:
    """The one regex of a byte-level pre-tokenizer, as tiktoken's ``pat_str``."""
    if pre is None:
        raise _NotExact("no pre-tokenizer")
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        raise _NotExact("pre-tokenizer is not ByteLevel(add_prefix_space=False)")
    byte_level, splits = steps[-1], steps[:-1]
    if byte_level.get("use_regex", True):
        if splits:
            raise _NotExact("more than one pre-tokenization regex")
        return _GPT2_PATTERN
    if len(splits) != 1 or splits[0].get("type") != "Split":
        raise _NotExact("pre-tokenizer is not one Split + ByteLevel")
    split = splits[0]
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise _NotExact(f"Split behavior {split.get('behavior')!r} (invert={split.get('invert')})")
    pattern = split.get("pattern") or {}
    if "Regex" in pattern:
        return str(pattern["Regex"])
    import re

    return re.escape(str(pattern["String"]))


def _tiktoken_plan(
    config: dict[str, Any],
) -> tuple[dict[bytes, int], dict[str, int], str, np.ndarray | None]:
    """tiktoken's ``mergeable_ranks``, ``special_tokens`` and ``pat_str`` for a tokenizer.json, and the rank →
    id table (None when the ranks are the ids). Raises ``_NotExact`` for what tiktoken would encode differently.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank, ``tokenizers`` the pair listed
    first in ``merges``: the same order when merge ``i`` makes the token of rank ``i`` (+ a constant). When the
    merged tokens' ids grow with the merge order (GPT-2, cl100k-style vocabularies) the ids are the ranks;
    otherwise ranks are the 256 bytes, then the merges in order, then the added tokens, mapped back by a table.
    """
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        raise _NotExact(f"model {model.get('type')!r} is not BPE")
    if config.get("normalizer") is not None:
        raise _NotExact("a normalizer")
    if config.get("truncation") is not None or config.get("padding") is not None:
        raise _NotExact("truncation or padding in tokenizer.json")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise _NotExact(f"BPE {key}")
    if model.get("byte_fallback"):
        raise _NotExact("BPE byte_fallback")
    pattern = _pattern(config.get("pre_tokenizer"))
    decode = _byte_decoder()
    to_byte = {ord(c): b for c, b in decode.items()}  # str.translate table: alphabet char → byte value
    vocab: dict[str, int] = model["vocab"]
    merges = [m if isinstance(m, list) else m.split(" ", 1) for m in model.get("merges") or []]
    tokens = ["".join(m) for m in merges]
    foreign = set("".join(tokens)) - decode.keys()
    if foreign:
        raise _NotExact(f"merged tokens outside the byte-level alphabet ({''.join(sorted(foreign))[:20]!r})")
    outside = (set(itertools.chain.from_iterable(merges)) | set(tokens)) - vocab.keys()
    if outside:
        raise _NotExact(f"merges use {len(outside)} strings that are not in the vocabulary, e.g. {min(outside)!r}")
    merge_ids = [vocab[t] for t in tokens]
    if any(c not in vocab for c in decode):
        raise _NotExact("a byte without a token")
    byte_ids = [vocab[c] for c, _ in sorted(decode.items(), key=lambda item: item[1])]
    keys = [bytes([b]) for b in range(256)] + [t.translate(to_byte).encode("latin-1") for t in tokens]
    ids = byte_ids + merge_ids
    if len(set(keys)) != len(keys):
        raise _NotExact("two merges make the same token")
    specials: dict[str, int] = {}
    for added in config.get("added_tokens") or []:
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            raise _NotExact(f"added token {added['content']!r} with lstrip/rstrip/single_word")
        specials[added["content"]] = int(added["id"])
    for a, b in itertools.pairwise(sorted(specials)):
        if b.startswith(a):
            raise _NotExact(f"added token {a!r} is a prefix of {b!r}")
    if model.get("ignore_merges"):
        # Whole pre-tokens that are vocabulary tokens skip BPE in both engines, so every token must be one
        # tiktoken knows (a merge result or a byte).
        known = set(ids) | set(specials.values())
        if any(i not in known for i in vocab.values()):
            raise _NotExact("ignore_merges with vocabulary tokens that no merge makes")
    if all(a < b for a, b in itertools.pairwise(merge_ids)) and not set(specials.values()) & set(ids):
        return dict(zip(keys, ids, strict=True)), specials, pattern, None  # ranks are the ids
    table = np.array([*ids, *specials.values()], dtype=np.int64)
    specials = {content: len(ids) + j for j, content in enumerate(specials)}
    return dict(zip(keys, range(len(keys)), strict=True)), specials, pattern, table


def _whole_tokens_are_stable(config: dict[str, Any], ranks: dict[bytes, int]) -> bool:
    """Without ``ignore_merges``, tiktoken still returns a pre-token that is itself a token as that token;
    ``tokenizers`` runs BPE on it. Both agree iff BPE of every token's own bytes gives the token back."""
    bare = dict(config, normalizer=None, pre_tokenizer=None, post_processor=None, decoder=None, added_tokens=[])
    tok = Tokenizer.from_str(json.dumps(bare))
    encode = {b: c for c, b in _byte_decoder().items()}
    words = ["".join(encode[b] for b in token) for token in ranks if len(token) > 1]
    return all(len(e) == 1 for e in tok.encode_batch_fast(words, add_special_tokens=False))


_Plan = tuple[dict[bytes, int], dict[str, int], str, "np.ndarray | None"]
#: Bump when ``_tiktoken_plan`` changes what it derives: cached plans of other versions are not read.
_PLAN_VERSION = 1


def _plan_file(config_text: str) -> Path:
    from zephon.shard_scan import cache_dir

    key = hashlib.sha256(f"{_PLAN_VERSION}\n{config_text}".encode()).hexdigest()
    return cache_dir() / "tokenizer-engines" / f"{key}.npz"


def _load_plan(file: Path) -> _Plan:
    """A plan saved by ``_save_plan`` (no pickle: byte strings as one blob + lengths)."""
    with np.load(file, allow_pickle=False) as data:
        meta = json.loads(data["meta"].tobytes().decode())
        if "not_exact" in meta:
            raise _NotExact(meta["not_exact"])
        blob, lengths, values = data["blob"].tobytes(), data["lengths"], data["ranks"]
        table = data["table"] if meta["table"] else None
    ends = np.cumsum(lengths)
    keys = [blob[a:b] for a, b in zip((ends - lengths).tolist(), ends.tolist(), strict=True)]
    return dict(zip(keys, values.tolist(), strict=True)), meta["specials"], meta["pattern"], table


def _save_plan(file: Path, plan: _Plan | None, reason: str = "") -> None:
    """Cache a plan (or why there is none), all or nothing; a cache that cannot be written is skipped."""
    if plan is None:
        meta: dict[str, Any] = {"not_exact": reason}
        arrays = {}
    else:
        ranks, specials, pattern, table = plan
        meta = {"specials": specials, "pattern": pattern, "table": table is not None}
        arrays = {
            "blob": np.frombuffer(b"".join(ranks), dtype=np.uint8),
            "lengths": np.fromiter(map(len, ranks), np.int64, len(ranks)),
            "ranks": np.fromiter(ranks.values(), np.int64, len(ranks)),
            "table": table if table is not None else np.empty(0, dtype=np.int64),
        }
    with contextlib.suppress(OSError):
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.stem}.{os.getpid()}.npz")
        np.savez(tmp, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        os.replace(tmp, file)


def _derive_plan(config_text: str) -> _Plan:
    """``_tiktoken_plan`` plus the whole-token check; raises ``_NotExact``."""
    config = json.loads(config_text)
    plan = _tiktoken_plan(config)
    if not config["model"].get("ignore_merges") and not _whole_tokens_are_stable(config, plan[0]):
        raise _NotExact("a token whose own bytes BPE-encode to other tokens")
    return plan


def _tiktoken_engine(config_text: str) -> tuple[Any, np.ndarray | None]:
    """A tiktoken ``Encoding`` equivalent to the tokenizer and its rank → id table (None: ranks are ids).

    What is derived from the tokenizer.json is cached under ``$ZEPHON_CACHE_DIR/tokenizer-engines`` (keyed
    by its content), so a warm start builds the engine in a few tens of milliseconds.
    """
    try:
        import tiktoken
    except ImportError as exc:
        raise _NotExact("tiktoken is not installed") from exc
    file = _plan_file(config_text)
    try:
        ranks, specials, pattern, table = _load_plan(file)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent or unreadable: derive again
        try:
            ranks, specials, pattern, table = _derive_plan(config_text)
        except _NotExact as exc:
            _save_plan(file, None, str(exc))
            raise
        _save_plan(file, (ranks, specials, pattern, table))
    try:
        encoding = tiktoken.Encoding("zephon", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    except ValueError as exc:  # the regex engines differ (fancy-regex vs Oniguruma)
        raise _NotExact(f"tiktoken refused the pattern ({exc})") from exc
    return encoding, table


def _threads() -> int:
    """Tokenizer threads: ``RAYON_NUM_THREADS`` (as for ``tokenizers``), else the cores this process may use."""
    value = os.environ.get("RAYON_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _flat(parts: list[np.ndarray], prefix: list[int], eos: int, table: np.ndarray | None = None) -> list[np.ndarray]:
    """Each part (mapped through ``table`` if given) with ``prefix`` before and ``eos`` after, as int64 views
    of one buffer: a few numpy calls per batch instead of per document."""
    if not parts:
        return []
    lengths = np.fromiter(map(len, parts), np.int64, len(parts))
    extra = len(prefix) + 1
    ends = np.cumsum(lengths + extra)
    starts = ends - lengths - extra
    out = np.empty(int(ends[-1]), dtype=np.int64)
    body = np.concatenate(parts)
    shift = np.repeat(np.arange(len(parts), dtype=np.int64) * extra + len(prefix), lengths)
    out[np.arange(len(body)) + shift] = body if table is None else table[body]
    for j, token in enumerate(prefix):
        out[starts + j] = token
    out[ends - 1] = eos
    return [out[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


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
        self._fast_ids: np.ndarray | None = None
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
            self._fast, self._fast_ids = _tiktoken_engine(config_text)
        except _NotExact as exc:
            self.engine_note = f"tiktoken not exact for this tokenizer: {exc}"
            return
        specials = self.tokenizer.get_added_tokens_decoder().values()
        probes = [*_PROBES, "".join(f"a{t.content}b " for t in specials)]
        if not self._same(probes, self._encode_fast(probes)):
            self._fast = None
            self.engine_note = "tiktoken ids differ from tokenizers on the probe text"

    def _same(self, texts: list[str], fast: list[np.ndarray]) -> bool:
        reference = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return all(np.array_equal(f, e.ids) for f, e in zip(fast, reference, strict=True))

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()  # a forked child (DataLoader worker) gets threads of its own
        if self._pool is None or self._pool[0] != pid:
            self._pool = (pid, ThreadPoolExecutor(max(1, _threads() - 1), thread_name_prefix="zephon-tokenize"))
        return self._pool[1]

    def _encode_fast(self, texts: list[str]) -> list[np.ndarray]:
        """tiktoken ranks (uint32) of each text, on ``_threads()`` threads: contiguous slices of about equal
        characters, the calling thread taking the last one (tiktoken releases the GIL while it encodes)."""
        run = self._fast_run

        n = min(_threads(), max(1, len(texts) // 8))
        if n == 1:
            return run(texts)
        sizes = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
        cuts = [0, *np.searchsorted(sizes, sizes[-1] * np.arange(1, n) / n).tolist(), len(texts)]
        pool = self._executor()
        futures = [pool.submit(run, texts[a:b]) for a, b in itertools.pairwise(cuts[:-1])]
        last = run(texts[cuts[-2] :])
        return [ids for f in futures for ids in f.result()] + last

    def _fast_run(self, texts: list[str]) -> list[np.ndarray]:
        """tiktoken ranks of each text on this thread. Special tokens in the text are encoded as such, as
        ``tokenizers`` does with added tokens."""
        encoding = self._fast
        allowed = encoding.special_tokens_set
        core = getattr(encoding, "_core_bpe", None)
        if hasattr(core, "encode_to_tiktoken_buffer"):  # ~2 µs/document less than the public wrapper
            buffer = core.encode_to_tiktoken_buffer
            return [np.frombuffer(buffer(t, allowed), dtype=np.uint32) for t in texts]
        return [encoding.encode_to_numpy(t, allowed_special=allowed, disallowed_special=()) for t in texts]

    def _ids(self, ranks: np.ndarray) -> np.ndarray:
        return ranks if self._fast_ids is None else self._fast_ids[ranks]

    def _same(self, texts: list[str], fast: list[np.ndarray]) -> bool:
        """Whether tiktoken's ``fast`` ranks are ``tokenizers``' ids for ``texts``."""
        reference = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return all(np.array_equal(self._ids(f), e.ids) for f, e in zip(fast, reference, strict=True))

    def _verify(self, texts: list[str], fast: list[np.ndarray]) -> None:
        """Keep tiktoken only if it matches ``tokenizers`` on the first documents (each cut to a few KB)."""
        docs = texts[:_SAMPLE_DOCS]
        if any(len(t) > _SAMPLE_CHARS for t in docs):
            docs = [t[:_SAMPLE_CHARS] for t in docs]
            fast = self._encode_fast(docs)
        self._verified = True
        if self._same(docs, fast[: len(docs)]):
            self.engine = "tiktoken"
        else:
            self._fast = None
            self.engine_note = "tiktoken ids differ from tokenizers on the first documents"

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (int64) of each text, with the BOS prefix and one EOS."""
        if self._fast is not None:
            try:
                fast = self._encode_fast(texts)
            except (UnicodeEncodeError, ValueError):  # e.g. lone surrogates: tokenizers handles (or refuses) them
                fast = None
            if fast is not None and not self._verified:
                self._verify(texts, fast)
            if fast is not None and self._fast is not None:
                return _flat(fast, self.prefix, self.eos_id, self._fast_ids)
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return _flat([np.array(e.ids, dtype=np.int64) for e in encodings], self.prefix, self.eos_id)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None  # threads do not travel
        return state
