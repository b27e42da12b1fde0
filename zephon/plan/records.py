"""The shard record: what the plan knows about one shard, as the scan finds it and as shards.parquet holds it.

One record, in two steps of its life. The scan (``zephon.storage.scan``) finds a ``ShardInfo``: where the
shard is and what it holds. The planner numbers it — ``ShardInfo.placed`` — into a ``ShardRef``, which *is*
that ``ShardInfo`` plus its place in the plan (shard id, dataset id and name): one row of shards.parquet.
A subclass rather than one record with optional ids, so that a ``ShardRef`` always has its ids (no
``None`` to check in the executor) while the fields describing the file are declared once; code that only
reads the file may take either. ``shards_table`` and ``shard_refs`` convert between records and the table,
whose columns and types are ``SHARDS_SCHEMA`` (``zephon.plan.format``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import pyarrow as pa

from zephon.plan.format import SHARDS_SCHEMA

__all__ = ["ShardInfo", "ShardRef", "shard_refs", "shards_table"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardInfo:
    """A shard as the scan finds it: its file and what the file holds."""

    uri: str
    format: str
    rows: int
    bytes: int
    fingerprint: str
    row_groups: int = 1

    @property
    def identity(self) -> tuple[str, str]:
        """``(uri, fingerprint)``: names the shard's content across plans (shard ids are renumbered)."""
        return (self.uri, self.fingerprint)

    def placed(self, *, shard_id: int, dataset_id: int, dataset: str) -> ShardRef:
        """This shard numbered by a plan: its row of shards.parquet."""
        scanned = {f.name: getattr(self, f.name) for f in fields(ShardInfo)}
        return ShardRef(shard_id=shard_id, dataset_id=dataset_id, dataset=dataset, **scanned)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardRef(ShardInfo):
    """One row of shards.parquet: a scanned shard with its id and its dataset's id and name."""

    shard_id: int
    dataset_id: int
    dataset: str


_COLUMNS = frozenset(f.name for f in fields(ShardRef))


def shard_refs(table: pa.Table) -> list[ShardRef]:
    """The rows of a shards.parquet table as ``ShardRef`` values."""
    return [ShardRef(**{k: v for k, v in r.items() if k in _COLUMNS}) for r in table.to_pylist()]


def shards_table(refs: Iterable[ShardRef]) -> pa.Table:
    """The shards.parquet table of ``refs``, in the given order, with the columns and types of ``SHARDS_SCHEMA``."""
    rows = list(refs)
    return pa.table({name: [getattr(r, name) for r in rows] for name in SHARDS_SCHEMA.names}, schema=SHARDS_SCHEMA)
