"""A tiktoken engine that gives exactly the ids of a Hugging Face byte-level BPE tokenizer.

tiktoken merges the adjacent pair whose concatenation has the lowest rank, ``tokenizers`` the pair listed
first in ``merges``: the same result when merge ``i`` makes the token of rank ``i``. ``tiktoken_engine``
derives tiktoken's ``mergeable_ranks``, ``special_tokens`` and ``pat_str`` from a tokenizer.json, or raises
``NotExact`` naming the feature tiktoken would encode differently (normalizer, dropout, byte fallback, word
affixes, a pre-tokenizer other than one regex + ``ByteLevel(add_prefix_space=False)``, stripped added tokens,
a token whose own bytes BPE-encode to other tokens). What it derives is cached under
``$ZEPHON_CACHE_DIR/tokenizer-engines`` (keyed by the tokenizer.json's content, no pickle).

Encoding many documents (``encode_joined``): the texts are joined with a special token ``S`` between them and
encoded in one tiktoken call. tiktoken (like ``tokenizers``) splits the text at special tokens first and runs
the pre-tokenization regex and BPE on each piece alone, so the result is ``enc(t1) S enc(t2) S ...`` — each
text's own ids, separated by ``S``'s rank. It is used only when that is certain: ``S`` has no border (no proper
prefix equal to a suffix, so no occurrence can straddle a text and a separator), the joined text holds ``S``
exactly ``n - 1`` times (no text contains it) and the ids hold its rank exactly ``n - 1`` times (no other
special token swallowed a separator); otherwise the texts are encoded one by one (``encode_buffers``,
``join_ranks``). One call instead of one per text: no Python object per document, one GIL release per thread
and batch — ~20 % faster on short documents. ``zephon.executor.encode.text.Encoder`` decides when to use the
engine (after checking its ids against ``tokenizers``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import zipfile
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from zephon.errors import StorageError

#: GPT-2's pre-tokenization regex (``ByteLevel(use_regex=True)`` in ``tokenizers``).
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


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


class NotExact(Exception):
    """The tokenizer uses a feature tiktoken does not reproduce; the message says which."""


def _pattern(pre: dict[str, Any] | None) -> str:
    """The one regex of a byte-level pre-tokenizer, as tiktoken's ``pat_str``."""
    if pre is None:
        raise NotExact("no pre-tokenizer")
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        raise NotExact("pre-tokenizer is not ByteLevel(add_prefix_space=False)")
    byte_level, splits = steps[-1], steps[:-1]
    if byte_level.get("use_regex", True):
        if splits:
            raise NotExact("more than one pre-tokenization regex")
        return _GPT2_PATTERN
    if len(splits) != 1 or splits[0].get("type") != "Split":
        raise NotExact("pre-tokenizer is not one Split + ByteLevel")
    split = splits[0]
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise NotExact(f"Split behavior {split.get('behavior')!r} (invert={split.get('invert')})")
    pattern = split.get("pattern") or {}
    if "Regex" in pattern:
        return str(pattern["Regex"])
    import re

    return re.escape(str(pattern["String"]))


