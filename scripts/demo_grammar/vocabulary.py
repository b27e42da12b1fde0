"""The demo corpus's vocabulary: the shipped word lists, their weighted forms, and English word forms.

The words are data, not code: ``vocabulary.json`` (beside this module) holds one list per key (and the
irregular past tenses as one object). This module reads and checks that file once, at import, into
:data:`WORDS` (a :class:`WordLists`), and builds the :class:`WeightedWords` the generators draw from:
:data:`NOUNS`, :data:`ADJECTIVES`, :data:`VERBS`, :data:`INTRANSITIVE`, :data:`ADVERBS`, :data:`PREPOSITIONS`,
:data:`PERSONS`, :data:`PLACES` and :data:`SURNAMES` (the last three are every start + end combination of the
name parts). Earlier words are drawn more often, so every list's order is part of the generated corpus.

The word-form helpers (:func:`plural`, :func:`third_person`, :func:`past`, :func:`gerund`, :func:`article`,
:func:`capitalize`) are the small, deliberately naive English morphology the grammar needs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import accumulate
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "ADJECTIVES",
    "ADVERBS",
    "INTRANSITIVE",
    "NOUNS",
    "PERSONS",
    "PLACES",
    "PREPOSITIONS",
    "SURNAMES",
    "VERBS",
    "WORDS",
    "WeightedWords",
    "WordLists",
    "article",
    "capitalize",
    "gerund",
    "parse_word_lists",
    "past",
    "plural",
    "third_person",
]


@dataclass(frozen=True, slots=True)
class WordLists:
    """Every word list of ``vocabulary.json``, one field per key, in file order (``about`` is a comment)."""

    nouns: tuple[str, ...]
    adjectives: tuple[str, ...]
    transitive_verbs: tuple[str, ...]
    intransitive_verbs: tuple[str, ...]
    adverbs: tuple[str, ...]
    prepositions: tuple[str, ...]
    irregular_past: Mapping[str, str]
    gerund_doubles_final_consonant: tuple[str, ...]
    modal_verbs: tuple[str, ...]
    speech_verbs: tuple[str, ...]
    subject_pronouns: tuple[str, ...]
    object_pronouns: tuple[str, ...]
    plural_pronouns: tuple[str, ...]
    singular_determiners: tuple[str, ...]
    plural_determiners: tuple[str, ...]
    conjunctions: tuple[str, ...]
    subordinators: tuple[str, ...]
    openers: tuple[str, ...]
    question_words: tuple[str, ...]
    short_question_words: tuple[str, ...]
    title_small_words: tuple[str, ...]
    list_title_determiners: tuple[str, ...]
    first_name_starts: tuple[str, ...]
    first_name_ends: tuple[str, ...]
    place_name_starts: tuple[str, ...]
    place_name_ends: tuple[str, ...]
    surname_ends: tuple[str, ...]
    code_verbs: tuple[str, ...]
    code_modules: tuple[str, ...]
    code_name_suffixes: tuple[str, ...]
    code_loop_variables: tuple[str, ...]


_COMMENT_KEY = "about"
#: The word-list file, beside this module.
VOCABULARY_FILE = Path(__file__).with_name("vocabulary.json")
_SOURCE = "scripts/demo_grammar/vocabulary.json"
_MAPPING_KEYS = frozenset({"irregular_past"})


def _duplicates(words: Sequence[str]) -> list[str]:
    return [word for word, n in Counter(words).items() if n > 1]


def _word_list(key: str, value: object, source: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{source}: {key!r} must be a non-empty list of words, got {value!r} — fix the file")
    bad = [word for word in value if not isinstance(word, str) or not word.strip() or word != word.strip()]
    if bad:
        raise ValueError(f"{source}: {key!r} must hold non-empty, unpadded strings, got {bad!r} — fix the file")
    repeated = _duplicates(value)
    if repeated:
        raise ValueError(
            f"{source}: {key!r} must hold distinct words, got {repeated!r} more than once — remove the repeats"
        )
    return tuple(value)


def _word_map(key: str, value: object, source: str) -> Mapping[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{source}: {key!r} must be an object of word -> word, got {value!r} — fix the file")
    return MappingProxyType(dict(value))


def parse_word_lists(data: Any, source: str = _SOURCE) -> WordLists:
    """Check the decoded ``vocabulary.json`` and return it as a :class:`WordLists`; ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise ValueError(f"{source} must hold a JSON object of word lists, got {type(data).__name__} — fix the file")
    expected = [field.name for field in fields(WordLists)]
    keys = set(data) - {_COMMENT_KEY}
    if keys != set(expected):
        missing, unknown = sorted(set(expected) - keys), sorted(keys - set(expected))
        raise ValueError(
            f"{source} must have exactly the keys of WordLists, got missing {missing} and unknown {unknown} — "
            "fix the file (or WordLists in scripts/demo_grammar/vocabulary.py)"
        )
    values = {key: (_word_map if key in _MAPPING_KEYS else _word_list)(key, data[key], source) for key in expected}
    return WordLists(**values)


