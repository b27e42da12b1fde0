"""Where the demo's shipped assets live inside the installed package (``zephon/assets``).

Both are package data (``[tool.setuptools.package-data]`` ships ``zephon/assets/**/*``), located with
:mod:`importlib.resources` so they resolve the same way from a checkout, an editable install or a wheel:

* ``demo_tokenizer_path()``: the demo tokenizer directory, ``zephon/assets/tokenizer`` (rebuilt by
  ``scripts/build_demo_tokenizer.py``).
* ``vocabulary_text()``: the corpus word lists, ``zephon/assets/demo/vocabulary.json`` (read by
  :mod:`zephon.demo.vocabulary`).
"""

from __future__ import annotations

import importlib.resources
from importlib.resources.abc import Traversable

__all__ = ["VOCABULARY_FILE", "demo_tokenizer_path", "vocabulary_text"]

#: The word-list file, relative to the ``zephon`` package.
VOCABULARY_FILE = "assets/demo/vocabulary.json"


def _asset(relative: str) -> Traversable:
    resource = importlib.resources.files("zephon")
    for part in relative.split("/"):
        resource = resource / part
    return resource


def demo_tokenizer_path() -> str:
    """Absolute path of the directory holding the embedded demo tokenizer (``zephon/assets/tokenizer``)."""
    return str(_asset("assets/tokenizer"))


def vocabulary_text() -> str:
    """The text of the shipped word-list file, ``zephon/assets/demo/vocabulary.json``."""
    return _asset(VOCABULARY_FILE).read_text(encoding="utf-8")
