"""A big plan's samples as parts (samples/part-*.parquet): the same rows, read the same by every reader.

Parts are cut every ``SAMPLES_PART_ROWS`` documents (2^27); here the writer's row group and part sizes are made
tiny (8 and 32 documents) so a plan of 200 documents has 7 parts, and everything read from it — the executor's
exact batches and random access, chunks from any start, SQL and ``show_step`` — equals what the one-file plan of
the same rows gives.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_parquet_dataset

from zephon import Pipeline
from zephon.errors import PlanFormatError
from zephon.executor.encode.text import Encoder
from zephon.executor.exact import ExactSequences
from zephon.executor.plan_reader import PlanBundle, RowGroupIndex
from zephon.executor.read.shard_reader import ShardReader
from zephon.inspection.show import show_step
from zephon.inspection.sql import connect
from zephon.io import Dataset
from zephon.plan.bundle import open_bundle
from zephon.plan.format import looks_like_bundle, samples_part
from zephon.plan.row_groups import RowGroups
from zephon.planner import samples_writer
from zephon.planner.build import seal_bundle
from zephon.planner.samples_writer import SamplesWriter
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

DOCUMENTS = 200
GROUP, PART = 8, 32


def _source(root: Path, documents: int = DOCUMENTS) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("a", root / "a"), Dataset.from_path("b", root / "b")],
        mixture=MixtureSpec({"a": 0.6, "b": 0.4}),
        seed=5,
        num_documents=documents,
        exact_tokens=True,
    )


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> tuple[Path, Path]:
    """The same exact wrap plan as one samples.parquet and as parts (row groups of 8 in both)."""
    root = tmp_path_factory.mktemp("parts")
    write_parquet_dataset(root, "a", [30, 25, 40])
    write_parquet_dataset(root, "b", [20, 35])
    tok, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=33)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEPHON_CACHE_DIR", str(root / "cache"))
        mp.setattr(samples_writer, "SAMPLES_ROW_GROUP", GROUP)
        one = _source(root).plan(root / "one", tokenize=tok, pack=pack)
        mp.setattr(samples_writer, "SAMPLES_PART_ROWS", PART)
        parts = _source(root).plan(root / "parts", tokenize=tok, pack=pack)
    return one, parts


def _samples(plan: Path) -> pa.Table:
    bundle = open_bundle(plan)
    return pa.concat_tables([f.read() for f in bundle.samples])


def test_a_plan_over_the_part_size_is_written_as_parts_of_exactly_that_many_rows(plans) -> None:
    one, parts = plans
    manifest = json.loads((parts / "plan.json").read_text())
    names = [samples_part(k) for k in range(7)]
    assert manifest["files"]["samples"] == names
    assert sorted(manifest["integrity"]["files"]) == sorted([*names, "shards.parquet"])
    assert json.loads((one / "plan.json").read_text())["files"]["samples"] == ["samples.parquet"]
    assert not (parts / "samples.parquet").exists()
    metas = [pq.ParquetFile(parts / name).metadata for name in names]
    assert [m.num_rows for m in metas] == [32, 32, 32, 32, 32, 32, 8]
    assert all(m.row_group(g).num_rows == GROUP for m in metas for g in range(m.num_row_groups))
    assert looks_like_bundle({p.name for p in parts.iterdir()})


def test_parts_hold_the_one_file_plans_rows_and_read_back_as_one_table(plans) -> None:
    one, parts = plans
    single = pq.read_table(one / "samples.parquet")
    assert single.num_rows == DOCUMENTS
    assert _samples(parts).equals(single)
    # Polars and DuckDB users read the parts as one table by their glob.
    import duckdb

    got = duckdb.sql(f"select position, row, tokens, token_offset from '{parts}/samples/part-*.parquet' order by 1")
    assert got.fetchall() == list(
        zip(*single.select(["position", "row", "tokens", "token_offset"]).to_pydict().values(), strict=True)
    )
    import polars as pl

    frame = pl.scan_parquet(f"{parts}/samples/part-*.parquet").select("row", "shard_id", "tokens").collect()
    assert frame.to_dict(as_series=False) == single.select(["row", "shard_id", "tokens"]).to_pydict()


def test_the_executor_runs_seeks_and_chunks_a_parts_plan_as_the_one_file_plan(plans, tokenizer_dir) -> None:
    one, parts = plans

    def run(plan: Path) -> list[bytes]:
        pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33)
        return [b.tokens.tobytes() for b in pipe.batch(microbatch_size=3)]

    batches = run(one)
    assert len(batches) > 20 and run(parts) == batches
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    rows = []
    for plan in (one, parts):
        bundle, encoder = PlanBundle(plan), Encoder(tok)
        seqs = ExactSequences(bundle, encoder, ShardReader(bundle.shards, "text", capacity=4), encoder.pad_id)
        rows.append([seqs.rows([k]).tokens[0].tolist() for k in (57, 0, 31, 32, 58)])
        chunks = list(bundle.chunks(5, start=61))
        assert chunks[0].start == 61 and sum(len(c) for c in chunks) == DOCUMENTS - 61
        rows.append(np.concatenate([c.row for c in chunks]).tolist())
    assert rows[0] == rows[2] and rows[1] == rows[3]


def test_sql_and_show_step_see_the_same_plan_in_parts(plans) -> None:
    one, parts = plans
    query = "select count(*), sum(tokens), max(token_offset), sum(row * position) from samples"
    assert connect(parts).sql(query).fetchall() == connect(one).sql(query).fetchall()
    views = [[show_step(plan, step, batch_size=3) for step in (0, 4, 9)] for plan in (one, parts)]
    assert [len(v.rows) for v in views[0]] == [len(v.rows) for v in views[1]] and len(views[0][1].rows) > 1
    assert views[0] == views[1]


def test_a_plan_of_exactly_the_part_size_stays_one_file_and_overwrite_replaces_parts(
    plans, tmp_path, tokenizer_dir, monkeypatch
) -> None:
    _, parts = plans
    root = parts.parent
    monkeypatch.setattr(samples_writer, "SAMPLES_ROW_GROUP", GROUP)
    monkeypatch.setattr(samples_writer, "SAMPLES_PART_ROWS", PART)
    tok, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=33)
    out = _source(root, PART).plan(tmp_path / "p", tokenize=tok, pack=pack)
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "samples.parquet", "shards.parquet"]
    _source(root).plan(out, tokenize=tok, pack=pack, overwrite=True)  # now parts, over a one-file plan
    assert (out / "samples").is_dir() and not (out / "samples.parquet").exists()
    _source(root, PART).plan(out, tokenize=tok, pack=pack, overwrite=True)  # and back
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "samples.parquet", "shards.parquet"]


def test_a_rank_seeking_into_a_parts_plan_reads_the_first_part_and_its_own_footers_only(plans) -> None:
    _, parts = plans
    bundle = PlanBundle(parts)
    assert [f.checked for f in bundle.checked.samples] == [True] + [False] * 6  # opened: the first part only
    chunk = next(bundle.chunks(4, start=170))
    assert chunk.start == 170 and chunk.row.tolist() == _samples(parts)["row"].to_pylist()[170:174]
    assert [f.checked for f in bundle.checked.samples] == [True, False, False, False, False, True, False]
    groups = RowGroups(open_bundle(parts).samples)
    assert groups.first_row.tolist() == [*range(0, DOCUMENTS, GROUP), DOCUMENTS]
    assert groups.locate(13) == (3, 1) and groups.locate(24) == (6, 0)
    offsets = _samples(parts)["token_offset"].to_numpy()
    for token in (0, int(offsets[100]), int(offsets[100]) + 1, int(offsets[-1]) + 5):
        want = (np.searchsorted(offsets, token, side="right") - 1) // GROUP
        assert groups.last_at_most("token_offset", token) == want


@pytest.mark.parametrize("which", [0, 1])
def test_find_many_gives_each_value_its_row_in_any_order_and_reads_by_runs(plans, which: int) -> None:
    plan = plans[which]  # one file, then parts: 25 row groups of 8 rows either way
    index = RowGroupIndex(open_bundle(plan).samples, ["token_offset"])
    offsets = _samples(plan)["token_offset"].to_numpy()
    rng = np.random.default_rng(which)
    edges = np.concatenate([offsets[::GROUP], offsets[::GROUP] - 1, offsets[::GROUP] + 1])  # at every group's start
    values = np.sort(np.concatenate([rng.integers(0, int(offsets[-1]) + 50, 300), edges, [0, 0, int(offsets[-1])]]))
    for side in ("right", "left"):
        want = np.searchsorted(offsets, values, side=side) - 1  # the last row with offset ≤ (side left: <) value
        assert index.find_many("token_offset", values, side).tolist() == want.tolist()  # ascending: by runs
        shuffled = rng.permutation(len(values))
        got = index.find_many("token_offset", values[shuffled], side)  # any other order: one value at a time
        assert got.tolist() == want[shuffled].tolist()
    calls = []
    original = index._groups.last_at_most
    index._groups.last_at_most = lambda column, value: calls.append(value) or original(column, value)  # type: ignore[method-assign]
    index.find_many("token_offset", values)
    assert len(calls) <= 25 < len(values)  # a search per row group the values fall in, not one per value


def _damage(plan: Path, name: str, tmp_path: Path) -> Path:
    """A copy of ``plan`` whose file ``name`` has another row group's bytes at the same size (its footer kept)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(plan, copy)
    data = bytearray((copy / name).read_bytes())
    data[4:40] = bytes(36)  # inside the first data page: the footer and size unchanged
    (copy / name).write_bytes(bytes(data))
    return copy


