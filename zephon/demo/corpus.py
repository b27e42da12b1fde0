"""The shipped demo corpus: the texts of the demo shards, ``generate_demo_documents(kind, count)``.

The texts were generated once (seed 0) by the grammar in the checkout's ``scripts/demo_grammar``, which is not
installed, and ship as ``zephon/assets/demo/corpus.jsonl.zst``: one JSON object a line, ``{"id": ..., "text":
...}``, the shards' rows in kind (:data:`DEMO_KINDS`), shard, then row order — line 1 is ``prose-0-0``, line 301
``prose-1-0``, line 1201 ``code-0-0``. The file is read once per process and its ids checked against
:data:`DEMO_SHARDS`. Other seeds exist only in the checkout (``demo_grammar.generate_demo_documents``).
"""

from __future__ import annotations

import functools
import json

import zstandard

from zephon.demo.assets import CORPUS_FILE, corpus_bytes

__all__ = ["DEMO_KINDS", "DEMO_SHARDS", "generate_demo_documents", "shard_ids"]

#: The document kinds, in shard-file order (and in the grammar's seed derivation).
DEMO_KINDS: tuple[str, ...] = ("prose", "code", "short")
#: Layout of the demo dataset: kind -> (number of shards, documents per shard).
DEMO_SHARDS: dict[str, tuple[int, int]] = {"prose": (4, 300), "code": (2, 300), "short": (1, 2000)}


def shard_ids(kind: str, shard: int) -> list[str]:
    """The ``id`` column of one shard: ``"<kind>-<shard>-<row>"``."""
    return [f"{kind}-{shard}-{row}" for row in range(DEMO_SHARDS[kind][1])]


@functools.cache
def _texts() -> dict[str, tuple[str, ...]]:
    rows = [json.loads(line) for line in zstandard.ZstdDecompressor().decompress(corpus_bytes()).splitlines()]
    texts, start = {}, 0
    for kind in DEMO_KINDS:
        ids = [i for shard in range(DEMO_SHARDS[kind][0]) for i in shard_ids(kind, shard)]
        chunk, start = rows[start : start + len(ids)], start + len(ids)
        if [row["id"] for row in chunk] != ids:
            raise ValueError(
                f"zephon/{CORPUS_FILE} must hold the rows of DEMO_SHARDS in order, got other ids for "
                f"{kind!r} — rebuild it with scripts/build_demo_corpus.py"
            )
        texts[kind] = tuple(row["text"] for row in chunk)
    return texts


def generate_demo_documents(kind: str, count: int, seed: int = 0) -> list[str]:
    """The first ``count`` documents of one kind of the shipped demo corpus: the shards' texts, in order.

    ``"prose"``: English-like paragraphs, ~50-2000 words (1200 shipped); ``"code"``: Python-like snippets that
    parse (600); ``"short"``: one-line titles, questions and answers, 5-30 words (2000). Only seed 0 ships.
    """
    if kind not in DEMO_KINDS:
        raise ValueError(f"kind must be one of {DEMO_KINDS}, got {kind!r} — pass one of those kinds")
    if seed != 0:
        raise ValueError(
            f"seed must be 0 (the demo corpus shipped with Zephon), got {seed} — generate other "
            "seeds in a Zephon checkout with scripts/demo_grammar (generate_demo_documents)"
        )
    texts = _texts()[kind]
    if not 0 <= count <= len(texts):
        raise ValueError(
            f"count must be in [0, {len(texts)}] for {kind!r} (the shipped demo corpus), got {count} "
            "— ask for fewer, or generate more in a checkout with scripts/demo_grammar"
        )
    return list(texts[:count])
