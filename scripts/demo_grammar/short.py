"""Short documents: one line of 5-30 words — a title, a Q&A pair, a plain sentence or a "N ways to" title.

Candidates outside 5-30 words are drawn again, so every document is in range.
"""

from __future__ import annotations

from demo_grammar.draw import Draw
from demo_grammar.prose import clause, noun_phrase
from demo_grammar.vocabulary import ADJECTIVES, NOUNS, PLACES, PREPOSITIONS, VERBS, WORDS, capitalize

__all__ = ["short_document", "title_case"]

_SMALL_WORDS = frozenset(WORDS.title_small_words)
_MIN_WORDS = 5
_MAX_WORDS = 30


def title_case(text: str) -> str:
    """Capitalize every word except the small ones (``title_small_words``) after the first."""
    words = text.split(" ")
    return " ".join(w if (i and w in _SMALL_WORDS) else capitalize(w) for i, w in enumerate(words))


def _candidate(d: Draw) -> str:
    roll = d.u()
    if roll < 0.3:
        title = f"the {d.word(ADJECTIVES)} {d.word(NOUNS)} of {d.word(PLACES)}"
        if d.chance(0.5):
            first = noun_phrase(d, subject=False)[0]
            title += f": {first} {d.word(PREPOSITIONS)} {noun_phrase(d, subject=False)[0]}"
        elif d.chance(0.4):
            title += f", {d.int(1650, 2030)}\u2013{d.int(1650, 2030)}"
        return title_case(title)
    if roll < 0.65:
        subject, is_plural = noun_phrase(d, subject=True)
        wh = d.one(WORDS.short_question_words)
        aux = "do" if is_plural else "does"
        question = f"{wh} {aux} {subject} {d.word(VERBS)} {noun_phrase(d, subject=False)[0]}?"
        return f"Q: {question} A: {capitalize(clause(d, in_past=d.chance(0.5)))}."
    if roll < 0.85:
        return capitalize(clause(d, in_past=False)) + "."
    count = d.int(3, 12)
    noun = d.word(NOUNS)
    return title_case(f"{count} ways to {d.word(VERBS)} {d.one(WORDS.list_title_determiners)} {noun}")


def short_document(d: Draw) -> str:
    """One line of 5-30 words."""
    while True:
        text = _candidate(d)
        if _MIN_WORDS <= text.count(" ") + 1 <= _MAX_WORDS:
            return text
