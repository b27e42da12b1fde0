"""Lone surrogates: the one kind of Python string UTF-8 cannot encode, so no tokenizer engine takes it.

JSON's ``"\\ud83d"`` escape without its low half parses (``json.loads``) to a string holding U+D83D alone — scraped
text with a cut emoji has them. Every engine refuses such a string (``tokenizers`` with a ``TypeError`` that names
nothing), so the JSONL reader makes its document a bad one first, reason ``not_utf8``
(``zephon.executor.read.jsonl``): the text field in a text run, any string of the record in a record run (chat,
user operators). Only a line holding a ``\\ud``/``\\uD`` escape can give one, so the reader looks only there: a
scan of every non-ASCII string would cost ~3 CPU ns a character (Parquet strings, checked as UTF-8 when converted,
cannot hold one: ``zephon.executor.read.arrow_values``).

Invariant: a string without a surrogate encodes to UTF-8 (``json`` joins an escaped pair into one character, so
any surrogate left in a parsed string is alone). Example:
``lone_surrogate({"id": 7, "messages": [{"content": "ok \\ud83d"}]})`` → ``("messages", 0xD83D)``;
``lone_surrogate("ok \\ud83d", "text")`` → ``("text", 0xD83D)``; ``lone_surrogate("ok 😀")`` → None.
"""

from __future__ import annotations

import re

__all__ = ["lone_surrogate"]

_SURROGATE = re.compile("[\\ud800-\\udfff]")


def lone_surrogate(value: object, key: str = "") -> tuple[str, int] | None:
    """The first lone surrogate in a parsed JSON value's strings (dict keys too) — the top-level key it lies under
    (``key`` for a bare string) and its code point — or None. ASCII strings are not scanned."""
    if isinstance(value, str):
        found = None if value.isascii() else _SURROGATE.search(value)
        return (key, ord(found.group())) if found else None
    if isinstance(value, dict):
        for k, v in value.items():
            got = lone_surrogate(k, key or str(k)) or lone_surrogate(v, key or str(k))
            if got is not None:
                return got
    elif isinstance(value, list):
        for v in value:
            got = lone_surrogate(v, key)
            if got is not None:
                return got
    return None
