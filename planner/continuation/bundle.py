"""What a continued plan's bundle holds besides its new segment: the parent's kept rows, and plan.json keys.

``zephon.planner.continuation.child`` decides the branch and lays out the new segment; ``write_bundle``
(``zephon.planner.build``) writes the kept rows (``Prefix``) before it, and plan.json
(``zephon.planner.manifest_writer``) has the ``lineage`` and the ``phases`` that ``Continued.phases`` builds:
the parent's phases clipped to the prefix, then the segment's, each tagged with its lineage segment, so
``zephon audit`` checks every segment against its own target.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from zephon.plan.manifest import Manifest, PlanLineage, PlanPhase
from zephon.planner.layout import Chunk
from zephon.planner.prepare import PreparedPlan

#: Prefix rows per chunk handed to the samples writer.
PREFIX_CHUNK = 1 << 19


@dataclass(frozen=True, kw_only=True, slots=True)
class Prefix:
    """The parent's kept rows (columns of samples.parquet, positions ``[0, position)``) and its phases."""

    columns: dict[str, np.ndarray | None]
    position: int

    def chunks(self) -> Iterator[Chunk]:
        for start in range(0, self.position, PREFIX_CHUNK):
            end = min(self.position, start + PREFIX_CHUNK)

            def part(name: str, start: int = start, end: int = end) -> np.ndarray | None:
                values = self.columns[name]
                return values[start:end] if values is not None else None

            yield Chunk(
                start=start,
                stage=-1,  # the parent's: plan.json phases of the prefix come from the parent (``Continued.phases``)
                dataset_id=self.columns["dataset_id"][start:end],  # type: ignore[index]
                shard_id=self.columns["shard_id"][start:end],  # type: ignore[index]
                row=self.columns["row"][start:end],  # type: ignore[index]
                epoch=self.columns["epoch"][start:end],  # type: ignore[index]
                tokens=part("tokens"),
                token_offset=part("token_offset"),
                deal=part("deal"),
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Continued:
    """What ``write_bundle`` adds for a continuation: the kept rows first, then plan.json ``phases`` (the
    parent's clipped to the prefix, then the segment's: ``phases``) and ``lineage``."""

    prefix: Prefix
    parent: Manifest
    #: The child's ``lineage``: the parent, the branch, and the segments up to the new one.
    lineage: PlanLineage
    #: Called on each chunk of the new segment before it is written (raises to refuse the continuation).
    check: Callable[[Chunk], None] | None = None
    #: A plan packing samples by cost: the parent's row closes before the seam, then the seam's
    #: (``zephon.planner.continuation.records.kept_closes``).
    sample_closes: tuple[tuple[int, int | None], ...] = ()

    def checked(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """The new segment's chunks, each passed to ``check`` first."""
        for chunk in chunks:
            if self.check is not None:
                self.check(chunk)
            yield chunk

    def phases(self, prepared: PreparedPlan, segment_phases: tuple[PlanPhase, ...]) -> tuple[PlanPhase, ...]:
        """plan.json ``phases`` of the child: the parent's clipped to the prefix, then ``segment_phases`` (the
        layout's, from the branch), each tagged with its lineage segment."""
        names = [d["name"] for d in prepared.config["datasets"]]
        segment = prepared.segment
        assert segment is not None, "a continuation lays out a segment"
        ids = self.prefix.columns["dataset_id"]
        tokens = self.prefix.columns["tokens"]
        kept: list[PlanPhase] = []
        parent_segment = len(self.lineage.segments) - 2
        for phase in self.parent.resolved_phases:
            first, end = phase.first_position, min(phase.end_position, self.prefix.position)
            if first >= end and not (first == 0 and end == 0):
                continue
            docs = np.bincount(ids[first:end], minlength=len(names))  # type: ignore[index]
            counted = planned_tokens = None
            if tokens is not None:
                per = np.bincount(ids[first:end], weights=tokens[first:end], minlength=len(names))  # type: ignore[index]
                counted = int(per.sum())
                planned_tokens = MappingProxyType({n: int(t) for n, t in zip(names, per, strict=True)})
            kept.append(
                PlanPhase(
                    index=len(kept),
                    segment=self._segment_of(first, parent_segment),
                    start=phase.start,
                    start_position=phase.start_position,
                    start_tokens=phase.start_tokens,
                    weights=phase.weights,
                    first_position=first,
                    end_position=end,
                    documents=int(docs.sum()),
                    planned_documents=MappingProxyType({n: int(d) for n, d in zip(names, docs, strict=True)}),
                    tokens=counted,
                    planned_tokens=planned_tokens,
                )
            )
        new = len(self.lineage.segments) - 1
        for phase in segment_phases:
            position, start_tokens = phase.start_position, phase.start_tokens
            kept.append(
                replace(
                    phase,
                    index=len(kept),
                    segment=new,
                    start_position=position + segment.position if position is not None else None,
                    start_tokens=start_tokens + segment.tokens if start_tokens is not None else None,
                )
            )
        return tuple(kept)

    def _segment_of(self, position: int, last: int) -> int:
        """The parent segment holding ``position`` (the parent's own lineage; 0 without one)."""
        out = 0
        for s in self.lineage.segments[: last + 1]:
            if s.first_position <= position:
                out = s.segment
        return out
