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

import random
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
    # a contraction after a newline or tab is one piece for tokenizers, two for a regex that misses it
    ("contractions after whitespace", "\n's \t't\n're \r\n've\u00a0'm \x0b'll\n'd\t'stdout' (\n'test') x\n'S \t'T"),
    ("quotes", "'single' \"double\" `back` \u2018curly\u2019 \u201cdouble\u201d ''' \"\"\" a''b it''s '' 's"),
    # what NFKC / NFKD normalizers rewrite: ligatures, full and half width, circled, superscripts, units
    (
        "compatibility",
        "\ufb01le \ufb02ow \uff26\uff55\uff4c\uff4c \uff76\uff80\uff76\uff85 "
        "\u2460\u2461 x\u00b2 \u33a1 \u2122 \u2126 \u212b \u1e9b\u0323",
    ),
    ("case", "\u0130stanbul \u0131 \u00df \u1e9e \u01c5 \u03a3\u03c3\u03c2 \u0587 \ufb03 ABC\u00c9\u00c5 \u00e9\u00c9"),
    ("lone surrogate", "abc \ud800 def"),
    ("lone low surrogate", "\udfff"),
)


#: Pieces the fuzz probes are strung from: every kind of whitespace, contractions and quotes, words in several
#: scripts and cases, digit runs, punctuation and operators, characters normalizers rewrite, marks and emoji.
_ATOMS: tuple[str, ...] = (
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u00a0",
    "\u3000",
    "\u2009",
    "\x0b",
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "'",
    '"',
    "`",
    "\u2019",
    "hello",
    "Hello",
    "HELLO",
    "x",
    "self",
    "_init_",
    "caf\u00e9",
    "na\u0131ve",
    "\u00c9T\u00c9",
    "stra\u00dfe",
    "\u6771\u4eac",
    "\u3072\u3089",
    "\ud55c\uad6d",
    "\u043f\u0440\u0438\u0432\u0435\u0442",
    "\u05e2\u05d1",
    "\u0627\u0644",
    "\u0939\u093f",
    "\u0e44\u0e17",
    "\u03b1\u03b2",
    "0",
    "7",
    "42",
    "123",
    "4567",
    "1234567890",
    "3.14",
    "1,000",
    "\u0661\u0662\u0663",
    "\u00bd",
    "\u2167",
    ".",
    ",",
    "...",
    "!",
    "?",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    "#",
    "//",
    "/*",
    "->",
    "==",
    "!=",
    "::",
    "@",
    "$",
    "%",
    "&&",
    "||",
    "\\",
    "-",
    "--",
    "_",
    "=",
    "+",
    "*",
    "**",
    "|",
    ";",
    ":",
    "\ufb01",
    "\uff26\uff55",
    "\uff76\uff80",
    "\u2460",
    "\u00b2",
    "\u2122",
    "\u0301",
    "\u0308",
    "\u200b",
    "\ufeff",
    "\U0001f642",
    "\U0001f469\u200d\U0001f467",
    "\U0001f1eb\U0001f1f7",
)
#: Fuzz probes: strings of 1-24 atoms, drawn by a fixed seed (the same probes everywhere, every time).
FUZZ_PROBES, FUZZ_SEED = 384, 20261201


def _fuzz() -> list[tuple[str, str]]:
    rng = random.Random(FUZZ_SEED)
    return [(f"fuzz probe {k}", "".join(rng.choices(_ATOMS, k=rng.randint(1, 24)))) for k in range(FUZZ_PROBES)]


def probes(reference: Tokenizer) -> list[tuple[str, str]]:
    """The named probe texts, with this tokenizer's added tokens."""
    added = sorted({t.content for t in reference.get_added_tokens_decoder().values() if t.content})
    out = list(_FIXED) + _fuzz()
    if added:
        out.append(("added tokens in text", "".join(f"a{t}b {t}{t} \n{t}" for t in added)))
        out.append(("added tokens cut short", " ".join(t[:-1] for t in added if len(t) > 1)))
    return out


def probe_texts(reference: Tokenizer) -> tuple[list[str], list[str]]:
    """The probes as ``disagreement`` takes them: their texts, and their names (``"the digits probe"``)."""
    named = probes(reference)
    return [text for _, text in named], [f"the {name} probe" for name, _ in named]


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
