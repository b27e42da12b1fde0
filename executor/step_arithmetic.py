"""Steps, sequences, lanes and tokens: the one definition of the arithmetic every reader of a plan shares.

Training consumes *sequences* — rows of ``W`` (``max_length``) tokens — numbered globally ``j = 0, 1, 2, …`` in
the order the plan fixes, one global batch of ``G`` sequences per optimizer *step*. From that:

* step ``s`` is sequences ``[s·G, (s+1)·G)``, so sequence ``j`` is in step ``j // G`` (``step_sequences``,
  ``step_of``); ``N`` sequences make ``⌈N / G⌉`` steps, ``⌊N / G⌋`` of them full (``steps_in``).
* wrap plans (exact ones, and estimated ones on their cumulative estimated tokens): sequence ``j`` is stream
  tokens ``[j·W, (j+1)·W)`` (``sequence_tokens``), so step ``s`` is tokens ``[s·T, (s+1)·T)`` with ``T = G·W``
  (``tokens_per_step``, ``step_tokens``) and token ``o`` is in step ``o // T`` (``step_of_token``); ``M`` tokens
  make ``⌈M / W⌉`` sequences (``sequences_in``). A document of ``t > 0`` tokens at offset ``o`` overlaps steps
  ``o // T .. (o + t − 1) // T`` (``document_steps``) and has ``min(o + t, end) − max(o, start)`` of its tokens
  in the stretch ``[start, end)`` (``tokens_inside``); the first plan position of step ``s`` is the first
  document with ``o ≥ s·T`` (``first_position``: the documents before it are all the steps before ``s`` read).
* plans without tokens: a sequence is one document, sequence ``j`` is plan position ``j``.
* estimated plans pack at train time in ``L`` lanes: sequence ``j`` is row ``j // L`` of lane ``j % L``
  (``lane_of``, ``lane_row``); ``R`` rows of every lane are ``L·R`` sequences.

Every formula of a sequence, step or lane (with ``G = 1`` a "step" is one sequence, which is how the
inspection's ``sequences`` view is cut) lives here: the executor (``geometry``, ``exact``, ``estimated``,
``run_length``, the runner), the planner (packing, phases in steps, continuation branches) and the inspection
(``steps``, ``show``, ``log_check``) call these functions. The functions that take ``Sql`` operands return the
DuckDB SQL of the same formula: ``zephon.inspection.views`` builds its views from them, so the SQL cannot
drift from the Python (DuckDB's ``//`` truncates where Python's floors; the operands are never negative).

Invariant: for every sequence ``j``, token ``o`` and document ``(o, t)``: ``j`` lies in
``step_sequences(step_of(j))``, ``o`` in ``step_tokens(step_of_token(o))``, and ``tokens_inside`` over the steps
of ``document_steps`` is positive for each of them and sums to ``t``.

Worked example, ``G = 2``, ``W = 4`` (``T = 8``), documents of 3, 6 and 2 tokens at offsets 0, 3, 9::

    stream     d0 d0 d0 d1 | d1 d1 d1 d1 | d1 d2 d2 .
    sequence        0      |      1      |      2        sequences_in(11, 4) = 3
    step                   0             |      1        steps_in(3, 2) = 2, one of them full

    step_sequences(1, 2) = (2, 4); step_tokens(1, 2, 4) = (8, 16); step_of_token(9, 2, 4) = 1
    d1: document_steps(3, 6, 2, 4) = (0, 1); tokens_inside(3, 6, 0, 8) = min(9, 8) − max(3, 0) = 5,
        tokens_inside(3, 6, 8, 16) = 1 (5 + 1 = 6)
    first_position([0, 3, 9], 1, 2, 4) = 2: d1 has tokens in step 0, so a branch at step 1 keeps d0 and d1
    with L = 2 lanes, sequence 3 is row lane_row(3, 2) = 1 of lane lane_of(3, 2) = 1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "Sql",
    "document_steps",
    "first_position",
    "lane_of",
    "lane_row",
    "sequence_tokens",
    "sequences_in",
    "step_of",
    "step_of_token",
    "step_sequences",
    "step_tokens",
    "steps_in",
    "tokens_inside",
    "tokens_per_step",
]


@dataclass(frozen=True, slots=True)
class Sql:
    """A DuckDB SQL integer expression (a column, ``CAST(n AS BIGINT)``, …): ``+ - * //`` with ints or other
    ``Sql`` build the SQL of the same operation, fully parenthesized. ``str()`` / f-strings give the text.

    Example: ``Sql("token_offset") // 8 + 1`` is ``Sql("((token_offset // 8) + 1)")``.
    """

    text: str

    def __str__(self) -> str:
        return self.text

    def __add__(self, other: Sql | int) -> Sql:
        return Sql(f"({self} + {other})")

    def __radd__(self, other: int) -> Sql:
        return Sql(f"({other} + {self})")

    def __sub__(self, other: Sql | int) -> Sql:
        return Sql(f"({self} - {other})")

    def __rsub__(self, other: int) -> Sql:
        return Sql(f"({other} - {self})")

    def __mul__(self, other: Sql | int) -> Sql:
        return Sql(f"({self} * {other})")

    def __rmul__(self, other: int) -> Sql:
        return Sql(f"({other} * {self})")

    def __floordiv__(self, other: Sql | int) -> Sql:
        return Sql(f"({self} // {other})")

    def __rfloordiv__(self, other: int) -> Sql:
        return Sql(f"({other} // {self})")


#: What the formulas take: a Python int, a numpy integer array (elementwise) or a SQL expression.
Int = int | np.integer | np.ndarray | Sql


def _least(a: Int, b: Int) -> Int:
    if isinstance(a, Sql) or isinstance(b, Sql):
        return Sql(f"least({a}, {b})")
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)  # type: ignore[type-var]


def _greatest(a: Int, b: Int) -> Int:
    if isinstance(a, Sql) or isinstance(b, Sql):
        return Sql(f"greatest({a}, {b})")
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)  # type: ignore[type-var]


# -- counts ---------------------------------------------------------------------------------------------------


def sequences_in(tokens: int, max_length: int) -> int:
    """Sequences of a wrap stream of ``tokens`` tokens: ``⌈M / W⌉`` (the last one may be short)."""
    return -(-tokens // max_length)


def steps_in(sequences: int, global_batch: int, *, drop_last: bool = False) -> int:
    """Steps of ``sequences`` sequences: ``⌈N / G⌉`` (the last one may be partial), or with ``drop_last`` the
    ``⌊N / G⌋`` full ones."""
    return sequences // global_batch if drop_last else -(-sequences // global_batch)


def tokens_per_step(global_batch: int, max_length: int) -> int:
    """Stream tokens of one step of a wrap plan: ``T = G·W``."""
    return global_batch * max_length


# -- steps ↔ sequences ----------------------------------------------------------------------------------------


def step_of(sequence: Int, global_batch: int) -> Int:
    """The step holding sequence ``j``: ``j // G``."""
    return sequence // global_batch


