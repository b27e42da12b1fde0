"""Selections by metadata on token stores that have metadata (issue #27 item 3): Parquet/JSONL token columns.

The plan reads exactly the selected documents, and the run yields the store's own ids of those rows, token for
token; stores of ids only (Megatron, ...) refuse a selection in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_token_store_plans import write_megatron

from zephon import Pipeline
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

#: Two Parquet files of a token store: ids, a score, a url (a duplicate across files) and an id for a sidecar.
PARTS = {
    "a.parquet": {
        "input_ids": [[5, 6, 7, 0], [8, 0], [9, 10, 11, 12, 0], [13, 14, 0]],
        "score": [1, 5, 3, 4],
        "url": ["u1", "u2", "u3", "u4"],
        "doc": ["a0", "a1", "a2", "a3"],
    },
    "b.parquet": {
        "input_ids": [[20, 21, 0], [22, 0], [23, 24, 25, 0]],
        "score": [4, 2, 6],
        "url": ["u2", "u5", "u6"],
        "doc": ["b0", "b1", "b2"],
    },
}
LENGTH = 6


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "tok"
    root.mkdir()
    for name, columns in PARTS.items():
        table = pa.table(columns | {"input_ids": pa.array(columns["input_ids"], pa.list_(pa.int32()))})
        pq.write_table(table, root / name, row_group_size=2)
    return root


def _ids(shard: int, row: int) -> list[int]:
    return list(PARTS[sorted(PARTS)[shard]]["input_ids"][row])


def _source(ds: Dataset, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({ds.name: 1.0}), seed=4, **kw)


def _exact(ds: Dataset, out: Path, tokenizer_dir: str) -> Path:
    return _source(ds, exact_tokens=True).plan(
        out, tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=LENGTH)
    )


def _read(plan: Path) -> list[tuple[int, int]]:
    """The plan's documents as (shard of the dataset, row), in sample order."""
    return [(s["shard_id"], s["row"]) for s in pq.read_table(plan / "samples.parquet").to_pylist()]


def _run(plan: Path, tokenizer_dir: str) -> list[int]:
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=LENGTH)
    return [t for b in pipe.batch(microbatch_size=2) for row, n in zip(b.tokens, b.lengths, strict=True)
            for t in row[:n].tolist()]  # fmt: skip


def test_a_where_on_a_parquet_token_store_plans_and_runs_exactly_the_selected_ids(store, tmp_path, tokenizer_dir):
    ds = Dataset.from_path("tok", store, fmt="parquet", tokens_field="input_ids", where="score >= 3")
    plan = _exact(ds, tmp_path / "p", tokenizer_dir)
    read = _read(plan)
    assert sorted(read) == [(0, 1), (0, 2), (0, 3), (1, 0), (1, 2)]
    samples = pq.read_table(plan / "samples.parquet").to_pylist()
    assert [s["tokens"] for s in samples] == [len(_ids(*d)) for d in read]
    assert _run(plan, tokenizer_dir) == [t for d in read for t in _ids(*d)]
    (entry,) = json.loads((plan / "plan.json").read_text())["datasets"]
    assert entry["token_store"]["fmt"] == "parquet"
    assert entry["selection"]["where"] == "score >= 3"
    assert (entry["selection"]["rows"], entry["selection"]["selected"], entry["selection"]["skipped_by_where"]) == (
        7,
        5,
        2,
    )


def test_an_estimated_plan_of_a_selected_store_reads_the_same_documents(store, tmp_path, tokenizer_dir):
    ds = Dataset.from_path("tok", store, fmt="parquet", tokens_field="input_ids", where="score >= 3")
    plan = _source(ds, num_tokens=14, token_estimation=TokenEstimation(calibration_samples=8)).plan(
        tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir)
    )
    read = _read(plan)
    assert set(read) <= {(0, 1), (0, 2), (0, 3), (1, 0), (1, 2)} and read
    samples = pq.read_table(plan / "samples.parquet").to_pylist()
    assert [s["tokens"] for s in samples] == [len(_ids(*d)) for d in read]  # exact counts, from the store
    stream = [t for d in read for t in _ids(*d)]
    got = _run(plan, tokenizer_dir)
    assert got == stream[: len(got)] and len(got) >= len(stream) - LENGTH


def test_order_by_and_dedup_on_select_and_order_store_documents(store, tmp_path, tokenizer_dir):
    ds = Dataset.from_path(
        "tok", store, fmt="parquet", tokens_field="input_ids", order_by="score DESC", order_window=1, dedup_on="url"
    )
    plan = _exact(ds, tmp_path / "p", tokenizer_dir)
    read = _read(plan)
    # url u2 is held by a1 (score 5) and b0 (score 4): one of them is kept (seeded draw), the rest once each
    kept = {(0, 1), (1, 0)} & set(read)
    assert len(kept) == 1 and len(read) == 6
    scores = [PARTS[sorted(PARTS)[s]]["score"][r] for s, r in read]
    assert scores == sorted(scores, reverse=True)
    assert _run(plan, tokenizer_dir) == [t for d in read for t in _ids(*d)]


