"""Plans pinned by hash: the same inputs give the same plan across refactors of the code that writes it.

Each plan kind is written from fixed tiny datasets; the test hashes ``plan.json`` and the *content* of every
Parquet file (column by column, in row order), with the temporary directory replaced by a placeholder. The
content hash, not the file bytes, is pinned so that a pyarrow upgrade that changes only the writer's
``created_by`` string does not fail here; byte-identical files for identical inputs are asserted in
test_planner.py. A change to these hashes is a change to the plans users get: it needs a format decision,
not an update of the literals.

History: format 2 (layout 3) replaced estimated plans' ``lane`` (int16, a lane among 8) by ``deal`` (int64),
so a run packs one lane per row of its global batch and runs at any dp size dividing it (issue 18). Every
plan.json changed (``format_version``, ``lanes`` null); every samples.parquet changed its schema, and the
estimated plans' deal values; the exact plans' rows are the same.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl_dataset, write_parquet_dataset

from zephon.io import Dataset
from zephon.plan.bundle import open_bundle
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource, TokenEstimation

PINS = {
    "exact_best_fit": {
        "bins.parquet": "e245c70200cde561",
        "plan.json": "4bb52d5221a5a8bf",
        "samples.parquet": "d31c3fae7bc1070f",
        "shards.parquet": "7605c3f8c7f18707",
    },
    "exact_wrap": {
        "plan.json": "ae736b407ab8b1d5",
        "samples.parquet": "f6dcb6530b17f401",
        "shards.parquet": "7605c3f8c7f18707",
    },
    "phases": {
        "plan.json": "2cb8fe99e0902411",
        "samples.parquet": "12148d1503f1bd9b",
        "shards.parquet": "7605c3f8c7f18707",
    },
    "samples": {
        "plan.json": "361f4363eafc37f0",
        "samples.parquet": "6366ddbedd9f1a1d",
        "shards.parquet": "7605c3f8c7f18707",
    },
    "tokens": {
        "plan.json": "6faeb0b2012c6b33",
        "samples.parquet": "1a7e133a7785c181",
        "shards.parquet": "7605c3f8c7f18707",
    },
}


def _bundle_digest(plan: Path, root: Path, tokenizer: str) -> dict[str, str]:
    out = {}
    for path in sorted(plan.iterdir()):
        if path.suffix == ".json":
            # config_hash hashes the normalized config, whose paths name the temporary directory; the
            # config itself is pinned (with the placeholder).
            manifest = json.loads(path.read_text(encoding="utf-8"))
            manifest.pop("config_hash")
            # A dataset's fingerprint hashes its shards' URIs (the temporary directory) with their
            # fingerprints; those are pinned through shards.parquet.
            for entry in (*manifest["datasets"], *manifest["config"]["datasets"]):
                entry.pop("fingerprint")
            # The integrity record digests the rest of plan.json (paths included) and the Parquet footers
            # (which name their writer's version): its shape is pinned; open_bundle checks its digests.
            integrity = manifest.pop("integrity")
            manifest["integrity"] = {
                "plan_json": sorted(integrity["plan_json"]),
                "files": {name: sorted(entry) for name, entry in integrity["files"].items()},
            }
            # The tokenizer is named by its path, which is wherever the checkout is.
            text = json.dumps(manifest, sort_keys=True).replace(str(root), "<root>").replace(tokenizer, "<tokenizer>")
            out[path.name] = hashlib.sha256(text.encode()).hexdigest()[:16]
        elif path.suffix == ".parquet":
            table = pq.read_table(path)
            h = hashlib.sha256(str(table.schema).encode())
            for name in table.column_names:
                for value in table.column(name).to_pylist():
                    h.update(repr(value).replace(str(root), "<root>").encode())
            out[path.name] = h.hexdigest()[:16]
    return out


def _source(root: Path, **kw) -> StaticMixtureWorkSource:
    web = write_parquet_dataset(root, "web", [13, 9, 11])
    books = write_jsonl_dataset(root, "books", [7, 12])
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web)), Dataset.from_path("books", str(books))],
        mixture=MixtureSpec({"web": 0.6, "books": 0.4}),
        seed=7,
        **kw,
    )


KINDS = {
    "samples": ({}, None),
    "tokens": ({"token_estimation": TokenEstimation(primer="measure", calibration_samples=16)}, None),
    "exact_wrap": ({"token_estimation": TokenEstimation(primer="measure"), "exact_tokens": True, "epochs": 2}, "wrap"),
    "exact_best_fit": ({"token_estimation": TokenEstimation(primer="measure"), "exact_tokens": True}, "best_fit"),
    "phases": (
        {"num_documents": 60, "phases": [Phase(start=0.5, mixture=MixtureSpec({"web": 0.2, "books": 0.8}))]},
        None,
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_plan_hashes_are_pinned(kind: str, tmp_path: Path, tokenizer_dir: str) -> None:
    kw, algorithm = KINDS[kind]
    source = _source(tmp_path, **kw)
    pack = PackSpec(max_length=33, algorithm=algorithm) if algorithm else None
    plan = source.plan(tmp_path / "plan", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=pack)
    assert open_bundle(plan).sealed  # the record matches what was written
    got = _bundle_digest(plan, tmp_path, tokenizer_dir)
    print(kind, json.dumps(got))
    assert got == PINS[kind]
