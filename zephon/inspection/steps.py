"""Sequences and steps of a plan: how scheduled documents become training rows and global batches.

A plan lists documents; training consumes *sequences* (packed rows) in global batches of ``B`` sequences,
one batch per optimizer *step*. Which documents a sequence holds depends on the kind of plan
(``resolve_layout`` reads it from ``plan.json``):

* **exact wrap** (``packing.algorithm == "wrap"``): sequence ``k`` is tokens ``[k·L, (k+1)·L)`` of the global
  stream (``L = packing.max_length``). A document of ``t`` tokens at ``token_offset`` ``o`` overlaps
  sequences ``⌊o/L⌋ .. ⌊(o+t-1)/L⌋``.
* **exact best_fit**: ``bins.parquet`` lists the pieces of every sequence; documents stay whole unless longer
  than ``L``. Documents dropped by ``oversize="drop"`` are in no sequence.
* **estimated, with a ``tokens`` column** (token mixtures): the same formula on the *cumulative estimated*
  tokens (offsets are the running sum of ``tokens`` in plan order, ``L`` given by the caller because an
  estimated plan packs at train time). Labelled estimated: the real rows differ by the estimation error.
* **no tokens** (sample mixtures): a "sequence" is one document; sequence ``k`` is position ``k``.
* **costs** (records with ``cost=``, plan.json ``totals.tokens_are == "cost"``): the ``tokens`` column holds each
  sample's cost. Packed by ``pack_samples`` (plan.json ``sample_packing``): best_fit, bins.parquet lists each
  row's samples, ``L = max_cost``; unpacked: a sequence is one sample, and its cost counts in its step.

Over 400 lines: every layout above and the one seeker that serves them all are a single contract with
the SQL views (``zephon.inspection.views``); split, the rules here would drift from the code that reads them.

Step ``s`` is sequences ``[s·B, (s+1)·B)``: a document belongs to every step one of its sequences is in.
Wrap plans use the formula with ``B·L`` in place of ``L``. The formulas are ``zephon.executor.step_arithmetic``'s
(which the executor and the SQL views of ``zephon.inspection.views`` use too).

Worked example, exact wrap with ``L = 4``, ``B = 2``, documents of 3, 6 and 2 tokens (offsets 0, 3, 9)::

    stream   d0 d0 d0 d1 | d1 d1 d1 d1 | d1 d2 d2 .
    sequence      0      |      1      |      2          (3 sequences: ⌈11/4⌉)
    step               0               |      1          (B·L = 8 tokens per step)

    d1 (offset 3, 6 tokens) overlaps sequences ⌊3/4⌋=0 .. ⌊8/4⌋=2 and steps ⌊3/8⌋=0 .. ⌊8/8⌋=1;
    tokens of d1 in step 0 = min(3+6, 8) − max(3, 0) = 5, in step 1 = min(9, 16) − max(3, 8) = 1.

``StepSeeker`` answers "which documents are in sequences ``[k0, k1)``" by seeking: positions are dense, so
a position is a row number; token offsets and bin sequences are sorted, so Parquet footer statistics
(each row group's minimum) pick the row group and one row group is searched. Only estimated plans read
more: the ``tokens`` column of the row groups before the target, to form the running sum (4 bytes per
document, no other column). This module uses pyarrow only (no DuckDB or Polars), so it loads fast.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import pyarrow as pa

from zephon.checks import require_positive
from zephon.errors import ConfigError
from zephon.executor.step_arithmetic import sequence_tokens, sequences_in, steps_in, tokens_inside, tokens_per_step
from zephon.plan.bundle import CheckedBundle, open_bundle
from zephon.plan.manifest import Manifest
from zephon.plan.row_groups import RowGroups

__all__ = ["StepDocuments", "StepLayout", "StepSeeker", "resolve_layout"]

Packing = Literal["wrap", "best_fit", "document"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepLayout:
    """How a plan's documents map onto sequences and steps (see the module docstring)."""

    #: ``wrap`` (cumulative token offsets cut every ``max_length``), ``best_fit`` (bins.parquet) or
    #: ``document`` (no tokens: one document per sequence).
    packing: Packing
    #: Where wrap offsets come from: the ``token_offset`` column (exact) or the running sum of ``tokens``.
    offsets: Literal["column", "cumulative", "none"]
    #: ``exact`` or ``estimated`` token counts, or ``cost`` (the samples' costs); ``None`` for plans without tokens.
    tokens: Literal["exact", "estimated", "cost"] | None
    #: Tokens per sequence (``L``); ``None`` for ``document`` plans and estimated plans not given one.
    max_length: int | None
    #: Sequences per step (the global batch); ``None`` when not known.
    batch_size: int | None
    #: Documents in the plan.
    documents: int
    #: Tokens in the plan (exact or estimated); ``None`` without tokens.
    total_tokens: int | None
    #: Sequences in the plan; ``None`` when ``max_length`` is needed and unknown.
    sequences: int | None

    @property
    def has_sequences(self) -> bool:
        return self.sequences is not None

    @property
    def steps(self) -> int | None:
        """Steps in the plan (the last one may be partial); ``None`` without a batch size or sequences."""
        if self.batch_size is None or self.sequences is None:
            return None
        return steps_in(self.sequences, self.batch_size)

    @property
    def step_tokens(self) -> int | None:
        """Tokens per step for wrap plans (``B·L``)."""
        if self.batch_size is None or self.max_length is None:
            return None
        return tokens_per_step(self.batch_size, self.max_length)

    def require_steps(self) -> int:
        """The number of steps, or a ConfigError that says which option is missing."""
        self.require_sequences()
        if self.batch_size is None:
            raise ConfigError(
                "batch_size must be given to cut the plan into steps, got none (plan.json records no "
                "`batch.global_batch_size`) — pass --batch-size B, the global batch in sequences"
            )
        steps = self.steps
        assert steps is not None
        return steps

    def require_sequences(self) -> int:
        if self.sequences is None:
            raise ConfigError(
                "max_length must be given for an estimated plan with tokens (it packs at train time), got none — "
                "pass --max-length L, the max_length of the pipeline's pack_flat()"
            )
        return self.sequences

    def describe(self) -> str:
        """One phrase naming the sequence definition, e.g. ``exact wrap, 257 tokens per sequence``."""
        if self.tokens == "cost":
            if self.packing == "document":
                return "a sequence is one sample (costs known)"
            return f"samples packed by cost, at most {self.max_length} per row"
        if self.packing == "document":
            return "no tokens: a sequence is one document"
        tokens = self.tokens or "exact"
        kind = "wrap" if self.packing == "wrap" else "best_fit"
        length = f", {self.max_length} tokens per sequence" if self.max_length is not None else ""
        return f"{tokens} {kind}{length}"