def _tiktoken_plan(
    config: dict[str, Any],
) -> tuple[dict[bytes, int], dict[str, int], str, np.ndarray | None]:
    """tiktoken's ``mergeable_ranks``, ``special_tokens`` and ``pat_str`` for a tokenizer.json, and the rank →
    id table (None when the ranks are the ids). Raises ``NotExact`` for what tiktoken would encode differently.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank, ``tokenizers`` the pair listed
    first in ``merges``: the same order when merge ``i`` makes the token of rank ``i`` (+ a constant). When the
    merged tokens' ids grow with the merge order (GPT-2, cl100k-style vocabularies) the ids are the ranks;
    otherwise ranks are the 256 bytes, then the merges in order, then the added tokens, mapped back by a table.
    """
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        raise NotExact(f"model {model.get('type')!r} is not BPE")
    if config.get("normalizer") is not None:
        raise NotExact("a normalizer")
    if config.get("truncation") is not None or config.get("padding") is not None:
        raise NotExact("truncation or padding in tokenizer.json")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise NotExact(f"BPE {key}")
    if model.get("byte_fallback"):
        raise NotExact("BPE byte_fallback")
    pattern = _pattern(config.get("pre_tokenizer"))
    decode = _byte_decoder()
    to_byte = {ord(c): b for c, b in decode.items()}  # str.translate table: alphabet char → byte value
    vocab: dict[str, int] = model["vocab"]
    merges = [m if isinstance(m, list) else m.split(" ", 1) for m in model.get("merges") or []]
    tokens = ["".join(m) for m in merges]
    foreign = set("".join(tokens)) - decode.keys()
    if foreign:
        raise NotExact(f"merged tokens outside the byte-level alphabet ({''.join(sorted(foreign))[:20]!r})")
    outside = (set(itertools.chain.from_iterable(merges)) | set(tokens)) - vocab.keys()
    if outside:
        raise NotExact(f"merges use {len(outside)} strings that are not in the vocabulary, e.g. {min(outside)!r}")
    merge_ids = [vocab[t] for t in tokens]
    if any(c not in vocab for c in decode):
        raise NotExact("a byte without a token")
    byte_ids = [vocab[c] for c, _ in sorted(decode.items(), key=lambda item: item[1])]
    keys = [bytes([b]) for b in range(256)] + [t.translate(to_byte).encode("latin-1") for t in tokens]
    ids = byte_ids + merge_ids
    if len(set(keys)) != len(keys):
        raise NotExact("two merges make the same token")
    specials: dict[str, int] = {}
    for added in config.get("added_tokens") or []:
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            raise NotExact(f"added token {added['content']!r} with lstrip/rstrip/single_word")
        specials[added["content"]] = int(added["id"])
    for a, b in itertools.pairwise(sorted(specials)):
        if b.startswith(a):
            raise NotExact(f"added token {a!r} is a prefix of {b!r}")
    if model.get("ignore_merges"):
        # Whole pre-tokens that are vocabulary tokens skip BPE in both engines, so every token must be one
        # tiktoken knows (a merge result or a byte).
        known = set(ids) | set(specials.values())
        if any(i not in known for i in vocab.values()):
            raise NotExact("ignore_merges with vocabulary tokens that no merge makes")
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
    from zephon.storage.files import cache_dir

    key = hashlib.sha256(f"{_PLAN_VERSION}\n{config_text}".encode()).hexdigest()
    return cache_dir() / "tokenizer-engines" / f"{key}.npz"


def _load_plan(file: Path) -> _Plan:
    """A plan saved by ``_save_plan`` (no pickle: byte strings as one blob + lengths)."""
    with np.load(file, allow_pickle=False) as data:
        meta = json.loads(data["meta"].tobytes().decode())
        if "not_exact" in meta:
            raise NotExact(meta["not_exact"])
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
    from zephon.storage.files import write_atomic

    def save(tmp: Path) -> None:
        np.savez(tmp, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)

    with contextlib.suppress(StorageError):
        write_atomic(file, save, "the tokenizer-engine cache")


def _derive_plan(config_text: str) -> _Plan:
    """``_tiktoken_plan`` plus the whole-token check; raises ``NotExact``."""
    config = json.loads(config_text)
    plan = _tiktoken_plan(config)
    if not config["model"].get("ignore_merges") and not _whole_tokens_are_stable(config, plan[0]):
        raise NotExact("a token whose own bytes BPE-encode to other tokens")
    return plan


