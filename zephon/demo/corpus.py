"""Embedded demo data: a synthetic corpus and a small tokenizer, so the quickstart runs offline.

Nothing here touches the network. The tokenizer ships inside the package (``zephon/assets/tokenizer``,
rebuilt by ``scripts/build_demo_tokenizer.py``); the corpus is generated on first use and cached as
Parquet shards:

* ``generate_demo_documents(kind, count, seed)`` builds deterministic synthetic documents of three
  kinds: ``"prose"`` (English-like paragraphs, ~50-2000 words), ``"code"`` (Python-like snippets) and
  ``"short"`` (one-line titles and Q&A, 5-30 words). All text is produced by the small grammar in this
  module from its own word lists; no external corpus is copied. The only source of randomness is
  ``numpy.random.default_rng((seed, kind_index))``, and documents are drawn one after another, so the
  first ``n`` documents of a larger ``count`` equal the documents of ``count=n``.
* ``write_demo_dataset(root)`` writes the shards under ``root/demo/`` (byte-identical for a given seed
  and pyarrow version), skipping files that are already present and complete.
* ``demo_dataset_path()`` / ``demo_dataset_paths()`` return glob patterns for the shards, writing them
  first when needed, under ``$ZEPHON_DEMO_DIR`` or ``~/.cache/zephon/demo-data``.
"""

from __future__ import annotations

import bisect
import contextlib
import importlib.resources
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "DEMO_KINDS",
    "DEMO_SHARDS",
    "demo_dataset_path",
    "demo_dataset_paths",
    "demo_tokenizer_path",
    "generate_demo_documents",
    "write_demo_dataset",
]

#: The document kinds, in the order that gives each its ``kind_index`` in the generator seed.
DEMO_KINDS: tuple[str, ...] = ("prose", "code", "short")

#: Layout of the demo dataset: kind -> (number of shards, documents per shard).
DEMO_SHARDS: dict[str, tuple[int, int]] = {"prose": (4, 300), "code": (2, 300), "short": (1, 2000)}

_FORMAT_VERSION = "1"
_META_VERSION = b"zephon.demo.version"
_META_SEED = b"zephon.demo.seed"
_ROW_GROUP_SIZE = 100


def demo_tokenizer_path() -> str:
    """Absolute path of the directory holding the embedded demo tokenizer (``zephon/assets/tokenizer``)."""
    return str(importlib.resources.files("zephon") / "assets" / "tokenizer")


def _words(text: str) -> list[str]:
    return text.split()


# --------------------------------------------------------------------------------------------------
# Word lists. Earlier entries are drawn more often (Zipf-like weights), so common words lead each list.
# --------------------------------------------------------------------------------------------------

_NOUNS = _words(
    """
time year day way world people city house river market road water light village garden letter
window harbor signal engine bridge station voice story question answer island mountain forest field
valley stone door table book paper map clock tower wall ship boat train school library office
machine tool plan report record number line pattern system model method process rule result
change reason problem idea plan family friend teacher student worker farmer sailor doctor writer
painter builder merchant traveler stranger neighbor captain child mother father sister brother
morning evening night winter summer spring autumn season storm wind rain snow cloud sun moon star
sea shore coast lake pond stream well fire smoke ash iron copper silver gold glass wood bread salt
grain wheat apple orange lamp candle rope chain wheel gate fence path trail corner square hall
kitchen room roof floor step stair yard shed barn mill factory warehouse shop bank court council
meeting journey voyage season harvest festival song music dance picture painting photograph camera
radio telephone wire cable network computer program file folder message note list page chapter
word sentence language sign symbol circle corner edge surface layer shadow color sound silence
memory dream thought feeling hope fear doubt promise secret rumor history future moment hour
minute week month century distance height weight size speed price cost value share account trade
company crowd group team army guard council committee government nation country region province
county town street avenue lane park museum theater church temple castle palace prison hospital
factory laboratory experiment theory measure sample test instrument engine motor pump valve pipe
tank battery circuit lever spring gear bolt hammer nail brick beam plank board canvas thread
needle cloth coat hat boot glove basket bag box jar bottle cup bowl plate knife spoon fork
"""
)

