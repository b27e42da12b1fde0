"""Lone surrogates: the one kind of Python string UTF-8 cannot encode, so no tokenizer engine takes it.

JSON's ``"\\ud83d"`` escape without its low half parses (``json.loads``) to a string holding U+D83D alone — scraped
text with a cut emoji has them. Every engine refuses such a string (``tokenizers`` with a ``TypeError`` that names
nothing), so the readers make it a bad document first, reason ``not_utf8``: the JSONL reader for a text field
(``zephon.executor.read.jsonl``), chat rendering for a message (``zephon.executor.encode.chat_render``).

Invariant: a string for which ``lone_surrogate`` gives None encodes to UTF-8 (``json`` joins an escaped pair into
one character, so any surrogate left in a parsed string is alone). Example: ``lone_surrogate("ok \\ud83d")`` →
``0xD83D``; ``lone_surrogate("ok 😀")`` → None.
"""

from __future__ import annotations

import re

__all__ = ["lone_surrogate"]

_SURROGATE = re.compile("[\\ud800-\\udfff]")


def lone_surrogate(text: str) -> int | None:
    """The first surrogate code point in ``text``, or None (ASCII text: no scan)."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    return ord(found.group()) if found else None
