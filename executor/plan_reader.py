"""Reading a plan bundle on a training node (pyarrow only; never Polars or DuckDB)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from zephon.errors import PlanFormatError
from zephon.plan_format import SAMPLES_SCHEMA, SHARDS_FILE, SHARDS_SCHEMA, check_schema, read_manifest


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


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleChunk:
    """Consecutive plan positions ``[start, start + len)`` with where each document lives."""

    start: int
    dataset_id: np.ndarray
    shard_id: np.ndarray
    row: np.ndarray

    def __len__(self) -> int:
        return len(self.shard_id)


class PlanBundle:
    """A validated plan bundle: manifest, shard table and chunked access to the samples."""

    def __init__(self, plan_dir: str | Path) -> None:
        self.path = Path(plan_dir)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        shards_file = self.path / SHARDS_FILE
        try:
            table = pq.read_table(shards_file)
        except (OSError, ValueError) as exc:
            raise PlanFormatError(f"{shards_file} must be a readable Parquet file, got {exc} — re-plan") from exc
        check_schema(table.schema, SHARDS_SCHEMA, shards_file)
        self.shards: list[ShardRef] = [
            ShardRef(
                shard_id=r["shard_id"],
                dataset_id=r["dataset_id"],
                dataset=r["dataset"],
                uri=r["uri"],
                format=r["format"],
                rows=r["rows"],
                bytes=r["bytes"],
                fingerprint=r["fingerprint"],
            )
            for r in table.to_pylist()
        ]
        self.sample_files = [self.path / name for name in self.manifest["files"]["samples"]]
        for file in self.sample_files:
            check_schema(pq.read_schema(file), SAMPLES_SCHEMA, file)

    @property
    def num_documents(self) -> int:
        return int(self.manifest["totals"]["documents"])

    @property
    def dataset_names(self) -> list[str]:
        return [d["name"] for d in self.manifest["datasets"]]

    def chunks(self, chunk_size: int) -> Iterator[SampleChunk]:
        """Yield the samples in plan order, ``chunk_size`` documents at a time."""
        start = 0
        for file in self.sample_files:
            reader = pq.ParquetFile(file)
            for batch in reader.iter_batches(batch_size=chunk_size, columns=["dataset_id", "shard_id", "row"]):
                chunk = SampleChunk(
                    start=start,
                    dataset_id=batch.column(0).to_numpy(),
                    shard_id=batch.column(1).to_numpy(),
                    row=batch.column(2).to_numpy(),
                )
                start += len(chunk)
                yield chunk