def resolve_layout(manifest: Manifest, *, batch_size: int | None = None, max_length: int | None = None) -> StepLayout:
    """The plan's ``StepLayout``; ``batch_size`` defaults to ``plan.json`` ``batch.global_batch_size`` if set,
    else for a continued plan to ``lineage.branch.global_batch``.

    ``max_length`` is required (for steps) by estimated plans with tokens, must equal ``packing.max_length``
    for exact plans, and is refused for plans without tokens.
    """
    _check_positive("batch_size", batch_size, "--batch-size B, the global batch in sequences")
    _check_positive("max_length", max_length, "--max-length L, tokens per sequence")
    if batch_size is None and manifest.batch is not None:
        batch_size = manifest.batch.global_batch_size
    if batch_size is None and manifest.lineage is not None:  # a continued plan: the batch its branch was made for
        batch_size = manifest.lineage.branch.global_batch
    documents = manifest.totals.documents
    total_tokens = manifest.totals.tokens
    packing = manifest.packing
    exact = manifest.exact
    if manifest.totals.tokens_are == "cost":
        return _cost_layout(manifest, batch_size, max_length)
    if exact and packing is not None:
        fixed = packing.max_length
        if max_length is not None and max_length != fixed:
            raise ConfigError(
                f"max_length must be {fixed} (fixed by the exact plan's packing), got {max_length} — omit --max-length"
            )
        best_fit = packing.algorithm != "wrap"  # best_fit and homogeneous: rows listed in bins.parquet
        return StepLayout(
            packing="best_fit" if best_fit else "wrap",
            offsets="none" if best_fit else "column",
            tokens="exact",
            max_length=fixed,
            batch_size=batch_size,
            documents=documents,
            total_tokens=total_tokens,
            sequences=packing.sequences,
        )
    if total_tokens is None:
        if max_length is not None:
            raise ConfigError(
                f"max_length applies to plans with token counts, got {max_length} for a plan without tokens "
                "(a sequence is one document) — omit --max-length"
            )
        return StepLayout(
            packing="document",
            offsets="none",
            tokens=None,
            max_length=None,
            batch_size=batch_size,
            documents=documents,
            total_tokens=None,
            sequences=documents,
        )
    return StepLayout(
        packing="wrap",
        offsets="column" if exact else "cumulative",
        tokens="exact" if exact else "estimated",
        max_length=max_length,
        batch_size=batch_size,
        documents=documents,
        total_tokens=total_tokens,
        sequences=None if max_length is None else sequences_in(total_tokens, max_length),
    )


