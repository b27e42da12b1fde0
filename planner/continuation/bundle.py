"""What a continued plan's bundle holds besides its new segment: the parent's kept rows, and plan.json keys.

``zephon.planner.continuation.child`` decides the branch and lays out the new segment; ``write_bundle``
(``zephon.planner.build``) writes the kept rows (``Prefix``) before it and adds the ``phases`` and ``lineage``
keys ``Continued.keys`` builds: the parent's phases clipped to the prefix, then the segment's, each tagged with
its lineage segment, so ``zephon audit`` checks every segment against its own target.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.plan.manifest import Manifest
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
                stage=-1,  # the parent's: plan.json phases of the prefix come from the parent (``lineage_phases``)
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
    parent's clipped to the prefix, then the segment's) and ``lineage``."""

    prefix: Prefix
    parent: Manifest
    lineage: dict[str, Any]
    #: Called on each chunk of the new segment before it is written (raises to refuse the continuation).
    check: Callable[[Chunk], None] | None = None

    def checked(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """The new segment's chunks, each passed to ``check`` first."""
        for chunk in chunks:
            if self.check is not None:
                self.check(chunk)
            yield chunk

    def keys(self, prepared: PreparedPlan, segment_phases: list[dict[str, Any]]) -> dict[str, Any]:
        """plan.json ``phases`` and ``lineage`` of the child (``segment_phases``: the layout's, from the branch)."""
        names = [d["name"] for d in prepared.config["datasets"]]
        segment = prepared.segment
        assert segment is not None, "a continuation lays out a segment"
        ids = self.prefix.columns["dataset_id"]
        tokens = self.prefix.columns["tokens"]
        kept = []
        parent_segment = len(self.lineage["segments"]) - 2
        for phase in self.parent.resolved_phases:
            first, end = phase.first_position, min(phase.end_position, self.prefix.position)
            if first >= end and not (first == 0 and end == 0):
                continue
            docs = np.bincount(ids[first:end], minlength=len(names))  # type: ignore[index]
            entry: dict[str, Any] = {
                "index": len(kept),
                "segment": self._segment_of(first, parent_segment),
                "start": None,
                "start_position": phase.start_position,
                "start_tokens": phase.start_tokens,
                "weights": dict(phase.weights),
                "first_position": first,
                "end_position": end,
                "documents": int(docs.sum()),
                "planned_documents": {n: int(d) for n, d in zip(names, docs, strict=True)},
            }
            if phase.start is not None:
                entry["start"] = {"start": phase.start.start, "unit": phase.start.unit,
                                  "global_batch_size": phase.start.global_batch_size}  # fmt: skip
            if tokens is not None:
                per = np.bincount(ids[first:end], weights=tokens[first:end], minlength=len(names))  # type: ignore[index]
                entry["tokens"] = int(per.sum())
                entry["planned_tokens"] = {n: int(t) for n, t in zip(names, per, strict=True)}
            kept.append(entry)
        new = len(self.lineage["segments"]) - 1
        for phase in segment_phases:
            phase = dict(phase)
            if phase["start_position"] is not None:
                phase["start_position"] += segment.position
            if phase["start_tokens"] is not None:
                phase["start_tokens"] += segment.tokens
            kept.append({"index": len(kept), "segment": new, **{k: v for k, v in phase.items() if k != "index"}})
        return {"phases": kept, "lineage": self.lineage}

    def _segment_of(self, position: int, last: int) -> int:
        """The parent segment holding ``position`` (the parent's own lineage; 0 without one)."""
        out = 0
        for s in self.lineage["segments"][: last + 1]:
            if int(s["first_position"]) <= position:
                out = int(s["segment"])
        return out