_ADJECTIVES = _words(
    """
old new small large long short high low early late young quiet loud bright dark warm cold dry wet
heavy light quick slow simple strange common rare clear careful gentle rough smooth narrow wide
deep shallow empty full busy calm sudden final first last next hidden open closed broken whole
ancient modern local distant northern southern eastern western central public private silent
golden silver green blue red grey white black yellow brown pale steady sharp soft hard bitter sweet
fresh tired eager proud patient curious honest famous ordinary useful careful strong weak rich poor
small narrow crowded lonely familiar foreign certain possible important difficult easy practical
small wooden stone iron glass paper painted faded worn polished tiny enormous endless brief
"""
)

_VERBS = _words(
    """
make take find keep hold bring carry build open close move turn walk watch follow reach cross
leave enter return start finish change answer ask call count measure record repair paint write
read study learn teach show explain describe remember forget notice discover collect gather share
send receive offer accept refuse need want like prefer improve protect visit cover fill empty
clean wash cook plant grow raise lift push pull throw catch break mend pack load drive steer guide
lead join help check test compare mark note sign trade sell buy pay borrow lend save spend
"""
)

_INTRANSITIVE = _words(
    """
arrive wait rest sleep travel work return begin stop continue appear vanish rise fall shine glow
drift settle wander listen hesitate pause laugh smile whisper sing dance rain freeze melt grow
"""
)

_IRREGULAR_PAST = {
    "make": "made",
    "take": "took",
    "find": "found",
    "keep": "kept",
    "hold": "held",
    "bring": "brought",
    "build": "built",
    "leave": "left",
    "forget": "forgot",
    "teach": "taught",
    "show": "showed",
    "grow": "grew",
    "throw": "threw",
    "catch": "caught",
    "break": "broke",
    "drive": "drove",
    "lead": "led",
    "sell": "sold",
    "buy": "bought",
    "pay": "paid",
    "lend": "lent",
    "spend": "spent",
    "read": "read",
    "write": "wrote",
    "send": "sent",
    "begin": "began",
    "rise": "rose",
    "fall": "fell",
    "shine": "shone",
    "sleep": "slept",
    "sing": "sang",
    "freeze": "froze",
    "stop": "stopped",
    "prefer": "preferred",
    "plan": "planned",
    "mend": "mended",
    "steer": "steered",
    "rain": "rained",
}

_ADVERBS = _words(
    """
slowly quickly carefully quietly suddenly finally often rarely always never sometimes already
again together alone early later soon still almost nearly clearly simply gently firmly openly
badly easily happily patiently steadily eagerly briefly twice once everywhere outside inside
"""
)

_PREPOSITIONS = _words(
    """
in on at near by with from into across through under over behind beside along toward against
around beyond between before after during without
"""
)

_CONJUNCTIONS = ["and", "but", "so", "yet", "while", "because", "although", "until", "and then"]
_SUBORDINATORS = ["When", "Although", "Because", "After", "Before", "If", "While", "Once", "Since", "Until"]
_OPENERS = [
    "In the end",
    "At first",
    "For a while",
    "By morning",
    "That year",
    "Later",
    "Even so",
    "Meanwhile",
    "In time",
    "Without warning",
    "For the most part",
    "As a rule",
    "On most days",
    "By then",
]

_FIRST_A = [
    "Ad",
    "Bel",
    "Cor",
    "Dar",
    "El",
    "Fen",
    "Gar",
    "Hal",
    "Ir",
    "Jo",
    "Ka",
    "Lor",
    "Mar",
    "Nel",
    "Or",
    "Pa",
    "Quin",
    "Ros",
    "Sa",
    "Tor",
    "Ul",
    "Ver",
    "Wil",
    "Yan",
    "Zel",
]
_FIRST_B = ["a", "en", "ric", "ina", "o", "wen", "mir", "ley", "an", "is", "ette", "win"]
_PLACE_A = [
    "North",
    "South",
    "East",
    "West",
    "Ash",
    "Oak",
    "Elm",
    "Stone",
    "Green",
    "Red",
    "Black",
    "White",
    "Mill",
    "Bright",
    "Cold",
    "Fair",
    "High",
    "Long",
    "Salt",
    "Iron",
    "Maple",
    "Raven",
    "Willow",
    "Thorn",
]
_PLACE_B = [
    "wood",
    "ford",
    "mere",
    "ton",
    "haven",
    "by",
    "stead",
    "field",
    "more",
    "wick",
    "bridge",
    "port",
    "dale",
    "hollow",
    "gate",
    "cliff",
]
_SURNAME_B = ["smith", "well", "man", "er", "son", "ley", "worth", "wright"]

