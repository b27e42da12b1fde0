"""Turning a ``StaticMixtureWorkSource`` into a plan bundle (see ``zephon.plan_format``).

Steps: scan shard metadata → normalize the config and hash it → interleave datasets
(``zephon.planner.interleave``) → lay out each dataset's epochs (``zephon.planner.orders``) → write
``samples.parquet`` and ``shards.parquet`` with Polars and ``plan.json``, into a temporary directory that is
renamed into place, so a reader never sees a half-written bundle.

Budget rules: ``num_documents`` plans exactly that many positions; ``epochs=E`` (default 1) plans up to the
position where the last dataset completes its E-th pass. With ``on_exhaustion="stop"`` the plan also ends
just before any dataset would start a pass beyond E (1 when only ``num_documents`` is given).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from zephon.planner.interleave import exact_weights, interleave
from zephon.planner.orders import epoch_order

from zephon.errors import ConfigError, DatasetError
from zephon.plan_format import (
    FORMAT_VERSION,
    PLAN_JSON,
    SAMPLES_FILE,
    SAMPLES_ROW_GROUP,
    SHARDS_FILE,
)
from zephon.shard_scan import ShardInfo
from zephon.work import StaticMixtureWorkSource


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedPlan:
    """Everything the plan depends on, scanned and normalized; ``config_hash`` names the plan."""

    source: StaticMixtureWorkSource
    shards: tuple[tuple[ShardInfo, ...], ...]
    config: dict[str, Any]
    config_hash: str


def _zephon_version() -> str:
    try:
        return version("zephon")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "0+unknown"


def prepare(source: StaticMixtureWorkSource) -> PreparedPlan:
    """Scan the datasets and build the normalized config whose hash identifies the plan."""
    if source.token_estimation is not None:
        raise ConfigError(
            "token_estimation (mixing by token shares) must be None in this build, got "
            f"{source.token_estimation!r} — omit it to mix by samples"
        )
    shards = tuple(ds.shards() for ds in source.datasets)
    fracs = exact_weights([float(source.mixture.weights[ds.name]) for ds in source.datasets])
    datasets = []
    for ds, infos in zip(source.datasets, shards, strict=True):
        rows = sum(s.rows for s in infos)
        if rows == 0:
            raise DatasetError(
                f"dataset {ds.name!r} must have at least one row, got 0 rows in {len(infos)} shard(s) at "
                f"{ds.path!r} — fix the path or remove the dataset"
            )
        digest = hashlib.sha256("\n".join(f"{s.uri}\t{s.fingerprint}" for s in infos).encode()).hexdigest()
        datasets.append({"name": ds.name, "path": ds.path, "shards": len(infos), "rows": rows, "fingerprint": digest})
    epochs = source.epochs if source.epochs is not None else (None if source.num_documents else 1)
    config = {
        "format_version": FORMAT_VERSION,
        "seed": source.seed,
        "datasets": datasets,
        "mixture": {
            "unit": "samples",
            "weights": {ds.name: str(f) for ds, f in zip(source.datasets, fracs, strict=True)},
        },
        "budget": {"num_documents": source.num_documents, "epochs": epochs},
        "on_exhaustion": source.on_exhaustion,
        "shuffle": {"enabled": source.shuffle.enabled, "window_shards": source.shuffle.window_shards},
    }
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return PreparedPlan(
        source=source,
        shards=shards,
        config=config,
        config_hash=hashlib.sha256(canonical.encode()).hexdigest(),
    )


def _plan_length(choice_len_bound: int, weights: list[float], rows: list[int], source: StaticMixtureWorkSource):
    """Return the dataset choice per position and the plan length, per the budget rules above."""
    choice = interleave(weights, choice_len_bound)
    passes = source.epochs or 1
    length = source.num_documents if source.num_documents is not None else 0
    for i, r in enumerate(rows):
        positions = np.flatnonzero(choice == i)
        if source.num_documents is None:
            # Position at which dataset i completes its last required pass.
            length = max(length, int(positions[passes * r - 1]) + 1)
        if source.on_exhaustion == "stop" and len(positions) > passes * r:
            length = min(length, int(positions[passes * r]))
    return choice[:length], length


def build_samples(prepared: PreparedPlan) -> pl.DataFrame:
    """The samples table in global order (columns of ``SAMPLES_SCHEMA``)."""
    source = prepared.source
    rows = [sum(s.rows for s in infos) for infos in prepared.shards]
    weights = [float(source.mixture.weights[ds.name]) for ds in source.datasets]
    fr = [float(f) for f in exact_weights(weights)]
    passes = source.epochs or 1
    if source.num_documents is not None and source.on_exhaustion == "new_epoch":
        bound = source.num_documents
    else:
        # Enough positions for every dataset to complete `passes` passes (|c_i(n) - w_i n| < 1).
        bound = max(math.ceil((passes * r + 1) / w) + 1 for r, w in zip(rows, fr, strict=True))
        if source.num_documents is not None:
            bound = min(bound, source.num_documents)
    choice, length = _plan_length(bound, weights, rows, source)

    shard_col = np.empty(length, np.int32)
    row_col = np.empty(length, np.int32)
    epoch_col = np.empty(length, np.int32)
    first_id = 0
    for index, infos in enumerate(prepared.shards):
        ids = np.arange(first_id, first_id + len(infos), dtype=np.int32)
        first_id += len(infos)
        counts = np.array([s.rows for s in infos], dtype=np.int64)
        positions = np.flatnonzero(choice == index)
        total = int(counts.sum())
        n_epochs = -(-len(positions) // total)
        parts = [
            epoch_order(
                ids,
                counts,
                seed=source.seed,
                dataset_index=index,
                epoch=e,
                shuffle=source.shuffle.enabled,
                window_shards=source.shuffle.window_shards,
            )
            for e in range(n_epochs)
        ]
        if parts:
            shard_col[positions] = np.concatenate([p[0] for p in parts])[: len(positions)]
            row_col[positions] = np.concatenate([p[1] for p in parts])[: len(positions)]
        epoch_col[positions] = (np.arange(len(positions)) // total).astype(np.int32)
    return pl.DataFrame(
        {
            "position": pl.Series(np.arange(length, dtype=np.int64)),
            "dataset_id": pl.Series(choice.astype(np.int16)),
            "shard_id": pl.Series(shard_col),
            "row": pl.Series(row_col),
            "epoch": pl.Series(epoch_col),
            "tokens": pl.Series([None] * length, dtype=pl.Int32),
            "token_offset": pl.Series([None] * length, dtype=pl.Int64),
        }
    )


def build_shards(prepared: PreparedPlan) -> pl.DataFrame:
    records = []
    for index, (ds, infos) in enumerate(zip(prepared.source.datasets, prepared.shards, strict=True)):
        for info in infos:
            if info.rows > np.iinfo(np.int32).max:
                raise DatasetError(
                    f"dataset {ds.name!r}: shard {info.uri} must have < 2^31 rows, got {info.rows} — split it"
                )
            records.append((index, ds.name, info))
    return pl.DataFrame(
        {
            "shard_id": pl.Series(range(len(records)), dtype=pl.Int32),
            "dataset_id": pl.Series([r[0] for r in records], dtype=pl.Int16),
            "dataset": pl.Series([r[1] for r in records], dtype=pl.String),
            "uri": pl.Series([r[2].uri for r in records], dtype=pl.String),
            "format": pl.Series([r[2].format for r in records], dtype=pl.String),
            "rows": pl.Series([r[2].rows for r in records], dtype=pl.Int64),
            "bytes": pl.Series([r[2].bytes for r in records], dtype=pl.Int64),
            "row_groups": pl.Series([r[2].row_groups for r in records], dtype=pl.Int32),
            "fingerprint": pl.Series([r[2].fingerprint for r in records], dtype=pl.String),
        }
    )


def manifest(prepared: PreparedPlan, samples: pl.DataFrame) -> dict[str, Any]:
    source = prepared.source
    per_dataset = samples.group_by("dataset_id").agg(
        pl.len().alias("documents"), (pl.col("epoch").max() + 1).alias("epochs")
    )
    stats = {int(r["dataset_id"]): r for r in per_dataset.iter_rows(named=True)}
    fracs = exact_weights([float(source.mixture.weights[ds.name]) for ds in source.datasets])
    datasets = []
    first_shard = 0
    for index, (ds, info) in enumerate(zip(source.datasets, prepared.config["datasets"], strict=True)):
        docs = int(stats[index]["documents"]) if index in stats else 0
        datasets.append(
            {
                "id": index,
                "name": ds.name,
                "path": ds.path,
                "pinned": ds.path,
                "format": ds.files[0].format if ds.files else None,
                "fingerprint": info["fingerprint"],
                "shards": info["shards"],
                "first_shard_id": first_shard,
                "rows": info["rows"],
                "weight": float(fracs[index]),
                "planned_documents": docs,
                "epochs_started": int(stats[index]["epochs"]) if index in stats else 0,
                "passes_completed": docs // info["rows"],
            }
        )
        first_shard += info["shards"]
    return {
        "format_version": FORMAT_VERSION,
        "zephon_version": _zephon_version(),
        "config_hash": prepared.config_hash,
        "config": prepared.config,
        "seed": source.seed,
        "datasets": datasets,
        "mixture": {"unit": "samples", "weights": {d["name"]: d["weight"] for d in datasets}},
        "token_estimation": None,
        "tokenizer": None,
        "packing": None,
        "shuffle": prepared.config["shuffle"],
        "budget": prepared.config["budget"],
        "on_exhaustion": source.on_exhaustion,
        "files": {"samples": [SAMPLES_FILE], "shards": SHARDS_FILE},
        "totals": {"documents": samples.height, "shards": first_shard},
    }


def write_bundle(prepared: PreparedPlan, out_dir: Path, *, overwrite: bool = False) -> Path:
    """Write the bundle atomically: a temporary sibling directory renamed to ``out_dir``."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ConfigError(
            f"plan output directory must be new or empty, got existing {out_dir} — choose another path "
            "or pass overwrite=True (--overwrite)"
        )
    samples = build_samples(prepared)
    shards = build_shards(prepared)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        samples.write_parquet(tmp / SAMPLES_FILE, compression="zstd", statistics=True, row_group_size=SAMPLES_ROW_GROUP)
        shards.write_parquet(tmp / SHARDS_FILE, compression="zstd", statistics=True)
        text = json.dumps(manifest(prepared, samples), indent=2) + "\n"
        (tmp / PLAN_JSON).write_text(text, encoding="utf-8")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def write_plan(source: StaticMixtureWorkSource, out_dir: Path, *, overwrite: bool = False) -> Path:
    """Plan ``source`` and write the bundle to ``out_dir``."""
    return write_bundle(prepare(source), out_dir, overwrite=overwrite)