def _cost_layout(manifest: Manifest, batch_size: int | None, max_length: int | None) -> StepLayout:
    """A record plan with costs: rows of bins.parquet when it packs samples, else one sample per sequence."""
    if max_length is not None:
        raise ConfigError(
            f"max_length applies to plans of tokens, got {max_length} for a plan of sample costs — omit --max-length"
        )
    packed = manifest.sample_packing
    return StepLayout(
        packing="best_fit" if packed is not None else "document",
        offsets="none",
        tokens="cost",
        max_length=packed.max_cost if packed is not None else None,
        batch_size=batch_size,
        documents=manifest.totals.documents,
        total_tokens=manifest.totals.tokens,
        sequences=packed.rows if packed is not None else manifest.totals.documents,
    )


def _check_positive(name: str, value: object, fix: str) -> None:
    if value is not None:
        require_positive(value, name, fix=f"pass {fix}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepDocuments:
    """The documents of sequences ``[first_sequence, end_sequence)``, in plan order.

    ``tokens_in_range`` is how many of each document's tokens fall in those sequences (``None`` arrays are
    absent for plans without tokens).
    """

    first_sequence: int
    end_sequence: int
    position: np.ndarray
    dataset_id: np.ndarray
    shard_id: np.ndarray
    row: np.ndarray
    epoch: np.ndarray
    tokens: np.ndarray | None
    tokens_in_range: np.ndarray | None
    #: Best-fit layouts: the (first) sequence holding each document; None otherwise.
    sequence: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.position)


_COLUMNS = ["position", "dataset_id", "shard_id", "row", "epoch", "tokens", "token_offset"]


