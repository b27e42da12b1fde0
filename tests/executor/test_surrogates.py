"""Lone surrogates (``zephon.executor.encode.surrogates``): found in a parsed JSON value's strings, keys too, with
the top-level key they lie under; an escaped pair is one character and is not one."""

from __future__ import annotations

import json

from zephon.executor.encode.surrogates import lone_surrogate


def test_a_lone_surrogate_is_found_under_its_top_level_key() -> None:
    record = json.loads('{"id": 1, "meta": {"tags": ["ok", "x\\udc00"]}, "text": "\\ud83d"}')
    assert lone_surrogate(record) == ("meta", 0xDC00)  # the first, in the record's order
    assert lone_surrogate(record["text"], "text") == ("text", 0xD83D)
    assert lone_surrogate(json.loads('{"k\\ud800": 1}')) == ("k\ud800", 0xD800)  # a key


def test_pairs_plain_text_and_other_values_have_none() -> None:
    paired = json.loads('{"text": "smile \\ud83d\\ude00", "n": 3, "none": null, "list": [1.5, "é"]}')
    assert paired["text"] == "smile 😀"
    assert lone_surrogate(paired) is None
    assert lone_surrogate("ascii only") is None and lone_surrogate(7) is None and lone_surrogate(None) is None