def test_a_sidecar_joined_on_a_store_column_selects_its_documents(store, tmp_path, tokenizer_dir):
    sidecar = tmp_path / "meta.parquet"
    pq.write_table(pa.table({"doc": ["a0", "a2", "b1", "zz"], "keep": [True, True, True, True]}), sidecar)
    ds = Dataset.from_path(
        "tok", store, fmt="parquet", tokens_field="input_ids", metadata=sidecar, key="doc", where="keep"
    )
    plan = _exact(ds, tmp_path / "p", tokenizer_dir)
    read = _read(plan)
    assert sorted(read) == [(0, 0), (0, 2), (1, 1)]
    assert _run(plan, tokenizer_dir) == [t for d in read for t in _ids(*d)]
    (entry,) = json.loads((plan / "plan.json").read_text())["datasets"]
    assert entry["selection"]["sidecar"]["metadata_without_document"] == 1


def test_a_where_on_a_jsonl_token_store_selects_by_its_fields(tmp_path, tokenizer_dir):
    root = tmp_path / "tok"
    root.mkdir()
    docs = [[5, 6, 0], [7, 0], [8, 9, 10, 0]]
    lines = [json.dumps({"tokens": d, "lang": lang}) for d, lang in zip(docs, ["en", "de", "en"], strict=True)]
    (root / "a.jsonl").write_text("\n".join(lines) + "\n")
    ds = Dataset.from_path("tok", root, fmt="jsonl", tokens_field="tokens", where="lang = 'en'")
    plan = _exact(ds, tmp_path / "p", tokenizer_dir)
    read = _read(plan)
    assert sorted(read) == [(0, 0), (0, 2)]
    assert _run(plan, tokenizer_dir) == [t for _, r in read for t in docs[r]]


def test_a_store_of_ids_only_refuses_a_selection_in_one_line(tmp_path, tokenizer_dir):
    (tmp_path / "store").mkdir()
    prefix = write_megatron(tmp_path / "store" / "web", [[5, 0], [6, 7, 0]])
    ds = Dataset.from_path("web", prefix, where="x > 1")
    assert ds.selection is not None
    with pytest.raises(ConfigError, match=r"^dataset 'web': a selection by metadata .* got a megatron token store, "
                       r"which holds only token ids — select the documents before writing the store"):  # fmt: skip
        _exact(ds, tmp_path / "p", tokenizer_dir)  # detected as megatron when planned
    for fmt in ("megatron", "olmo", "datatrove", "litdata", "mds"):  # named: refused at once
        with pytest.raises(ConfigError, match=rf"^dataset 'web': a selection by metadata .* got a {fmt} token store"):
            Dataset.from_path("web", prefix, fmt=fmt, order_by="x")


def test_materialize_selections_refuses_a_token_store_in_one_line(store, tmp_path, tokenizer_dir):
    ds = Dataset.from_path("tok", store, fmt="parquet", tokens_field="input_ids", where="score >= 3")
    with pytest.raises(ConfigError, match=r"^materialize_selections copies raw text shards, got dataset 'tok', a "
                       r"parquet token store"):  # fmt: skip
        _source(ds, exact_tokens=True).plan(
            tmp_path / "p",
            tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir),
            pack=PackSpec(max_length=LENGTH),
            materialize_selections=True,
        )


@pytest.mark.parametrize("sidecar", [False, True])
def test_a_selected_store_on_s3_plans_and_runs_as_its_local_copy(s3, store, tmp_path, tokenizer_dir, sidecar):
    kw = {"where": "score >= 3", "order_by": "score DESC", "order_window": 1}
    if sidecar:
        pq.write_table(pa.table({"doc": ["a1", "b0", "b2"], "keep": [True, False, True]}), tmp_path / "meta.parquet")
        kw = {"metadata": tmp_path / "meta.parquet", "key": "doc", "where": "keep AND score >= 3"}
    s3.upload_dir(store, "tok/")
    runs = []
    for where, path in (("local", store), ("remote", s3.url("tok/"))):
        ds = Dataset.from_path("tok", path, fmt="parquet", tokens_field="input_ids", **kw)
        plan = _exact(ds, tmp_path / where, tokenizer_dir)
        runs.append((_read(plan), _run(plan, tokenizer_dir)))
    assert runs[0] == runs[1]  # ties (a3, b0: score 4) by (shard, row)
    assert runs[0][0] == ([(0, 1), (1, 2)] if sidecar else [(1, 2), (0, 1), (0, 3), (1, 0), (0, 2)])
