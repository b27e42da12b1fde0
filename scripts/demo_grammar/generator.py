"""The demo corpus generator: ``generate_demo_documents(kind, count, seed)``.

Three kinds of synthetic documents, all text produced by the small grammars of :mod:`demo_grammar.prose`,
:mod:`demo_grammar.code` and :mod:`demo_grammar.short` from the word lists of :mod:`demo_grammar.vocabulary`; no
external corpus is copied. Seed 0 is the demo corpus Zephon ships (``zephon/assets/demo/corpus.jsonl.zst``,
written by ``scripts/build_demo_corpus.py``); the other seeds exist only here, in the checkout.

Determinism invariant: the documents are a pure function of ``(kind, count, seed)`` and the word lists. The only
randomness is ``numpy.random.default_rng((seed, kind_index))``, where ``kind_index`` is the kind's position in
:data:`zephon.demo.DEMO_KINDS`, and documents are drawn one after another, so the same seed gives the same
documents in every process, and a shorter list is a prefix of a longer one::

    >>> first = generate_demo_documents("short", 3, seed=7)
    >>> first == generate_demo_documents("short", 3, seed=7)
    True
    >>> first == generate_demo_documents("short", 10, seed=7)[:3]
    True

Changing a word list, the order of random decisions in a grammar, or the kinds' order changes the corpus
(and with it the shipped corpus file, the demo shards and the tokenizer trained on them,
``scripts/build_demo_tokenizer.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from demo_grammar.code import code_document
from demo_grammar.draw import Draw
from demo_grammar.prose import prose_document
from demo_grammar.short import short_document
from zephon.demo import DEMO_KINDS

__all__ = ["DEMO_KINDS", "generate_demo_documents"]

_GENERATORS: dict[str, Callable[[Draw], str]] = {
    "prose": prose_document,
    "code": code_document,
    "short": short_document,
}


def generate_demo_documents(kind: str, count: int, seed: int) -> list[str]:
    """Generate ``count`` deterministic synthetic documents of one kind.

    ``"prose"``: English-like paragraphs, ~50-2000 words; ``"code"``: Python-like snippets that parse;
    ``"short"``: one-line titles, questions and answers, 5-30 words. The same ``kind`` and ``seed`` always give
    the same documents, and a shorter list is a prefix of a longer one (see the module docstring).
    """
    if kind not in _GENERATORS:
        raise ValueError(f"kind must be one of {DEMO_KINDS}, got {kind!r} — pass one of those kinds")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count} — pass the number of documents wanted")
    draw = Draw(np.random.default_rng((seed, DEMO_KINDS.index(kind))))
    make = _GENERATORS[kind]
    return [make(draw) for _ in range(count)]
