"""plan.json's ``phases`` and ``lineage`` records: the one declaration each is read from and written by
(``zephon.plan.json_record``; field names are the JSON keys, in the order the planner writes them).

A continued plan (``zephon.planner.continuation.child``) tags each phase with its lineage ``segment``; its lineage
names the parent, the branch and every segment's first step, which is what decides whether a checkpoint state
of another plan of the lineage resumes on this one (``PlanLineage.accepts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zephon.plan.json_fields import COUNT, INT, POSITIVE, TEXT, Value
from zephon.plan.json_record import key, record, records
from zephon.plan.manifest_parts import COUNTS, WEIGHTS

__all__ = ["LineageBranch", "LineageParent", "LineageSegment", "PhaseStart", "PlanLineage", "PlanPhase"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseStart:
    """A phase's ``start`` as configured: a fraction (``"1/2"``) or a count in ``unit``."""

    start: str | int = key(Value("a fraction or an integer", lambda v: isinstance(v, str) or INT.test(v)))
    unit: str = key(TEXT)
    global_batch_size: int | None = key(POSITIVE.optional(), always=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanPhase:
    """One entry of ``phases``: the positions ``[first_position, end_position)`` it occupies and its mixture."""

    index: int = key(COUNT)
    #: The lineage segment the phase belongs to (continued plans only; None in others).
    segment: int | None = key(COUNT.optional())
    start: PhaseStart | None = key(record(PhaseStart).optional(), always=True)
    start_position: int | None = key(COUNT.optional(), always=True)
    start_tokens: int | None = key(COUNT.optional(), always=True)
    weights: Mapping[str, float] = key(WEIGHTS)
    first_position: int = key(COUNT)
    end_position: int = key(COUNT)
    documents: int = key(COUNT)
    planned_documents: Mapping[str, int] = key(COUNTS)
    tokens: int | None = key(COUNT.optional())
    planned_tokens: Mapping[str, int] | None = key(COUNTS.optional())


@dataclass(frozen=True, kw_only=True, slots=True)
class LineageParent:
    """``lineage.parent``: the plan a continued plan branched from."""

    config_hash: str = key(TEXT)
    #: SHA-256 of the parent's plan.json bytes (whose integrity record covers its Parquet files).
    plan_json_sha256: str = key(TEXT)
    path: str = key(TEXT)


@dataclass(frozen=True, kw_only=True, slots=True)
class LineageBranch:
    """``lineage.branch``: the first step and document position of the new segment, for ``global_batch`` rows."""

    step: int = key(COUNT)
    position: int = key(COUNT)
    global_batch: int = key(POSITIVE)
    #: Tokens (exact or estimated; 0 without counts) of the kept prefix.
    tokens: int = key(COUNT)


@dataclass(frozen=True, kw_only=True, slots=True)
class LineageSegment:
    """One entry of ``lineage.segments``: the stretch of the plan one configuration laid out, from its first
    global step and position to the next segment's."""

    segment: int = key(COUNT)
    config_hash: str = key(TEXT)
    first_step: int = key(COUNT)
    first_position: int = key(COUNT)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanLineage:
    """``lineage`` (continued plans only; ``zephon.planner.continuation.child``)."""

    parent: LineageParent = key(record(LineageParent))
    branch: LineageBranch = key(record(LineageBranch))
    segments: tuple[LineageSegment, ...] = key(records(LineageSegment))

    def accepts(self, config_hash: str, step: int, microbatch: int) -> bool:
        """Whether a checkpoint state of plan ``config_hash`` at ``step`` (``microbatch``) resumes on this plan:
        it comes from the parent at a step before the branch (or at it, on a step boundary), or from an earlier
        segment's plan at a step before the next segment."""
        if config_hash == self.parent.config_hash:
            return step < self.branch.step or (step == self.branch.step and microbatch == 0)
        for here, after in zip(self.segments, self.segments[1:], strict=False):
            if here.config_hash == config_hash:
                return step < after.first_step or (step == after.first_step and microbatch == 0)
        return False

    def segment_of_step(self, step: int) -> int:
        """The segment holding global step ``step`` (of ``branch.global_batch`` rows)."""
        return max((s.segment for s in self.segments if s.first_step <= step), default=0)
