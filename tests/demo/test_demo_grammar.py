"""Tests for the grammar behind the demo corpus (``scripts/demo_grammar``, in the checkout, not installed): it is
deterministic, its documents have the documented shapes, and it regenerates the shipped corpus file exactly."""

from __future__ import annotations

import ast

import pytest
import zstandard
from demo_grammar import corpus_jsonl, generate_demo_documents
from demo_grammar.corpus import ASSET

from zephon.demo import DEMO_KINDS, DEMO_SHARDS
from zephon.demo.assets import corpus_bytes


def test_regenerating_gives_the_shipped_corpus_byte_for_byte() -> None:
    """The shipped file is the grammar's seed 0: regenerate it (scripts/build_demo_corpus.py) and compare."""
    assert ASSET.read_bytes() == corpus_bytes()
    shipped = zstandard.ZstdDecompressor().decompress(corpus_bytes())
    fresh = corpus_jsonl(seed=0)
    assert fresh == shipped, "zephon/assets/demo/corpus.jsonl.zst is stale — run python scripts/build_demo_corpus.py"
    assert fresh.count(b"\n") == sum(shards * rows for shards, rows in DEMO_SHARDS.values()) == 3800


def test_generate_is_deterministic_and_prefix_stable() -> None:
    for kind in DEMO_KINDS:
        first = generate_demo_documents(kind, 20, seed=3)
        assert first == generate_demo_documents(kind, 20, seed=3)
        assert first[:7] == generate_demo_documents(kind, 7, seed=3)
        assert len(set(first)) == len(first)
        assert all(isinstance(doc, str) and doc for doc in first)


def test_documents_differ_across_kinds_and_seeds() -> None:
    by_kind = {kind: generate_demo_documents(kind, 10, seed=0) for kind in DEMO_KINDS}
    for a in DEMO_KINDS:
        for b in DEMO_KINDS:
            if a != b:
                assert not set(by_kind[a]) & set(by_kind[b])
    for kind in DEMO_KINDS:
        other = generate_demo_documents(kind, 10, seed=1)
        assert not set(other) & set(by_kind[kind])


def test_generate_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError):
        generate_demo_documents("poetry", 1, seed=0)
    assert generate_demo_documents("short", 0, seed=0) == []


def test_document_shapes() -> None:
    prose = generate_demo_documents("prose", 200, seed=0)
    words = [len(doc.split()) for doc in prose]
    assert min(words) >= 50 and max(words) <= 2000
    assert max(words) > 10 * min(words)  # lengths vary widely
    assert any("\n\n" in doc for doc in prose)

    code = generate_demo_documents("code", 100, seed=0)
    for doc in code:
        ast.parse(doc)
    joined = "\n".join(code)
    for marker in ("def ", "for ", "# ", "\n    ", "return "):
        assert marker in joined
    assert any(ch.isdigit() for ch in joined)

    short = generate_demo_documents("short", 500, seed=0)
    assert all("\n" not in doc and 5 <= len(doc.split()) <= 30 for doc in short)