def test_a_damaged_or_missing_part_is_refused_in_one_line_when_it_is_read_or_opened(plans, tmp_path) -> None:
    _, parts = plans
    damaged = _damage(parts, samples_part(4), tmp_path)
    bundle = PlanBundle(damaged)  # opening reads the first part only
    assert len(next(bundle.chunks(8, start=0))) == 8
    with pytest.raises(PlanFormatError, match=r"part-00004.parquet must be the file the plan was written with"):
        next(bundle.chunks(8, start=4 * PART))
    manifest = json.loads((parts / "plan.json").read_text())
    manifest["files"]["samples"] = manifest["files"]["samples"][:-1]
    (damaged / "plan.json").write_text(json.dumps(manifest))
    seal_bundle(damaged)  # a plan.json rewritten on purpose, sealed again: the parts must still match the totals
    with pytest.raises(PlanFormatError, match=r"key 'files.samples' must list the 7 parts .* got 6 names"):
        open_bundle(damaged)
    (damaged / "plan.json").write_bytes((parts / "plan.json").read_bytes())
    (damaged / samples_part(5)).unlink()
    with pytest.raises(PlanFormatError, match=r"part-00005.parquet must exist, got nothing there"):
        PlanBundle(damaged)


def test_a_part_missing_from_the_integrity_record_names_the_bundles_plan_json_and_the_part(plans, tmp_path) -> None:
    import shutil

    _, parts = plans
    copy = tmp_path / "unlisted"
    shutil.copytree(parts, copy)
    manifest = json.loads((copy / "plan.json").read_text())
    for k in (3, 0):  # a later part is refused as the bundle opens; the first as it is checked
        del manifest["integrity"]["files"][samples_part(k)]
        (copy / "plan.json").write_text(json.dumps(manifest))
        want = f"{copy / 'plan.json'} key 'integrity.files' must list samples/part-0000{k}.parquet, got no entry"
        with pytest.raises(PlanFormatError, match=re.escape(want)):
            PlanBundle(copy)


def test_parts_must_be_whole_row_groups(tmp_path) -> None:
    with pytest.raises(ValueError, match="part_rows must be a positive multiple of 65536, got 1000"):
        SamplesWriter(tmp_path, part_rows=1000)
