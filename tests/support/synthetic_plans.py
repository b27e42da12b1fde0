"""Plan bundles synthesized directly with pyarrow: millions of documents in a second, over tiny shards.

Used by tests/inspection/test_inspect.py and benchmarks/bench_show.py. The bundle is an exact wrap plan (the current format version)
over three datasets whose shards hold a few rows each; document ``p`` is dataset ``p % 3``, shard
``p % 3``, row ``(p // 3) % ROWS`` and has ``token_pattern(p)`` tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.plan.format import FORMAT_VERSION, SAMPLES_ROW_GROUP, SAMPLES_SCHEMA, SHARDS_SCHEMA
from zephon.plan.integrity import config_digest
from zephon.planner.build import seal_bundle

NAMES = ("alpha", "beta", "gamma")
ROWS = 10


def token_pattern(position: np.ndarray) -> np.ndarray:
    """Tokens of the documents at ``position``: 1..300, varying with the position."""
    return (1 + (position * 7919) % 300).astype(np.int32)


def shard_text(dataset: int, row: int) -> str:
    return f"{NAMES[dataset]} row {row}\nsecond line of {NAMES[dataset]} document {row}, padded " + "x" * 40


def write_synthetic_plan(
    root: Path,
    documents: int,
    *,
    max_length: int = 257,
    tokens: list[int] | None = None,
    kind: str = "exact",
) -> Path:
    """Write ``root/data/*.parquet`` shards and the bundle ``root/plan``; return the bundle directory.

    ``tokens`` overrides ``token_pattern`` (then ``documents`` must be its length). ``kind="estimated"`` writes
    an estimated token plan: no ``token_offset`` column values, no packing (``max_length`` is then unused).
    """
    exact = kind == "exact"
    data, plan = root / "data", root / "plan"
    data.mkdir(parents=True, exist_ok=True)
    plan.mkdir(parents=True, exist_ok=True)
    shard_rows = []
    for d, name in enumerate(NAMES):
        path = data / f"{name}.parquet"
        pq.write_table(pa.table({"text": [shard_text(d, r) for r in range(ROWS)]}), path)
        shard_rows.append(
            {
                "shard_id": d,
                "dataset_id": d,
                "dataset": name,
                "uri": str(path),
                "format": "parquet",
                "rows": ROWS,
                "bytes": path.stat().st_size,
                "row_groups": 1,
                "fingerprint": f"pqfooter:{name}",
            }
        )
    pq.write_table(pa.Table.from_pylist(shard_rows, schema=SHARDS_SCHEMA), plan / "shards.parquet")

    position = np.arange(documents, dtype=np.int64)
    dataset = (position % 3).astype(np.int16)
    tokens = token_pattern(position) if tokens is None else np.asarray(tokens, dtype=np.int32)
    offsets = np.zeros(documents, dtype=np.int64)
    np.cumsum(tokens[:-1], out=offsets[1:])
    table = pa.Table.from_arrays(
        [
            pa.array(position),
            pa.array(dataset),
            pa.array(dataset.astype(np.int32)),
            pa.array(((position // 3) % ROWS).astype(np.int32)),
            pa.array(np.zeros(documents, dtype=np.int32)),
            pa.array(tokens),
            pa.array(offsets) if exact else pa.nulls(documents, pa.int64()),
            pa.nulls(documents, pa.int64()) if exact else pa.array((offsets + (tokens + 1) // 2) // 4096),
        ],
        schema=SAMPLES_SCHEMA,
    )
    pq.write_table(table, plan / "samples.parquet", row_group_size=SAMPLES_ROW_GROUP, compression="snappy")

    total = int(offsets[-1] + tokens[-1]) if documents else 0
    per_dataset = [int(tokens[d::3].astype(np.int64).sum()) for d in range(3)]
    config = {"seed": 0, "mixture": {"unit": "tokens", "weights": {n: "1/3" for n in NAMES}}}
    manifest = {
        "format_version": FORMAT_VERSION,
        "zephon_version": "0.1.0",
        "config_hash": config_digest(config),
        "config": config,
        "seed": 0,
        "kind": kind,
        "datasets": [
            {
                "id": d,
                "name": name,
                "path": str(data / f"{name}.parquet"),
                "pinned": str(data / f"{name}.parquet"),
                "format": "parquet",
                "fingerprint": name,
                "shards": 1,
                "first_shard_id": d,
                "rows": ROWS,
                "weight": 1 / 3,
                "planned_documents": len(range(d, documents, 3)),
                "planned_tokens": per_dataset[d],
                "planned_token_share": per_dataset[d] / total if total else 0.0,
            }
            for d, name in enumerate(NAMES)
        ],
        "mixture": {"unit": "tokens", "weights": {n: 1 / 3 for n in NAMES}},
        "tokenizer": {"id": "synthetic", "fingerprint": "synthetic", "field": "text"},
        "packing": {"algorithm": "wrap", "max_length": max_length, "sequences": -(-total // max_length)}
        if exact
        else None,
        "files": {"samples": ["samples.parquet"], "shards": "shards.parquet"},
        "totals": {"documents": documents, "shards": 3, "tokens": total, "tokens_are": kind},
    }
    (plan / "plan.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    seal_bundle(plan)  # the integrity record the planner writes (zephon.planner.build)
    return plan
