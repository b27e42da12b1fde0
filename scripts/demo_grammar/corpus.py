"""The shipped corpus file and the demo shards of any seed, from the grammar.

``corpus_jsonl(seed)`` is the content of ``zephon/assets/demo/corpus.jsonl.zst`` before compression: the rows
of every demo shard (:data:`zephon.demo.DEMO_SHARDS`) in kind, shard, then row order, one JSON object a line,
``{"id": "<kind>-<shard>-<row>", "text": ...}`` (``ensure_ascii=False``, keys in that order, ``\\n`` after
each). ``write_corpus(path)`` compresses it with zstd (level 19: ~1.1 MB for the ~4.6 MB of seed 0);
``zephon.demo`` reads it back, so its shards are byte-identical to those written straight from the grammar::

    >>> corpus_jsonl().split(b"\\n", 1)[0][:40]
    b'{"id": "prose-0-0", "text": "The Sulmar'

``write_demo_dataset(root, seed=s)`` writes the shards of seed ``s`` with Zephon's own shard writer
(:func:`zephon.demo.dataset.write_shards`), so seed 0 gives the same files as ``zephon.demo.write_demo_dataset``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import zstandard

from demo_grammar.generator import generate_demo_documents
from zephon.demo import DEMO_KINDS, DEMO_SHARDS
from zephon.demo.corpus import shard_ids
from zephon.demo.dataset import write_shards

__all__ = ["ASSET", "LEVEL", "corpus_jsonl", "write_corpus", "write_demo_dataset"]

#: The shipped corpus file in the checkout, and its zstd level.
ASSET = Path(__file__).resolve().parents[2] / "zephon" / "assets" / "demo" / "corpus.jsonl.zst"
LEVEL = 19


def corpus_jsonl(seed: int = 0) -> bytes:
    """Every demo shard's rows for ``seed``, as the corpus file's JSON lines (see the module docstring)."""
    lines = []
    for kind in DEMO_KINDS:
        shards, per_shard = DEMO_SHARDS[kind]
        texts = generate_demo_documents(kind, shards * per_shard, seed)
        ids = [i for shard in range(shards) for i in shard_ids(kind, shard)]
        lines += [json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in zip(ids, texts, strict=True)]
    return "".join(lines).encode("utf-8")


def write_corpus(path: Path = ASSET, seed: int = 0) -> int:
    """Write ``corpus_jsonl(seed)`` zstd-compressed to ``path``; returns the compressed size in bytes."""
    data = zstandard.ZstdCompressor(level=LEVEL).compress(corpus_jsonl(seed))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return len(data)


def write_demo_dataset(root: str | os.PathLike[str], *, seed: int = 0) -> str:
    """The demo shards of ``seed`` under ``root/demo/`` (missing or incomplete ones); returns that directory."""
    return write_shards(root, seed=seed, documents=lambda kind, count: generate_demo_documents(kind, count, seed))