def tiktoken_engine(config_text: str) -> tuple[Any, np.ndarray | None]:
    """A tiktoken ``Encoding`` equivalent to the tokenizer and its rank → id table (None: ranks are ids).

    What is derived from the tokenizer.json is cached under ``$ZEPHON_CACHE_DIR/tokenizer-engines`` (keyed
    by its content), so a warm start builds the engine in a few tens of milliseconds.
    """
    try:
        import tiktoken
    except ImportError as exc:
        raise NotExact("tiktoken is not installed") from exc
    file = _plan_file(config_text)
    try:
        ranks, specials, pattern, table = _load_plan(file)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent or unreadable: derive again
        try:
            ranks, specials, pattern, table = _derive_plan(config_text)
        except NotExact as exc:
            _save_plan(file, None, str(exc))
            raise
        _save_plan(file, (ranks, specials, pattern, table))
    try:
        encoding = tiktoken.Encoding("zephon", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    except ValueError as exc:  # the regex engines differ (fancy-regex vs Oniguruma)
        raise NotExact(f"tiktoken refused the pattern ({exc})") from exc
    return encoding, table


_NBYTES = attrgetter("nbytes")


def encode_buffers(encoding: Any, texts: Sequence[str]) -> list[Any]:
    """tiktoken ranks of each text (objects exposing uint32 buffers), on this thread; tiktoken releases the
    GIL while it encodes. Special tokens in the text are encoded as such, as ``tokenizers`` does with added
    tokens."""
    allowed = encoding.special_tokens_set
    core = getattr(encoding, "_core_bpe", None)
    if hasattr(core, "encode_to_tiktoken_buffer"):  # ~2 µs/document less than the public wrapper
        buffer = core.encode_to_tiktoken_buffer
        return [buffer(t, allowed) for t in texts]
    return [encoding.encode_to_numpy(t, allowed_special=allowed, disallowed_special=()) for t in texts]


def join_ranks(buffers: Sequence[Any], prefix: Sequence[int], suffix: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``prefix + ranks + suffix`` of every buffer, concatenated (uint32), and the length of each.

    One ``bytes.join`` with ``suffix + prefix`` as the separator (plus one suffix before the first and one
    prefix after the last, left out of the returned view) does all the copying.
    """
    n = len(buffers)
    if not n:
        return np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.int64)
    pre = np.asarray(prefix, dtype=np.uint32).tobytes()
    post = np.asarray(suffix, dtype=np.uint32).tobytes()
    joined = (post + pre).join([b"", *buffers, b""])
    extra = len(prefix) + len(suffix)
    # nbytes, not len: tiktoken's buffers report their shape in bytes
    sizes = np.fromiter(map(_NBYTES, map(memoryview, buffers)), np.int64, n)
    sizes >>= 2
    sizes += extra
    ranks = np.frombuffer(joined, dtype=np.uint32, count=int(sizes.sum()), offset=len(post))
    return ranks, sizes


def separator(encoding: Any, preferred: str | None) -> tuple[str, int] | None:
    """A special token to join texts with (``preferred`` if it qualifies) and its rank; None if none has no
    border (see the module docstring)."""
    specials = sorted(encoding.special_tokens_set, key=lambda t: (t != preferred, -len(t), t))
    for token in specials:
        if len(token) > 1 and not any(token[:k] == token[-k:] for k in range(1, len(token))):
            return token, int(encoding.encode_single_token(token))
    return None


def encode_joined(encoding: Any, texts: Sequence[str], sep: str, sep_rank: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Ranks of the texts, each followed by ``sep_rank`` (uint32), and how many each has (separator included),
    from one tiktoken call on the texts joined by ``sep``; None when that would not be exact."""
    n = len(texts)
    if not n:
        return np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.int64)
    joined = sep.join(texts)
    if joined.count(sep) != n - 1:  # a text contains the separator
        return None
    core = getattr(encoding, "_core_bpe", None)
    if hasattr(core, "encode_to_tiktoken_buffer"):
        ranks = np.frombuffer(core.encode_to_tiktoken_buffer(joined, encoding.special_tokens_set), dtype=np.uint32)
    else:
        ranks = encoding.encode_to_numpy(joined, allowed_special=encoding.special_tokens_set, disallowed_special=())
    out = np.empty(len(ranks) + 1, dtype=np.uint32)
    out[:-1], out[-1] = ranks, sep_rank
    ends = np.flatnonzero(out == sep_rank)
    if len(ends) != n:  # another special token took a separator in
        return None
    ends += 1
    return out, np.diff(ends, prepend=0)
