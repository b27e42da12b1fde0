"""Where the demo's shipped assets live: package data (``zephon/assets/**/*``), found with :mod:`importlib.resources`
so they resolve the same way from a checkout, an editable install or a wheel — the tokenizer directory
``assets/tokenizer`` (``scripts/build_demo_tokenizer.py``) and the corpus file ``assets/demo/corpus.jsonl.zst``
(``scripts/build_demo_corpus.py``; read by :mod:`zephon.demo.corpus`).
"""

from __future__ import annotations

import importlib.resources
from importlib.resources.abc import Traversable

__all__ = ["CORPUS_FILE", "corpus_bytes", "demo_tokenizer_path"]

#: The corpus file, relative to the ``zephon`` package.
CORPUS_FILE = "assets/demo/corpus.jsonl.zst"


def _asset(relative: str) -> Traversable:
    resource = importlib.resources.files("zephon")
    for part in relative.split("/"):
        resource = resource / part
    return resource


def demo_tokenizer_path() -> str:
    """Absolute path of the directory holding the embedded demo tokenizer (``zephon/assets/tokenizer``)."""
    return str(_asset("assets/tokenizer"))


def corpus_bytes() -> bytes:
    """The bytes of the shipped corpus file, ``zephon/assets/demo/corpus.jsonl.zst`` (zstd-compressed)."""
    return _asset(CORPUS_FILE).read_bytes()