_PERSONS = [a + b for b in _FIRST_B for a in _FIRST_A]
_PLACES = [a + b for b in _PLACE_B for a in _PLACE_A]
_SURNAMES = [a + b for b in _SURNAME_B for a in _PLACE_A]

_SUBJECT_PRONOUNS = ["she", "he", "they", "we", "it", "I", "you"]
_OBJECT_PRONOUNS = ["her", "him", "them", "us", "it", "me", "you"]
_PLURAL_PRONOUNS = frozenset({"they", "we", "I", "you"})


def _plural(noun: str) -> str:
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith("fe"):
        return noun[:-2] + "ves"
    return noun + "s"


def _third_person(verb: str) -> str:
    return _plural(verb)


def _past(verb: str) -> str:
    if verb in _IRREGULAR_PAST:
        return _IRREGULAR_PAST[verb]
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def _gerund(verb: str) -> str:
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith("ee"):
        return verb[:-1] + "ing"
    if verb in ("stop", "plan", "begin"):
        return verb + verb[-1] + "ing"
    return verb + "ing"


def _unique(words: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(words))


class _Vocab:
    """A word list with Zipf-like cumulative weights for fast weighted draws."""

    __slots__ = ("cdf", "total", "words")

    def __init__(self, words: Sequence[str], exponent: float = 1.0, offset: float = 2.5) -> None:
        self.words = _unique(words)
        self.cdf = list(accumulate((i + offset) ** -exponent for i in range(len(self.words))))
        self.total = self.cdf[-1]


_V_NOUN = _Vocab(_NOUNS)
_V_ADJ = _Vocab(_ADJECTIVES)
_V_VERB = _Vocab(_VERBS)
_V_INTRANS = _Vocab(_INTRANSITIVE)
_V_ADV = _Vocab(_ADVERBS)
_V_PREP = _Vocab(_PREPOSITIONS, exponent=0.7)
_V_PERSON = _Vocab(_PERSONS, exponent=0.6)
_V_PLACE = _Vocab(_PLACES, exponent=0.6)
_V_SURNAME = _Vocab(_SURNAMES, exponent=0.6)