class StepSeeker:
    """Random access to a plan's samples by sequence, reading row groups chosen by footer statistics."""

    def __init__(self, plan: str | os.PathLike[str] | CheckedBundle, layout: StepLayout) -> None:
        bundle = plan if isinstance(plan, CheckedBundle) else open_bundle(plan)
        self.plan_dir = bundle.path
        self.layout = layout
        # The row groups of the samples file(s) in plan order; a part's footer is read when a group of it is.
        self._row_groups = RowGroups(bundle.samples)
        self._first_row = self._row_groups.first_row
        self._bins_file = bundle.bins if layout.packing == "best_fit" else None
        self._bins = self._bins_file.open() if self._bins_file is not None else None

    @property
    def num_rows(self) -> int:
        return int(self._first_row[-1])

    # -- reading rows ---------------------------------------------------------------------------------

    def _read_group(self, i: int, columns: list[str]) -> pa.Table:
        return self._row_groups.read(i, columns)

    def read_rows(self, start: int, stop: int, columns: list[str] | None = None) -> pa.Table:
        """Rows ``[start, stop)`` (plan positions) with ``columns`` (default: all samples columns)."""
        columns = columns or _COLUMNS
        start, stop = max(0, start), min(stop, self.num_rows)
        if start >= stop:
            return self._read_group(0, columns).slice(0, 0)
        first = int(np.searchsorted(self._first_row, start, side="right")) - 1
        last = int(np.searchsorted(self._first_row, stop - 1, side="right")) - 1
        parts = []
        for i in range(first, last + 1):
            lo, hi = int(self._first_row[i]), int(self._first_row[i + 1])
            table = self._read_group(i, columns)
            parts.append(table.slice(max(start, lo) - lo, min(stop, hi) - max(start, lo)))
        return pa.concat_tables(parts)

    def read_positions(self, positions: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        """Rows at sorted, unique ``positions``, reading only the row groups that hold them."""
        columns = columns or _COLUMNS
        groups = np.searchsorted(self._first_row, positions, side="right") - 1
        parts = []
        for i in np.unique(groups).tolist():
            local = positions[groups == i] - self._first_row[i]
            parts.append(self._read_group(i, columns).take(pa.array(local)))
        return pa.concat_tables(parts) if parts else self.read_rows(0, 0, columns)

    # -- documents of a range of sequences -------------------------------------------------------------

    def documents(self, first_sequence: int, end_sequence: int) -> StepDocuments:
        """The documents with tokens in sequences ``[first_sequence, end_sequence)``, in plan order."""
        if self.layout.packing == "document":
            table = self.read_rows(first_sequence, end_sequence)
            if self.layout.tokens == "cost":  # each sample's whole cost is in its one sequence
                costs = table.column("tokens").to_numpy(zero_copy_only=False).astype(np.int64)
                return _result(first_sequence, end_sequence, table, costs, with_tokens=True)
            return _result(first_sequence, end_sequence, table, None, with_tokens=False)
        if self.layout.packing == "best_fit":
            return self._best_fit(first_sequence, end_sequence)
        length = self.layout.max_length
        assert length is not None
        start, end = sequence_tokens(first_sequence, end_sequence, length)
        if self.layout.offsets == "column":
            r0 = self._row_at_token(start)
            r1 = self._row_at_token(end - 1)
            table = self.read_rows(r0, r1 + 1)
            offsets = table.column("token_offset").to_numpy().astype(np.int64)
        else:
            r0, r1, offsets = self._cumulative(start, end)
            table = self.read_rows(r0, r1)
        tokens = table.column("tokens").to_numpy().astype(np.int64)
        inside = tokens_inside(offsets, tokens, start, end)
        keep = (tokens > 0) & (inside > 0)
        return _result(first_sequence, end_sequence, table.filter(pa.array(keep)), inside[keep], with_tokens=True)

    def _row_at_token(self, token: int) -> int:
        """Row of the last document whose ``token_offset`` ≤ ``token`` (0 if none)."""
        i = self._row_groups.last_at_most("token_offset", token)
        offsets = self._read_group(i, ["token_offset"]).column(0).to_numpy()
        local = max(0, int(np.searchsorted(offsets, token, side="right")) - 1)
        return int(self._first_row[i]) + local

    def _cumulative(self, start: int, end: int) -> tuple[int, int, np.ndarray]:
        """Rows ``[r0, r1)`` overlapping stream tokens ``[start, end)`` and their running-sum offsets.

        Reads the ``tokens`` column of row groups in order until the running sum passes ``end``.
        """
        base = 0
        r0: int | None = None
        pieces: list[np.ndarray] = []
        for i in range(self._row_groups.count):
            tokens = self._read_group(i, ["tokens"]).column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            if len(tokens) == 0:
                continue
            ends = base + np.cumsum(tokens)
            if r0 is None:
                if ends[-1] <= start:
                    base = int(ends[-1])
                    continue
                local = int(np.searchsorted(ends, start, side="right"))  # first document ending after start
                r0 = int(self._first_row[i]) + local
                pieces.append((ends - tokens)[local:])
            else:
                pieces.append(ends - tokens)
            base = int(ends[-1])
            if base >= end:
                break
        if r0 is None:
            return 0, 0, np.zeros(0, dtype=np.int64)
        offsets = np.concatenate(pieces)
        count = int(np.searchsorted(offsets, end, side="left"))
        return r0, r0 + count, offsets[:count]

    def _best_fit(self, first_sequence: int, end_sequence: int) -> StepDocuments:
        assert self._bins is not None
        meta = self._bins.metadata
        col = self._bins.schema_arrow.get_field_index("sequence")
        parts = []
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            if stats is not None and stats.has_min_max and (stats.max < first_sequence or stats.min >= end_sequence):
                continue
            assert self._bins_file is not None
            table = self._bins_file.read_row_group(self._bins, g, ["sequence", "position", "length"])
            seq = table.column("sequence").to_numpy()
            parts.append(table.filter(pa.array((seq >= first_sequence) & (seq < end_sequence))))
        pieces = pa.concat_tables(parts) if parts else None
        if pieces is None or pieces.num_rows == 0:
            return _result(first_sequence, end_sequence, self.read_rows(0, 0), np.zeros(0, np.int64), with_tokens=True)
        position = pieces.column("position").to_numpy()
        length = pieces.column("length").to_numpy().astype(np.int64)
        unique, inverse = np.unique(position, return_inverse=True)
        inside = np.bincount(inverse, weights=length).astype(np.int64)
        sequence = np.full(len(unique), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(sequence, inverse, pieces.column("sequence").to_numpy().astype(np.int64))
        found = _result(first_sequence, end_sequence, self.read_positions(unique), inside, with_tokens=True)
        return replace(found, sequence=sequence)


def _result(first: int, end: int, table: pa.Table, inside: np.ndarray | None, *, with_tokens: bool) -> StepDocuments:
    def col(name: str) -> np.ndarray:
        return table.column(name).to_numpy(zero_copy_only=False)

    tokens = col("tokens").astype(np.int64) if with_tokens else None
    return StepDocuments(
        first_sequence=first,
        end_sequence=end,
        position=col("position").astype(np.int64),
        dataset_id=col("dataset_id").astype(np.int64),
        shard_id=col("shard_id").astype(np.int64),
        row=col("row").astype(np.int64),
        epoch=col("epoch").astype(np.int64),
        tokens=tokens,
        tokens_in_range=inside if with_tokens else None,
    )