def step_sequences(step: Int, global_batch: int) -> tuple[Int, Int]:
    """Sequences ``[s·G, (s+1)·G)`` of step ``s`` (clip the end to the plan's sequences for its last step)."""
    return step * global_batch, (step + 1) * global_batch


# -- sequences ↔ tokens (wrap plans) --------------------------------------------------------------------------


def sequence_tokens(first: Int, end: Int, max_length: int) -> tuple[Int, Int]:
    """Stream tokens ``[first·W, end·W)`` of sequences ``[first, end)`` of a wrap plan."""
    return first * max_length, end * max_length


def step_tokens(step: Int, global_batch: int, max_length: int) -> tuple[Int, Int]:
    """Stream tokens ``[s·T, (s+1)·T)`` of step ``s`` of a wrap plan (``T = G·W``)."""
    per_step = tokens_per_step(global_batch, max_length)
    return step * per_step, (step + 1) * per_step


def step_of_token(offset: Int, global_batch: int, max_length: int) -> Int:
    """The step holding stream token ``o`` of a wrap plan: ``o // T``."""
    return offset // tokens_per_step(global_batch, max_length)


def document_steps(offset: Int, tokens: Int, global_batch: int, max_length: int) -> tuple[Int, Int]:
    """First and last step (inclusive) a document of ``t ≥ 1`` tokens at offset ``o`` has tokens in."""
    return step_of_token(offset, global_batch, max_length), step_of_token(offset + tokens - 1, global_batch, max_length)


def tokens_inside(offset: Int, tokens: Int, start: Int, end: Int) -> Int:
    """Tokens of a document (``t`` tokens at offset ``o``) inside stream tokens ``[start, end)``:
    ``min(o + t, end) − max(o, start)`` (≤ 0 when it has none there)."""
    return _least(offset + tokens, end) - _greatest(offset, start)


def first_position(offsets: np.ndarray, step: int, global_batch: int, max_length: int) -> int:
    """The first plan position of a wrap plan with no token in a step before ``step``: the first document whose
    offset (``offsets``, sorted) is ``≥ s·T``; ``len(offsets)`` past the end."""
    start, _ = step_tokens(step, global_batch, max_length)
    return int(np.searchsorted(offsets, start, side="left"))


# -- lanes (estimated plans) ----------------------------------------------------------------------------------


def lane_of(sequence: int | np.ndarray, lanes: int) -> int | np.ndarray:
    """The packing lane of sequence ``j``: ``j % L``."""
    return sequence % lanes


def lane_row(sequence: int | np.ndarray, lanes: int) -> int | np.ndarray:
    """Sequence ``j``'s row within its lane: ``j // L``."""
    return sequence // lanes
