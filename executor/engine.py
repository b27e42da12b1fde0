"""The executor's loop: plan positions → texts → tokens → packed rows → batches.

It follows the plan and decides nothing about *what* is read: the documents, their order and therefore
every batch are fixed by the plan bundle and the tokenize/pack settings. ``read_chunk`` (documents read and
tokenized together) and the tokenizer's thread count change speed only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from zephon.executor.batch import Batch
from zephon.executor.pack import PackedRows, WrapPacker
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.shard_reader import ShardReader
from zephon.executor.tokenize import Encoder, TokenizeSpec

from zephon.errors import ConfigError
from zephon.io import StoreOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class PackSpec:
    """Settings of ``Pipeline.pack_flat``.

    Attributes:
        max_length: tokens per packed row: context length + 1 (labels are shifted by one).
        algorithm: ``"wrap"`` concatenates documents and cuts rows, splitting documents at row ends.
        pad_token_id: pads the last row of the plan; None uses the tokenizer's pad token, else EOS.
    """

    max_length: int
    algorithm: str = "wrap"
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise ConfigError(f"max_length must be an integer ≥ 2, got {self.max_length!r} — use context + 1")
        if self.algorithm != "wrap":
            raise ConfigError(f'pack_flat algorithm must be "wrap" in this build, got {self.algorithm!r}')


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchSpec:
    """Settings of ``Pipeline.batch``.

    Attributes:
        microbatch_size: packed rows per batch.
        drop_last: drop the plan's final batch when it has fewer rows (default keeps it: no data lost).
    """

    microbatch_size: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.microbatch_size, int) or self.microbatch_size < 1:
            raise ConfigError(f"microbatch_size must be an integer ≥ 1, got {self.microbatch_size!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutorSpec:
    """Everything the executor needs besides the plan."""

    tokenize: TokenizeSpec
    pack: PackSpec
    batch: BatchSpec
    io: StoreOptions = field(default_factory=StoreOptions)
    read_chunk: int = 1024


def _concat(rows: list[PackedRows]) -> Batch:
    return Batch(
        tokens=np.concatenate([r.tokens for r in rows]),
        doc_start=np.concatenate([r.doc_start for r in rows]),
        lengths=np.concatenate([r.lengths for r in rows]),
    )


def iterate_batches(plan_dir: str | Path, spec: ExecutorSpec) -> Iterator[Batch]:
    """Yield the plan's batches in order."""
    plan = PlanBundle(plan_dir)
    encoder = Encoder(spec.tokenize)
    window = int(plan.manifest.get("shuffle", {}).get("window_shards", 1))
    reader = ShardReader(plan.shards, spec.tokenize.field, capacity=(window + 1) * len(plan.dataset_names))
    pad = spec.pack.pad_token_id if spec.pack.pad_token_id is not None else encoder.pad_id
    packer = WrapPacker(spec.pack.max_length, pad)
    size = spec.batch.microbatch_size
    pending: list[PackedRows] = []
    pending_rows = 0

    def drain(rows: PackedRows | None) -> Iterator[Batch]:
        nonlocal pending, pending_rows
        if rows is None:
            return
        pending.append(rows)
        pending_rows += len(rows.lengths)
        if pending_rows < size:
            return
        merged = _concat(pending)
        full = (pending_rows // size) * size
        for start in range(0, full, size):
            yield Batch(
                tokens=merged.tokens[start : start + size],
                doc_start=merged.doc_start[start : start + size],
                lengths=merged.lengths[start : start + size],
            )
        rest = PackedRows(tokens=merged.tokens[full:], doc_start=merged.doc_start[full:], lengths=merged.lengths[full:])
        pending, pending_rows = ([rest], len(rest.lengths)) if len(rest.lengths) else ([], 0)

    for chunk in plan.chunks(spec.read_chunk):
        texts = reader.texts(chunk.shard_id, chunk.row)
        yield from drain(packer.push(encoder.encode(texts)))
    yield from drain(packer.finish())
    if pending_rows and not spec.batch.drop_last:
        yield _concat(pending)
