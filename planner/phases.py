"""Phases of a curriculum resolved into stages: where each mixture starts, in plan positions or tokens.

A work source's ``mixture`` is phase 0; each ``zephon.work.Phase`` starts a later one. The planner turns
every phase into a ``Stage``: its weights per dataset (0 for datasets it does not read) and its start as a
plan position or as a token count — whichever the unit fixes before the plan is laid out:

* ``fraction`` of a ``num_documents`` budget N → position ``floor(f × N)``; of a ``num_tokens`` budget T →
  token ``floor(f × T)``; of a ``num_cost`` budget C (a cost mixture) → cost ``floor(f × C)`` (``f`` read as an
  exact fraction, so 0.9 × 1000 is exactly 900);
* ``documents`` → that position; ``tokens`` → that token; ``cost`` (cost mixtures) → that cost;
* ``steps`` (exact wrap plans) → token ``start × global_batch_size × max_length``: step ``s`` of a wrap plan
  begins exactly at that token of the stream.

A cost mixture's samples' costs stand where a token mixture's token counts stand (``zephon.planner.costs``), so a
start in cost is kept as ``start_tokens`` and laid out by the same rule. A stage that starts at a token begins
with the first document placed after the stream has reached that many tokens (the document that crosses the
boundary belongs to the earlier stage), so in a wrap plan a phase in steps begins within its step.

Invariant: every stage has exactly one start (a position or a token count), stage 0 starts at position 0,
and starts are validated to increase; two starts that round to the same position leave the earlier stage
empty.

Worked example: ``num_tokens = 10^6``, phases at fraction 0.9 → stage 0 from position 0 and stage 1 from
token 900,000. If the documents reach 899,990 and then one of 40 tokens is placed (899,990 → 900,030), that
document ends stage 0 and the next document is stage 1's first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from zephon.errors import ConfigError
from zephon.executor.step_arithmetic import step_tokens
from zephon.planner.interleave import exact_fraction, exact_weights
from zephon.recipe.work_source import WorkSource
from zephon.specs import PackSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    """One phase, resolved: its weights and where it starts (exactly one of the two starts is set)."""

    index: int
    #: Weights as given, per dataset of the work source (0.0 for datasets the phase does not read).
    raw: tuple[float, ...]
    start_position: int | None
    start_tokens: int | None

    @property
    def active(self) -> list[int]:
        """Datasets read in this stage."""
        return [i for i, w in enumerate(self.raw) if w > 0]

    def fractions(self) -> list[Fraction]:
        """Normalized weights per dataset (0 for datasets not read), summing exactly to 1."""
        active = self.active
        fracs = exact_weights([self.raw[i] for i in active])
        out = [Fraction(0)] * len(self.raw)
        for i, f in zip(active, fracs, strict=True):
            out[i] = f
        return out


def stages(source: WorkSource, pack: PackSpec | None) -> tuple[Stage, ...]:
    """The work source's phases as stages; one stage (from position 0) without phases."""
    names = [ds.name for ds in source.datasets]
    first = Stage(
        index=0,
        raw=tuple(float(source.mixture.weights[n]) for n in names),
        start_position=0,
        start_tokens=None,
    )
    out = [first]
    for index, phase in enumerate(source.phases, start=1):
        position = tokens = None
        if phase.unit == "fraction":
            if source.num_documents is not None:
                position = math.floor(exact_fraction(phase.start) * source.num_documents)
            else:
                amount = source.num_cost if source.num_cost is not None else source.num_tokens
                assert amount is not None, "phases are validated to come with a budget"
                tokens = math.floor(exact_fraction(phase.start) * amount)
        elif phase.unit == "documents":
            position = int(phase.start)
        elif phase.unit in ("tokens", "cost"):  # a cost mixture's costs stand where tokens stand
            tokens = int(phase.start)
        else:
            if pack is None or pack.algorithm != "wrap":
                raise ConfigError(
                    "phases in steps need wrap packing (a step is a fixed stretch of tokens only there), got "
                    f"{'no packing' if pack is None else repr(pack.algorithm)} — pack with algorithm='wrap', or "
                    'give the starts in unit="tokens"'
                )
            assert phase.global_batch_size is not None
            tokens, _ = step_tokens(int(phase.start), phase.global_batch_size, pack.max_length)
        out.append(
            Stage(
                index=index,
                raw=tuple(float(phase.mixture.weights.get(n, 0.0)) for n in names),
                start_position=position,
                start_tokens=tokens,
            )
        )
    return tuple(out)


def normalized(source: WorkSource) -> list[dict[str, Any]]:
    """The phases as they enter the plan's config (and its hash): starts and normalized weights."""
    out = []
    for phase in source.phases:
        names = [ds.name for ds in source.datasets if ds.name in phase.mixture.weights]
        fracs = exact_weights([float(phase.mixture.weights[n]) for n in names])
        out.append(
            {
                "start": str(exact_fraction(phase.start)) if phase.unit == "fraction" else int(phase.start),
                "unit": phase.unit,
                "global_batch_size": phase.global_batch_size,
                "weights": {n: str(f) for n, f in zip(names, fracs, strict=True)},
            }
        )
    return out
