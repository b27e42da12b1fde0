"""Whether an engine gives ``tokenizers``' ids, on tricky probes and a sample of the run's own documents.

``disagreement(engine, reference, texts)`` returns None when the engine's ids equal the reference's for every
text, else a short reason naming the first text that differs. A text the reference refuses (``tokenizers``
raises on a lone surrogate) must be refused by the engine too: the ``Encoder`` then encodes the batch with
``tokenizers``, which raises its own error, so the run behaves exactly as on ``tokenizers``.

``probes(reference)`` are the texts every candidate is checked on before it is used, each named: digit runs,
whitespace of every kind and length, contractions, CJK, emoji and combining marks, long runs of one
character, lone surrogates, and every added token of the tokenizer written inside text, next to another,
and cut one character short.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from zephon.executor.engines.base import Engine

_FIXED: tuple[tuple[str, str], ...] = (
    ("empty", ""),
    ("prose", "Hello world! It's 2024-06-01: 1234567 items @ $3.50 (≈12%). DON'T we'll I'M they've you'd"),
    ("code", "def f(x):\n\treturn x**2  # café naïve\r\n   \n  trailing   \n\n\n   "),
    ("whitespace", " \u00a0nbsp\u2009thin\u3000ideo\u0085nel\u2028ls\u000b\u000cff\u200bzw\ufeffbom x \t\t tabs  "),
    ("digits", "0 12 345 6789 1234567890123456789 3.14159 1,000,000 ١٢٣٤٥ ½ Ⅻ 0x1F 1e-9"),
    ("cjk", "東京は日本の首都です。中文测试，标点。한국어 텍스트 ひらがな カタカナ"),
    ("emoji", "🙂🙂🙂 👩‍👩‍👧 🇫🇷 e\u0301 a\u0308\u0301 \U0001f600x"),
    ("scripts", "Ελληνικά привет мир עברית العربية हिन्दी ไทย"),
    ("long run", "a" * 4000),
    ("long spaces", " " * 3000 + "x" + "\n" * 500),
    ("repeated", "ab " * 2000 + "=" * 1000 + "-" * 999),
    ("lone surrogate", "abc \ud800 def"),
    ("lone low surrogate", "\udfff"),
)


def probes(reference: Tokenizer) -> list[tuple[str, str]]:
    """The named probe texts, with this tokenizer's added tokens."""
    added = sorted({t.content for t in reference.get_added_tokens_decoder().values() if t.content})
    out = list(_FIXED)
    if added:
        out.append(("added tokens in text", "".join(f"a{t}b {t}{t} \n{t}" for t in added)))
        out.append(("added tokens cut short", " ".join(t[:-1] for t in added if len(t) > 1)))
    return out


def _reference(reference: Tokenizer, texts: Sequence[str]) -> list[list[int] | None]:
    """The reference ids of each text, None where ``tokenizers`` refuses it."""
    try:
        return [e.ids for e in reference.encode_batch_fast(list(texts), add_special_tokens=False)]
    except Exception:  # one refused text fails the batch: find which, one by one
        out: list[list[int] | None] = []
        for text in texts:
            try:
                out.append(reference.encode(text, add_special_tokens=False).ids)
            except Exception:
                out.append(None)
        return out


def _engine_one(engine: Engine, text: str) -> np.ndarray | None:
    try:
        return engine.encode([text]).ids
    except Exception:
        return None


def disagreement(engine: Engine, reference: Tokenizer, texts: Sequence[str], names: Sequence[str]) -> str | None:
    """None when ``engine`` gives the reference's ids for every text (and refuses what it refuses), else
    why not, naming the text (``names[i]``)."""
    expected = _reference(reference, texts)
    valid = [i for i, e in enumerate(expected) if e is not None]
    try:
        got = engine.encode([texts[i] for i in valid]).split()
    except Exception as exc:
        return f"it raised on {names[valid[0]] if len(valid) == 1 else 'a batch'} ({type(exc).__name__})"
    for i, ids in zip(valid, got, strict=True):
        want = expected[i]
        assert want is not None
        if len(ids) != len(want) or not np.array_equal(ids, want):
            return f"ids differ from tokenizers on {names[i]}"
    for i, e in enumerate(expected):
        if e is None and _engine_one(engine, texts[i]) is not None:
            return f"it encodes {names[i]}, which tokenizers refuses"
    return None