@dataclass(frozen=True, slots=True)
class WeightedWords:
    """Distinct words with Zipf-like cumulative weights, for fast weighted draws (``Draw.word``).

    Word ``i`` weighs ``(i + offset) ** -exponent``; ``cdf`` holds the running sums and ``total`` the last.
    """

    words: tuple[str, ...]
    cdf: tuple[float, ...]
    total: float

    @classmethod
    def zipf(cls, name: str, words: Sequence[str], exponent: float = 1.0, offset: float = 2.5) -> WeightedWords:
        """Weights falling with position: the first words of ``words`` are drawn most often."""
        if not words:
            raise ValueError(f"{name} must hold at least one word, got none — fix {_SOURCE}")
        repeated = _duplicates(words)
        if repeated:
            raise ValueError(f"{name} must hold distinct words, got {repeated!r} more than once — fix {_SOURCE}")
        cdf = tuple(accumulate((i + offset) ** -exponent for i in range(len(words))))
        return cls(tuple(words), cdf, cdf[-1])


def _combinations(starts: Sequence[str], ends: Sequence[str]) -> list[str]:
    """Every ``start + end``, grouped by end: all starts with the first end, then with the second, ..."""
    return [start + end for end in ends for start in starts]


#: The word lists, read once from ``vocabulary.json``.
WORDS: WordLists = parse_word_lists(json.loads(VOCABULARY_FILE.read_text(encoding="utf-8")))

NOUNS = WeightedWords.zipf("nouns", WORDS.nouns)
ADJECTIVES = WeightedWords.zipf("adjectives", WORDS.adjectives)
VERBS = WeightedWords.zipf("transitive_verbs", WORDS.transitive_verbs)
INTRANSITIVE = WeightedWords.zipf("intransitive_verbs", WORDS.intransitive_verbs)
ADVERBS = WeightedWords.zipf("adverbs", WORDS.adverbs)
PREPOSITIONS = WeightedWords.zipf("prepositions", WORDS.prepositions, exponent=0.7)
PERSONS = WeightedWords.zipf("first names", _combinations(WORDS.first_name_starts, WORDS.first_name_ends), 0.6)
PLACES = WeightedWords.zipf("place names", _combinations(WORDS.place_name_starts, WORDS.place_name_ends), 0.6)
SURNAMES = WeightedWords.zipf("surnames", _combinations(WORDS.place_name_starts, WORDS.surname_ends), 0.6)

_IRREGULAR_PAST = WORDS.irregular_past
_DOUBLING = frozenset(WORDS.gerund_doubles_final_consonant)


# -- word forms --------------------------------------------------------------------------------------------


def plural(noun: str) -> str:
    """``box`` -> ``boxes``, ``city`` -> ``cities``, ``knife`` -> ``knives``, ``river`` -> ``rivers``."""
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith("fe"):
        return noun[:-2] + "ves"
    return noun + "s"


def third_person(verb: str) -> str:
    """``watch`` -> ``watches``, ``carry`` -> ``carries`` (the same spelling rules as :func:`plural`)."""
    return plural(verb)


def past(verb: str) -> str:
    """``irregular_past`` first, else ``move`` -> ``moved``, ``carry`` -> ``carried``, ``walk`` -> ``walked``."""
    if verb in _IRREGULAR_PAST:
        return _IRREGULAR_PAST[verb]
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def gerund(verb: str) -> str:
    """``make`` -> ``making``, ``walk`` -> ``walking``, ``stop`` -> ``stopping`` (listed to double its consonant)."""
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith("ee"):
        return verb[:-1] + "ing"
    if verb in _DOUBLING:
        return verb + verb[-1] + "ing"
    return verb + "ing"


def article(next_word: str) -> str:
    """The indefinite article before ``next_word``, by its first letter: ``an`` before a vowel, else ``a``."""
    return "an" if next_word[0].lower() in "aeiou" else "a"


def capitalize(text: str) -> str:
    """``text`` with its first character upper-cased and the rest unchanged."""
    return text[:1].upper() + text[1:]
