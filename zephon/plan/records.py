"""Shard records: what the plan knows about one shard, as the scan finds it and as shards.parquet holds it."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardRef:
    """One row of shards.parquet."""

    shard_id: int
    dataset_id: int
    dataset: str
    uri: str
    format: str
    rows: int
    bytes: int
    fingerprint: str
    row_groups: int = 1


def shard_refs(table: pa.Table) -> list[ShardRef]:
    """The rows of a shards.parquet table as ``ShardRef`` values."""
    names = {f for f in ShardRef.__slots__}  # type: ignore[attr-defined]
    return [ShardRef(**{k: v for k, v in r.items() if k in names}) for r in table.to_pylist()]


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardInfo:
    """What the planner knows about one shard."""

    uri: str
    format: str
    rows: int
    bytes: int
    row_groups: int
    fingerprint: str
