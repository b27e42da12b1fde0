"""Tokens per document for token-share mixtures: measured ratios, pinned ratios, a token-count column.

``TokenEstimation(primer="measure")`` calibrates one tokens-per-byte ratio per dataset:

1. from ``SeedSequence([seed, dataset_index, CALIBRATION_STREAM])``, pick up to ``calibration_shards_max``
   shards and, among their rows, up to ``calibration_samples`` documents (without replacement);
2. tokenize them with the pipeline's tokenizer, without the BOS/EOS the executor adds;
3. ratio = Σ tokens / Σ bytes, bytes as in ``zephon.planner.counts.lengths.byte_lengths``.

Every document is then estimated as ``round(ratio × bytes) + specials`` (specials = BOS prefix + EOS).
A float primer pins one ratio for all datasets; a dict pins one per dataset. ``token_count_columns`` names a
Parquet column holding each document's own count (e.g. FineWeb's ``token_count``), used as exact content
counts (+ specials); it is the user's promise that the column was produced with the same tokenizer.

Invariant: an estimate depends only on the plan's seed, the dataset's index, the tokenizer and the shards'
contents (the sample is drawn from a seeded stream; each document's estimate comes from its own bytes or
column value), so planning twice gives the same counts.

Example: a calibration sample of 2,048 documents holding 1,000,000 bytes and 250,000 tokens gives
0.25 tokens/byte; a 4,000-byte document is estimated at 1,000 + 1 (EOS) tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from zephon.checks import is_number
from zephon.errors import ConfigError
from zephon.executor.encode.encoders import TextEncoder
from zephon.executor.encode.text import Encoder
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.read.shard_reader import ShardReader, planning_cache
from zephon.plan.records import ShardRef
from zephon.planner.counts.lengths import byte_lengths, cache_byte_lengths
from zephon.planner.counts.shard_tokens import ShardTokens
from zephon.planner.orders import permutation
from zephon.recipe.work_source import TokenEstimation
from zephon.storage.progress import progress_bar, track

CALIBRATION_STREAM = 0x7A_45_50_48  # distinct from every epoch number a plan uses for shuffling
CALIBRATION_BATCH = 256  # documents encoded per call while calibrating (a progress bar moves between calls)


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetEstimate:
    """One dataset's estimated token counts and how they were obtained."""

    #: Estimated tokens of each row, one int64 array per shard, computed when the shard is read.
    tokens: ShardTokens
    #: plan.json's ``token_estimation`` entry for the dataset: the method (column | pinned | measure), the
    #: ratio or column, the specials added, and the calibration sample when measured.
    provenance: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Ratio:
    """A dataset's tokens-per-byte ratio and its provenance (before ``byte_unit`` and ``specials``)."""

    tokens_per_byte: float
    provenance: dict[str, Any]


def _specials(encoder: Encoder | TextEncoder) -> int:
    return len(encoder.prefix) + len(getattr(encoder, "suffix", (encoder.eos_id,)))  # TextEncoder: its mode's


def _check_column(name: str, ref: ShardRef, column: str) -> None:
    if ref.format != "parquet":
        raise ConfigError(
            f"token_count_columns[{name!r}] must name a Parquet column, got dataset of format {ref.format} — "
            "use exact counts (exact_tokens=True) for JSONL"
        )
    schema = pq.read_schema(ref.uri)
    if column not in schema.names:
        raise ConfigError(
            f"dataset {name!r}: shard {ref.uri} must have the token-count column {column!r}, got columns "
            f"{schema.names} — fix token_count_columns"
        )


def _column_counts(ref: ShardRef, column: str, specials: int) -> np.ndarray:
    values = pq.read_table(ref.uri, columns=[column]).column(0).to_numpy(zero_copy_only=False)
    return values.astype(np.int64) + specials


