"""Prose documents: English-like paragraphs of ~50-2000 words from a small sentence grammar.

A document is paragraphs of 2-8 sentences, each paragraph in the past or the present tense. A sentence is a
clause (noun phrase + verb phrase), sometimes joined to a second one, introduced by an opener, asked as a
question or quoted. :func:`noun_phrase` and :func:`clause` are shared with :mod:`demo_grammar.code` (comments
and docstrings) and :mod:`demo_grammar.short`.
"""

from __future__ import annotations

from demo_grammar.draw import Draw
from demo_grammar.vocabulary import (
    ADJECTIVES,
    ADVERBS,
    INTRANSITIVE,
    NOUNS,
    PERSONS,
    PLACES,
    PREPOSITIONS,
    SURNAMES,
    VERBS,
    WORDS,
    article,
    capitalize,
    gerund,
    past,
    plural,
    third_person,
)

__all__ = ["clause", "noun_phrase", "prose_document"]

_PLURAL_PRONOUNS = frozenset(WORDS.plural_pronouns)
_MAX_WORDS = 2000


def _number_phrase(d: Draw) -> str:
    roll = d.u()
    if roll < 0.4:
        return f"{d.int(2, 12)} {plural(d.word(NOUNS))}"
    if roll < 0.7:
        return f"{d.int(13, 999)} {plural(d.word(NOUNS))}"
    if roll < 0.85:
        return f"{d.int(1, 99)}.{d.int(0, 9)} percent of the {plural(d.word(NOUNS))}"
    return f"{d.int(1000, 99999):,} {plural(d.word(NOUNS))}"


def noun_phrase(d: Draw, *, subject: bool) -> tuple[str, bool]:
    """A noun phrase and whether it is plural (for verb agreement)."""
    roll = d.u()
    if roll < 0.08:
        pronoun = d.one(WORDS.subject_pronouns if subject else WORDS.object_pronouns)
        return pronoun, pronoun in _PLURAL_PRONOUNS
    if roll < 0.16:
        name = d.word(PERSONS)
        if d.chance(0.4):
            name += " " + d.word(SURNAMES)
        return name, False
    if roll < 0.20:
        return d.word(PLACES), False
    if roll < 0.24:
        return _number_phrase(d), True
    noun = d.word(NOUNS)
    is_plural = d.chance(0.3)
    if is_plural:
        noun = plural(noun)
    adjectives = []
    if d.chance(0.45):
        adjectives.append(d.word(ADJECTIVES))
        if d.chance(0.12):
            adjectives.append(d.word(ADJECTIVES))
    body = " ".join([*adjectives, noun])
    det_roll = d.u()
    if is_plural:
        det = "the" if det_roll < 0.5 else d.one(WORDS.plural_determiners)
    elif det_roll < 0.5:
        det = "the"
    elif det_roll < 0.8:
        det = article(body)
    else:
        det = d.one(WORDS.singular_determiners)
    phrase = f"{det} {body}"
    if d.chance(0.12):
        phrase += f" of {d.word(PLACES)}" if d.chance(0.4) else f" of the {d.word(NOUNS)}"
    return phrase, is_plural


def _verb_phrase(d: Draw, *, is_plural: bool, in_past: bool) -> str:
    transitive = d.chance(0.7)
    verb = d.word(VERBS if transitive else INTRANSITIVE)
    roll = d.u()
    if roll < 0.1:
        if in_past:
            form = f"{'were' if is_plural else 'was'} {gerund(verb)}"
        else:
            form = f"{'are' if is_plural else 'is'} {gerund(verb)}"
    elif roll < 0.2:
        form = f"{d.one(WORDS.modal_verbs)} {verb}"
    elif roll < 0.25:
        form = f"did not {verb}" if in_past else f"{'do' if is_plural else 'does'} not {verb}"
    elif in_past:
        form = past(verb)
    else:
        form = verb if is_plural else third_person(verb)
    parts = [form]
    if transitive:
        parts.append(noun_phrase(d, subject=False)[0])
    if d.chance(0.35):
        parts.append(f"{d.word(PREPOSITIONS)} {noun_phrase(d, subject=False)[0]}")
    if d.chance(0.2):
        adverb = d.word(ADVERBS)
        if d.chance(0.5):
            parts.append(adverb)
        else:
            parts.insert(0, adverb)
    if d.chance(0.05):
        parts.append(f"in {d.int(1650, 2030)}")
    return " ".join(parts)


def clause(d: Draw, *, in_past: bool) -> str:
    """A subject and a verb phrase that agrees with it, in the past or the present tense (not capitalized)."""
    subject, is_plural = noun_phrase(d, subject=True)
    return f"{subject} {_verb_phrase(d, is_plural=is_plural, in_past=in_past)}"


def _sentence(d: Draw, *, in_past: bool) -> str:
    roll = d.u()
    if roll < 0.06:
        subject, is_plural = noun_phrase(d, subject=True)
        aux = "did" if in_past else "do" if is_plural else "does"
        verb = d.word(VERBS)
        obj = noun_phrase(d, subject=False)[0]
        wh = d.one(WORDS.question_words)
        return f"{wh} {aux} {subject} {verb} {obj}?"
    if roll < 0.12:
        speaker = d.word(PERSONS)
        said = d.one(WORDS.speech_verbs)
        return f"\u201c{capitalize(clause(d, in_past=False))},\u201d {said} {speaker}."
    text = clause(d, in_past=in_past)
    roll = d.u()
    if roll < 0.22:
        text = f"{text}, {d.one(WORDS.conjunctions)} {clause(d, in_past=in_past)}"
    elif roll < 0.36:
        text = f"{d.one(WORDS.subordinators)} {clause(d, in_past=in_past)}, {text}"
    elif roll < 0.44:
        text = f"{d.one(WORDS.openers)}, {text}"
    elif roll < 0.48:
        text = f"{text}; {clause(d, in_past=in_past)}"
    return capitalize(text) + ("!" if d.chance(0.02) else ".")


def prose_document(d: Draw) -> str:
    """Paragraphs separated by blank lines, ~50-2000 words (a log-uniform target, never above 2000)."""
    target = d.log_int(50, 1950)
    paragraphs: list[str] = []
    words = 0
    while words < target:
        in_past = d.chance(0.6)
        sentences: list[str] = []
        for _ in range(d.int(2, 8)):
            sentence = _sentence(d, in_past=in_past)
            n = sentence.count(" ") + 1
            if words + n > _MAX_WORDS:
                continue
            sentences.append(sentence)
            words += n
            if words >= target:
                break
        if sentences:
            paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)