class _Draw:
    """Uniform draws from one numpy Generator, buffered so per-word draws stay cheap.

    Every random decision in this module goes through ``u()``; the buffer is refilled in fixed-size
    chunks, so the sequence of values is a pure function of the generator's seed.
    """

    __slots__ = ("_buf", "_pos", "_rng")

    _CHUNK = 8192

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._buf: list[float] = []
        self._pos = 0

    def u(self) -> float:
        if self._pos >= len(self._buf):
            self._buf = self._rng.random(self._CHUNK).tolist()
            self._pos = 0
        value = self._buf[self._pos]
        self._pos += 1
        return value

    def chance(self, p: float) -> bool:
        return self.u() < p

    def int(self, lo: int, hi: int) -> int:
        """A uniform integer in ``[lo, hi]`` (both ends included)."""
        return lo + min(int(self.u() * (hi - lo + 1)), hi - lo)

    def log_int(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``, uniform in log-space (many small values, a long tail)."""
        return min(hi, max(lo, int(math.exp(math.log(lo) + self.u() * (math.log(hi + 1) - math.log(lo))))))

    def one(self, items: Sequence[str]) -> str:
        return items[self.int(0, len(items) - 1)]

    def word(self, vocab: _Vocab) -> str:
        return vocab.words[min(bisect.bisect_right(vocab.cdf, self.u() * vocab.total), len(vocab.words) - 1)]


# --------------------------------------------------------------------------------------------------
# Prose
# --------------------------------------------------------------------------------------------------


def _article(next_word: str) -> str:
    return "an" if next_word[0].lower() in "aeiou" else "a"


def _number_phrase(d: _Draw) -> str:
    roll = d.u()
    if roll < 0.4:
        return f"{d.int(2, 12)} {_plural(d.word(_V_NOUN))}"
    if roll < 0.7:
        return f"{d.int(13, 999)} {_plural(d.word(_V_NOUN))}"
    if roll < 0.85:
        return f"{d.int(1, 99)}.{d.int(0, 9)} percent of the {_plural(d.word(_V_NOUN))}"
    return f"{d.int(1000, 99999):,} {_plural(d.word(_V_NOUN))}"


def _noun_phrase(d: _Draw, *, subject: bool) -> tuple[str, bool]:
    """A noun phrase and whether it is plural (for verb agreement)."""
    roll = d.u()
    if roll < 0.08:
        pronoun = d.one(_SUBJECT_PRONOUNS if subject else _OBJECT_PRONOUNS)
        return pronoun, pronoun in _PLURAL_PRONOUNS or pronoun in ("them", "us", "me")
    if roll < 0.16:
        name = d.word(_V_PERSON)
        if d.chance(0.4):
            name += " " + d.word(_V_SURNAME)
        return name, False
    if roll < 0.20:
        return d.word(_V_PLACE), False
    if roll < 0.24:
        return _number_phrase(d), True
    noun = d.word(_V_NOUN)
    plural = d.chance(0.3)
    if plural:
        noun = _plural(noun)
    adjectives = []
    if d.chance(0.45):
        adjectives.append(d.word(_V_ADJ))
        if d.chance(0.12):
            adjectives.append(d.word(_V_ADJ))
    body = " ".join([*adjectives, noun])
    det_roll = d.u()
    if plural:
        det = "the" if det_roll < 0.5 else d.one(["some", "these", "their", "our", "many", "few", "all the"])
    elif det_roll < 0.5:
        det = "the"
    elif det_roll < 0.8:
        det = _article(body)
    else:
        det = d.one(["this", "that", "every", "its", "their", "our", "one"])
    phrase = f"{det} {body}"
    if d.chance(0.12):
        phrase += f" of {d.word(_V_PLACE)}" if d.chance(0.4) else f" of the {d.word(_V_NOUN)}"
    return phrase, plural


def _verb_phrase(d: _Draw, *, plural: bool, past: bool) -> str:
    transitive = d.chance(0.7)
    verb = d.word(_V_VERB if transitive else _V_INTRANS)
    roll = d.u()
    if roll < 0.1:
        form = (
            f"{'were' if plural else 'was'} {_gerund(verb)}"
            if past
            else (f"{'are' if plural else 'is'} {_gerund(verb)}")
        )
    elif roll < 0.2:
        form = f"{d.one(['could', 'would', 'might', 'should', 'will', 'must'])} {verb}"
    elif roll < 0.25:
        form = f"did not {verb}" if past else f"{'do' if plural else 'does'} not {verb}"
    elif past:
        form = _past(verb)
    else:
        form = verb if plural else _third_person(verb)
    parts = [form]
    if transitive:
        parts.append(_noun_phrase(d, subject=False)[0])
    if d.chance(0.35):
        parts.append(f"{d.word(_V_PREP)} {_noun_phrase(d, subject=False)[0]}")
    if d.chance(0.2):
        adverb = d.word(_V_ADV)
        if d.chance(0.5):
            parts.append(adverb)
        else:
            parts.insert(0, adverb)
    if d.chance(0.05):
        parts.append(f"in {d.int(1650, 2030)}")
    return " ".join(parts)


def _clause(d: _Draw, *, past: bool) -> str:
    subject, plural = _noun_phrase(d, subject=True)
    return f"{subject} {_verb_phrase(d, plural=plural, past=past)}"


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence(d: _Draw, *, past: bool) -> str:
    roll = d.u()
    if roll < 0.06:
        subject, plural = _noun_phrase(d, subject=True)
        aux = "did" if past else "do" if plural else "does"
        verb = d.word(_V_VERB)
        obj = _noun_phrase(d, subject=False)[0]
        wh = d.one(["Why", "How", "When", "Where"])
        return f"{wh} {aux} {subject} {verb} {obj}?"
    if roll < 0.12:
        speaker = d.word(_V_PERSON)
        said = d.one(["said", "asked", "answered", "wrote", "added"])
        return f"\u201c{_capitalize(_clause(d, past=False))},\u201d {said} {speaker}."
    text = _clause(d, past=past)
    roll = d.u()
    if roll < 0.22:
        text = f"{text}, {d.one(_CONJUNCTIONS)} {_clause(d, past=past)}"
    elif roll < 0.36:
        text = f"{d.one(_SUBORDINATORS)} {_clause(d, past=past)}, {text}"
    elif roll < 0.44:
        text = f"{d.one(_OPENERS)}, {text}"
    elif roll < 0.48:
        text = f"{text}; {_clause(d, past=past)}"
    return _capitalize(text) + ("!" if d.chance(0.02) else ".")


def _prose_document(d: _Draw) -> str:
    target = d.log_int(50, 1950)
    paragraphs: list[str] = []
    words = 0
    while words < target:
        past = d.chance(0.6)
        sentences: list[str] = []
        for _ in range(d.int(2, 8)):
            sentence = _sentence(d, past=past)
            n = sentence.count(" ") + 1
            if words + n > 2000:
                continue
            sentences.append(sentence)
            words += n
            if words >= target:
                break
        if sentences:
            paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


# --------------------------------------------------------------------------------------------------
# Code
# --------------------------------------------------------------------------------------------------

_CODE_VERBS = [
    "load",
    "save",
    "parse",
    "build",
    "compute",
    "update",
    "check",
    "count",
    "merge",
    "split",
    "read",
    "write",
    "find",
    "make",
    "scale",
    "sort",
    "filter",
    "collect",
    "render",
    "apply",
]
_MODULES = ["os", "math", "json", "re", "time", "random", "itertools", "collections", "pathlib", "typing"]
_OPS = ["+", "-", "*", "//", "%"]
_COMPARE = ["<", ">", "<=", ">=", "==", "!="]


def _ident(d: _Draw) -> str:
    noun = d.word(_V_NOUN)
    roll = d.u()
    if roll < 0.5:
        return noun
    if roll < 0.8:
        return f"{d.word(_V_ADJ)}_{noun}"
    return f"{noun}_{d.one(['count', 'size', 'index', 'list', 'map', 'id', 'total', 'name'])}"


def _func_name(d: _Draw) -> str:
    noun = d.word(_V_NOUN)
    return f"{d.one(_CODE_VERBS)}_{_plural(noun) if d.chance(0.2) else noun}"


def _literal(d: _Draw) -> str:
    roll = d.u()
    if roll < 0.45:
        return str(d.int(0, 9))
    if roll < 0.75:
        return str(d.log_int(10, 100000))
    if roll < 0.85:
        return f"{d.int(0, 99)}.{d.int(0, 999):03d}"
    if roll < 0.95:
        return repr(d.word(_V_NOUN))
    return d.one(["None", "True", "False", "[]", "{}"])


def _expr(d: _Draw, names: list[str]) -> str:
    left = d.one(names) if names and d.chance(0.7) else _literal(d)
    roll = d.u()
    if roll < 0.4:
        return left
    if roll < 0.7:
        return f"{left} {d.one(_OPS)} {_literal(d) if d.chance(0.6) or not names else d.one(names)}"
    if roll < 0.85:
        return f"len({d.one(names) if names else _ident(d)})"
    return f"{_func_name(d)}({left})"


def _comment(d: _Draw) -> str:
    roll = d.u()
    if roll < 0.15:
        return f"# TODO: {d.one(_CODE_VERBS)} the {d.word(_V_NOUN)} before {d.int(2, 9)} retries"
    text = _clause(d, past=False)
    return f"# {_capitalize(text)}."


def _block(d: _Draw, indent: int, names: list[str], lines: list[str], depth: int, budget: int) -> None:
    pad = "    " * indent
    start = len(lines)
    for _ in range(d.int(1, 4 if depth else 6)):
        if len(lines) >= budget:
            break
        roll = d.u()
        if roll < 0.15:
            lines.append(pad + _comment(d))
        elif roll < 0.45 or depth >= 3:
            name = _ident(d)
            op = " += " if name in names and d.chance(0.5) else " = "
            lines.append(f"{pad}{name}{op}{_expr(d, names)}")
            names.append(name)
        elif roll < 0.6:
            var = d.one(["i", "j", "k", "n", "idx", "step"])
            lines.append(f"{pad}for {var} in range({d.int(1, 64)}):")
            _block(d, indent + 1, [*names, var], lines, depth + 1, budget)
        elif roll < 0.72 and names:
            item = _ident(d)
            lines.append(f"{pad}for {item} in {d.one(names)}:")
            _block(d, indent + 1, [*names, item], lines, depth + 1, budget)
        elif roll < 0.88:
            cond = f"{_expr(d, names)} {d.one(_COMPARE)} {_literal(d)}"
            lines.append(f"{pad}if {cond}:")
            _block(d, indent + 1, names, lines, depth + 1, budget)
            if d.chance(0.35):
                lines.append(f"{pad}else:")
                _block(d, indent + 1, names, lines, depth + 1, budget)
        else:
            call = f"{_func_name(d)}({', '.join(d.one(names) for _ in range(d.int(0, 2))) if names else ''})"
            lines.append(pad + call)
    if len(lines) == start or all(line.lstrip().startswith("#") for line in lines[start:]):
        lines.append(f"{pad}{_ident(d)} = {_expr(d, names)}" if depth < 2 or d.chance(0.5) else f"{pad}pass")


def _function(d: _Draw, indent: int, lines: list[str], *, method: bool) -> None:
    pad = "    " * indent
    args = [_ident(d) for _ in range(d.int(0, 3))]
    sig_args = (["self"] if method else []) + [
        f"{a}: {d.one(['int', 'str', 'float', 'list[int]', 'dict[str, int]'])}" if d.chance(0.4) else a for a in args
    ]
    lines.append(f"{pad}def {_func_name(d)}({', '.join(sig_args)}):")
    if d.chance(0.6):
        lines.append(f'{pad}    """{_capitalize(_clause(d, past=False))}."""')
    names = list(args)
    _block(d, indent + 1, names, lines, 0, len(lines) + d.log_int(3, 40))
    lines.append(f"{pad}    return {_expr(d, names)}")


def _code_document(d: _Draw) -> str:
    lines: list[str] = []
    if d.chance(0.5):
        for module in sorted({d.one(_MODULES) for _ in range(d.int(1, 3))}):
            lines.append(f"import {module}")
        lines.extend(["", ""])
    if d.chance(0.3):
        lines.append(f"{_ident(d).upper()} = {d.log_int(2, 65536)}")
        lines.extend(["", ""])
    for unit in range(d.int(1, 3)):
        if unit:
            lines.extend(["", ""])
        if d.chance(0.25):
            lines.append(f"class {_capitalize(d.word(_V_ADJ))}{_capitalize(d.word(_V_NOUN))}:")
            for m in range(d.int(1, 3)):
                if m:
                    lines.append("")
                _function(d, 1, lines, method=True)
        else:
            _function(d, 0, lines, method=False)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Short
# --------------------------------------------------------------------------------------------------


def _title_case(text: str) -> str:
    small = {"a", "an", "the", "of", "in", "on", "at", "by", "and", "to", "with", "for", "from"}
    words = text.split(" ")
    return " ".join(w if (i and w in small) else _capitalize(w) for i, w in enumerate(words))


def _short_candidate(d: _Draw) -> str:
    roll = d.u()
    if roll < 0.3:
        title = f"the {d.word(_V_ADJ)} {d.word(_V_NOUN)} of {d.word(_V_PLACE)}"
        if d.chance(0.5):
            first = _noun_phrase(d, subject=False)[0]
            title += f": {first} {d.word(_V_PREP)} {_noun_phrase(d, subject=False)[0]}"
        elif d.chance(0.4):
            title += f", {d.int(1650, 2030)}\u2013{d.int(1650, 2030)}"
        return _title_case(title)
    if roll < 0.65:
        subject, plural = _noun_phrase(d, subject=True)
        wh = d.one(["Why", "How", "When", "Where", "What"])
        aux = "do" if plural else "does"
        question = f"{wh} {aux} {subject} {d.word(_V_VERB)} {_noun_phrase(d, subject=False)[0]}?"
        return f"Q: {question} A: {_capitalize(_clause(d, past=d.chance(0.5)))}."
    if roll < 0.85:
        return _capitalize(_clause(d, past=False)) + "."
    count = d.int(3, 12)
    noun = d.word(_V_NOUN)
    return _title_case(f"{count} ways to {d.word(_V_VERB)} {d.one(['a', 'the', 'your'])} {noun}")


def _short_document(d: _Draw) -> str:
    while True:
        text = _short_candidate(d)
        if 5 <= text.count(" ") + 1 <= 30:
            return text


_GENERATORS: dict[str, Callable[[_Draw], str]] = {
    "prose": _prose_document,
    "code": _code_document,
    "short": _short_document,
}


def generate_demo_documents(kind: str, count: int, seed: int) -> list[str]:
    """Generate ``count`` deterministic synthetic documents of one kind: "prose", "code" or "short".

    The only randomness is ``numpy.random.default_rng((seed, kind_index))``; documents are drawn in order,
    so a shorter list is a prefix of a longer one with the same ``kind`` and ``seed``.
    """
    if kind not in _GENERATORS:
        raise ValueError(f"unknown demo document kind {kind!r}; expected one of {DEMO_KINDS}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    draw = _Draw(np.random.default_rng((seed, DEMO_KINDS.index(kind))))
    make = _GENERATORS[kind]
    return [make(draw) for _ in range(count)]


# --------------------------------------------------------------------------------------------------
# Parquet shards
# --------------------------------------------------------------------------------------------------

_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("text", pa.string())])


def _shard_name(kind: str, shard: int) -> str:
    return f"{kind}-{shard:05d}.parquet"


def _shard_complete(path: Path, rows: int, seed: int) -> bool:
    try:
        meta = pq.read_metadata(path)
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException):
        return False
    kv = schema.metadata or {}
    return (
        meta.num_rows == rows
        and schema.names == _SCHEMA.names
        and kv.get(_META_VERSION) == _FORMAT_VERSION.encode()
        and kv.get(_META_SEED) == str(seed).encode()
    )


def _write_atomic(table: pa.Table, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, row_group_size=_ROW_GROUP_SIZE, compression="zstd")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_demo_dataset(root: str | os.PathLike[str], *, seed: int = 0) -> str:
    """Write the demo Parquet shards under ``root/demo/`` unless they are already present and complete.

    Layout: ``prose-00000..00003.parquet`` (4 x 300 documents), ``code-00000..00001.parquet``
    (2 x 300) and ``short-00000.parquet`` (1 x 2000), each with string columns ``id``
    (``"<kind>-<shard>-<row>"``) and ``text``, zstd-compressed, 100 rows per row group. Every file is
    written under a temporary name in the same directory and moved into place with ``os.replace``, so
    readers (and concurrent writers) never see a partial shard. The output is byte-identical across
    calls with the same ``seed``. Returns ``str(root / "demo")``.
    """
    out = Path(os.path.expanduser(os.fspath(root))) / "demo"
    out.mkdir(parents=True, exist_ok=True)
    schema = _SCHEMA.with_metadata({_META_VERSION: _FORMAT_VERSION.encode(), _META_SEED: str(seed).encode()})
    for kind in DEMO_KINDS:
        shards, per_shard = DEMO_SHARDS[kind]
        paths = [out / _shard_name(kind, s) for s in range(shards)]
        missing = [s for s, p in enumerate(paths) if not _shard_complete(p, per_shard, seed)]
        if not missing:
            continue
        docs = generate_demo_documents(kind, shards * per_shard, seed)
        for s in missing:
            ids = [f"{kind}-{s}-{r}" for r in range(per_shard)]
            texts = docs[s * per_shard : (s + 1) * per_shard]
            columns = [pa.array(ids, pa.string()), pa.array(texts, pa.string())]
            table = pa.Table.from_arrays(columns, schema=schema)
            _write_atomic(table, paths[s])
    return str(out)


def _default_root() -> str:
    env = os.environ.get("ZEPHON_DEMO_DIR")
    return env or os.path.join(os.path.expanduser("~"), ".cache", "zephon", "demo-data")


def demo_dataset_paths(root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Glob patterns of the demo shards by kind, writing the dataset first when needed.

    ``root`` defaults to ``$ZEPHON_DEMO_DIR`` when set, else ``~/.cache/zephon/demo-data``.
    Returns ``{"prose": "<root>/demo/prose-*.parquet", "code": ..., "short": ...}``.
    """
    out = write_demo_dataset(_default_root() if root is None else root)
    return {kind: os.path.join(out, f"{kind}-*.parquet") for kind in DEMO_KINDS}


def demo_dataset_path(root: str | os.PathLike[str] | None = None) -> str:
    """Glob pattern of the prose shards, ``<root>/demo/prose-*.parquet``, writing the dataset first if needed.

    ``root`` defaults to ``$ZEPHON_DEMO_DIR`` when set, else ``~/.cache/zephon/demo-data``.
    """
    return demo_dataset_paths(root)["prose"]