def estimate_dataset(
    *,
    index: int,
    name: str,
    refs: Sequence[ShardRef],
    field: str,
    encoder: Encoder,
    estimation: TokenEstimation,
    seed: int,
    progress: bool | None = None,
) -> DatasetEstimate:
    """Estimated tokens per row and the provenance for plan.json. Every shard's byte lengths are computed (and
    cached) here, so a bad shard fails the estimate rather than the layout. ``progress``: bars for sizing the
    shards and encoding the calibration sample (``zephon.storage.progress``); they never change the estimate."""
    specials = _specials(encoder)
    names = [f"{ref.uri} (dataset {name!r})" for ref in refs]
    column = (estimation.token_count_columns or {}).get(name)
    if column is not None:
        for ref in refs:
            _check_column(name, ref, column)
        counts = ShardTokens(
            [lambda ref=ref: _column_counts(ref, column, specials) for ref in refs],
            rows=[ref.rows for ref in refs],
            names=names,
        )
        return DatasetEstimate(tokens=counts, provenance={"method": "column", "column": column, "specials": specials})
    for ref in track(refs, total=len(refs), desc=f"sizing documents of {name}", unit="shard", progress=progress):
        cache_byte_lengths(ref, field)
    primer = estimation.primer
    if is_number(primer):
        found = _Ratio(tokens_per_byte=float(primer), provenance={"method": "pinned", "tokens_per_byte": float(primer)})
    elif isinstance(primer, dict):
        if name not in primer:
            raise ConfigError(
                f"TokenEstimation.primer must give a ratio for every dataset, got none for {name!r} — add it"
            )
        pinned = float(primer[name])
        found = _Ratio(tokens_per_byte=pinned, provenance={"method": "pinned", "tokens_per_byte": pinned})
    else:
        found = _measure(index, name, refs, field, encoder, estimation, seed, progress)
    ratio, provenance = found.tokens_per_byte, found.provenance
    provenance["byte_unit"] = "utf8 text" if refs[0].format == "parquet" else "jsonl line"
    provenance["specials"] = specials
    estimates = ShardTokens(
        [lambda ref=ref: np.rint(ratio * byte_lengths(ref, field)).astype(np.int64) + specials for ref in refs],
        rows=[ref.rows for ref in refs],
        names=names,
    )
    return DatasetEstimate(tokens=estimates, provenance=provenance)


def _measure(
    index: int,
    name: str,
    refs: Sequence[ShardRef],
    field: str,
    encoder: Encoder,
    estimation: TokenEstimation,
    seed: int,
    progress: bool | None,
) -> _Ratio:
    """Calibrate the ratio on a sample of the dataset's documents (steps 1–3 of the module docstring)."""
    bits = np.random.PCG64(np.random.SeedSequence([seed, index, CALIBRATION_STREAM]))
    chosen = np.sort(permutation(bits, len(refs))[: estimation.calibration_shards_max])
    rows = np.array([refs[i].rows for i in chosen], dtype=np.int64)
    picks = np.sort(permutation(bits, int(rows.sum()))[: estimation.calibration_samples])
    bounds = np.cumsum(rows)
    shard_pos = np.searchsorted(bounds, picks, side="right")
    local_rows = picks - np.concatenate(([0], bounds[:-1]))[shard_pos]
    shard_ids = np.array([refs[chosen[p]].shard_id for p in shard_pos], dtype=np.int64)
    reader = ShardReader(list(refs), field, capacity=len(chosen), cache=planning_cache())
    try:
        texts = reader.texts(shard_ids, local_rows)
    finally:  # the chosen shards' decoded row groups: freed (and handed back) before the next dataset's
        reader.close()
    specials = _specials(encoder)
    tokens = 0
    # Encoded CALIBRATION_BATCH documents at a time, whether or not a bar is shown: the sum is the same.
    with progress_bar(total=len(texts), desc=f"calibrating {name}", unit="doc", progress=progress) as bar:
        for start in range(0, len(texts), CALIBRATION_BATCH):
            batch = texts[start : start + CALIBRATION_BATCH]
            try:
                tokens += int((encoder.lengths(batch) - specials).sum())
            except AtDocument as exc:  # the spot check or a lone surrogate: name the document
                i = start + exc.index
                raise exc.located(reader.ref(int(shard_ids[i])), int(local_rows[i])) from None
            bar.update(len(batch))
    lengths = {int(i): byte_lengths(refs[int(i)], field) for i in chosen}  # the calibration shards only
    picked = zip(chosen[shard_pos].tolist(), local_rows.tolist(), strict=True)
    nbytes = int(sum(int(lengths[shard][row]) for shard, row in picked))
    if nbytes == 0:
        raise ConfigError(f"dataset {name!r} calibration sample must hold text, got 0 bytes — check field {field!r}")
    ratio = tokens / nbytes
    calibration = {"documents": len(texts), "shards": [refs[i].uri for i in chosen], "tokens": tokens, "bytes": nbytes}
    return _Ratio(
        tokens_per_byte=ratio,
        provenance={"method": "measure", "tokens_per_byte": ratio, "calibration": calibration},
    )
