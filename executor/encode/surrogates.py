"""Lone surrogates: the one kind of Python string UTF-8 cannot encode, so no tokenizer engine takes it.

JSON's ``"\\ud83d"`` escape without its low half parses (``json.loads``) to a string holding U+D83D alone — scraped
text with a cut emoji has them. Every engine refuses such a string (``tokenizers`` with a ``TypeError`` that names
nothing), so the JSONL reader makes its document a bad one first, reason ``not_utf8``
(``zephon.executor.read.jsonl``): the text field in a text run, any string of the record in a record run (chat,
user operators). Only a line holding a ``\\ud``/``\\uD`` escape can give one, so the reader looks only there: a
scan of every non-ASCII string would cost ~3 CPU ns a character (Parquet strings, checked as UTF-8 when converted,
cannot hold one: ``zephon.executor.read.arrow_values``).

What is left comes from a user operator's output (``map_transform`` / ``map_batch``). Checking every output
would cost ~0.6-2 CPU ns a non-ASCII character, so the encoder looks only once the engine and ``tokenizers``
have both refused a batch (``UnencodableText.find``): a good run pays nothing, and the error names the row
(``zephon.executor.engines.at_document``). It is raised under either ``on_bad_document`` policy, the texts
being past the reader's skip decisions when it is found.

Invariant: a string without a surrogate encodes to UTF-8 (``json`` joins an escaped pair into one character, so
any surrogate left in a parsed string is alone). Example:
``lone_surrogate({"id": 7, "messages": [{"content": "ok \\ud83d"}]})`` → ``("messages", 0xD83D)``;
``lone_surrogate("ok \\ud83d", "text")`` → ``("text", 0xD83D)``; ``lone_surrogate("ok 😀")`` → None;
``UnencodableText.find(["ok", "a\\ud800"])`` → document 1, U+D800 at character 1.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from zephon.errors import DatasetError
from zephon.executor.engines.at_document import AtDocument

__all__ = ["UnencodableText", "lone_surrogate"]

_SURROGATE = re.compile("[\\ud800-\\udfff]")


def _first(text: str) -> re.Match[str] | None:
    """The first surrogate of ``text``; an ASCII string (the common case, checked in C) is not scanned."""
    return None if text.isascii() else _SURROGATE.search(text)


def lone_surrogate(value: object, key: str = "") -> tuple[str, int] | None:
    """The first lone surrogate in a parsed JSON value's strings (dict keys too) — the top-level key it lies under
    (``key`` for a bare string) and its code point — or None. ASCII strings are not scanned."""
    if isinstance(value, str):
        found = _first(value)
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


class UnencodableText(DatasetError, AtDocument):
    """Document ``index``'s text holds a lone surrogate (``codepoint``) at character ``position``."""

    def __init__(self, where: str, *, index: int, codepoint: int, position: int) -> None:
        super().__init__(
            f"{where}: the text to tokenize must be encodable as UTF-8, got a lone surrogate U+{codepoint:04X} at "
            f"character {position} — if a map_transform/map_batch made it, fix the function "
            "(text.encode('utf-8', 'replace').decode() replaces them); else fix or remove that row"
        )
        self.index, self.codepoint, self.position = index, codepoint, position

    def relabel(self, where: str, index: int) -> UnencodableText:
        return UnencodableText(where, index=index, codepoint=self.codepoint, position=self.position)

    @classmethod
    def find(cls, texts: Sequence[object]) -> UnencodableText | None:
        """The first of ``texts`` holding a lone surrogate (values that are not strings are passed over), or None."""
        for i, text in enumerate(texts):
            found = _first(text) if isinstance(text, str) else None
            if found is not None:
                return cls(f"document {i} of a batch", index=i, codepoint=ord(found.group()), position=found.start())
        return None

    @classmethod
    def raise_found(cls, texts: Sequence[object]) -> None:
        """Raise ``find(texts)`` when there is one (in an ``except`` block: the error it replaces is not chained)."""
        found = cls.find(texts)
        if found is not None:
            raise found from None
