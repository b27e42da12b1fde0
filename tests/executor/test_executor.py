"""The executor: batches follow the plan exactly, wrap packing conserves every token, tensors are shaped right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError
from zephon.executor.batch import Batch
from zephon.executor.encode.text import Encoder
from zephon.executor.pack.lanes import Lane
from zephon.executor.runner import iterate_batches
from zephon.executor.settings import ExecutorSpec
from zephon.io import Dataset
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def plan(make_parquet, make_jsonl, tmp_path) -> Path:
    datasets = [
        Dataset.from_path("web", make_parquet("web", [9, 6, 5])),
        Dataset.from_path("code", make_jsonl("code", [7, 3], compression="gz")),
    ]
    src = StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec({"web": 0.7, "code": 0.3}), seed=3, epochs=2)
    return src.plan(tmp_path / "plan")


def independent_docs(plan: Path, tokenizer_dir: str) -> list[np.ndarray]:
    """Tokens of every planned document, read and tokenized without the executor, in plan order."""
    import gzip

    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    shards = pq.read_table(plan / "shards.parquet").to_pylist()
    samples = pq.read_table(plan / "samples.parquet").to_pylist()
    texts = []
    for s in samples:
        shard = shards[s["shard_id"]]
        if shard["format"] == "parquet":
            texts.append(pq.read_table(shard["uri"]).column("text")[s["row"]].as_py())
        else:
            lines = [ln for ln in gzip.decompress(Path(shard["uri"]).read_bytes()).decode().split("\n") if ln]
            texts.append(json.loads(lines[s["row"]])["text"])
    return [np.array([*tok.encode(t, add_special_tokens=False).ids, 0]) for t in texts]  # demo tokenizer: EOS is 0


def lanes_of(plan: Path, lanes: int) -> np.ndarray:
    """Each document's packing lane among ``lanes``: its deal modulo the lanes."""
    return pq.read_table(plan / "samples.parquet").column("deal").to_numpy() % lanes


def run(plan: Path, tokenizer_dir: str, *, max_length: int = 16, batch: int = 3, chunk: int = 1024) -> list[Batch]:
    spec = ExecutorSpec(
        tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir, field="text"),
        pack=PackSpec(max_length=max_length),
        batch=BatchSpec(microbatch_size=batch),
        read_chunk=chunk,
    )
    return list(iterate_batches(plan, spec))


def rows_by_lane(batches: list[Batch], lanes: int) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Each lane's rows in order (sequence j is row j // L of lane j % L): (valid tokens, doc starts)."""
    out: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {lane: [] for lane in range(lanes)}
    for b in batches:
        assert b.sequences is not None
        for i, j in enumerate(b.sequences.tolist()):
            out[j % lanes].append((b.tokens[i, : b.lengths[i]], b.doc_start[i, : b.lengths[i]]))
    return out


@pytest.fixture
def small_quanta(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lanes dealt by 64-byte quanta, so a plan of a few KB still fills every lane."""
    from zephon.planner import lane_dealing

    monkeypatch.setattr(lane_dealing, "QUANTUM", 64)


def test_wrap_packing_reproduces_each_lanes_independently_tokenized_stream(small_quanta, plan, tokenizer_dir) -> None:
    batches = run(plan, tokenizer_dir)
    docs = independent_docs(plan, tokenizer_dir)
    # A default plan fixes no lanes: the run packs one per row of its global batch (3 here).
    lanes = lanes_of(plan, 3)
    assert json.loads((plan / "plan.json").read_text())["lanes"] is None and set(lanes.tolist()) == set(range(3))
    for lane, rows in rows_by_lane(batches, 3).items():
        expected = np.concatenate([d for d, ln in zip(docs, lanes, strict=True) if ln == lane])
        got = np.concatenate([r[0] for r in rows])
        assert np.array_equal(got, expected), lane
        lengths = [len(r[0]) for r in rows]
        # Full rows, then at most one short row, then only empty rows (the lane ran out before others).
        short = [i for i, n in enumerate(lengths) if n < 16]
        assert all(lengths[i] == 0 for i in short[1:])
        # A document starts right after each EOS, and at the lane's first token.
        starts = np.concatenate([r[1] for r in rows])
        want = np.zeros(len(expected), dtype=bool)
        want[0] = True
        want[1:] = expected[:-1] == 0
        assert np.array_equal(starts, want), lane
    assert all(len(b) == 3 for b in batches)  # microbatches stay full-sized (empty rows past the plan)


def test_read_chunk_size_never_changes_the_data(plan, tokenizer_dir) -> None:
    a = run(plan, tokenizer_dir, chunk=1024)
    b = run(plan, tokenizer_dir, chunk=5)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.doc_start, y.doc_start)


def test_to_training_shifts_labels_masks_padding_and_restarts_positions() -> None:
    e = 0
    tokens = np.array([[5, 6, e, 7, e], [8, e, 0, 0, 0]], dtype=np.int64)
    starts = np.array([[1, 0, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=bool)
    batch = Batch(tokens=tokens, doc_start=starts, lengths=np.array([5, 2]))
    t = batch.to_training(return_labels=True, return_position_ids=True, return_cu_seqlens=True)
    assert t["input_ids"].tolist() == [[5, 6, e, 7], [8, e, 0, 0]]
    assert t["labels"].tolist() == [[6, e, 7, e], [e, -100, -100, -100]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert t["cu_seqlens"].tolist() == [0, 3, 4, 6, 8]
    assert t["cu_seqlens"].dtype == torch.int32 and t["max_seqlen"] == 3
    assert t["input_ids"].dtype == torch.int64


def test_lane_docstring_example_and_cursors() -> None:
    lane = Lane(4, pad_id=-1)
    for position, doc in ((3, [11, 11, 11, 0]), (9, [21, 0]), (12, [31, 31, 0])):
        lane.push(position, np.array(doc))
    assert lane.pop_row().tokens.tolist() == [[11, 11, 11, 0]] and lane.cursor() == (4, 0)
    second = lane.pop_row()
    assert second.tokens.tolist() == [[21, 0, 31, 31]] and lane.cursor() == (12, 2)
    assert second.doc_start.tolist() == [[True, False, True, False]]
    last = lane.pop_row()
    assert last.tokens.tolist() == [[0, -1, -1, -1]] and last.lengths.tolist() == [1] and lane.cursor() == (13, 0)
    assert lane.pop_row().lengths.tolist() == [0]
    # A lane rebuilt from cursor (12, 2) produces the same remaining row.
    resumed = Lane(4, pad_id=-1, start=(12, 2))
    resumed.push(9, np.array([21, 0]))
    resumed.push(12, np.array([31, 31, 0]))
    assert resumed.pop_row().tokens.tolist() == [[0, -1, -1, -1]]


def test_seed_snippet_shape_contract(plan, tokenizer_dir) -> None:
    pipeline = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir, field="text")
    pipeline = pipeline.pack_flat(max_length=33, algorithm="wrap").batch(microbatch_size=4)
    first = next(iter(pipeline)).to_training(return_labels=True)
    assert first["input_ids"].shape == torch.Size([4, 32]) and first["labels"].shape == torch.Size([4, 32])


def test_pipeline_from_work_source_plans_once_by_content_hash(make_parquet, tokenizer_dir) -> None:
    src = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", make_parquet("web", [5]))], mixture=MixtureSpec({"web": 1}), seed=1
    )
    build = lambda: Pipeline(src).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=8).batch(microbatch_size=2)  # noqa: E731
    first = build().plan_dir
    mtime = (first / "samples.parquet").stat().st_mtime_ns
    assert build().plan_dir == first and (first / "samples.parquet").stat().st_mtime_ns == mtime
    a = [b.tokens.tolist() for b in build()]
    assert a == [
        b.tokens.tolist()
        for b in Pipeline.from_plan(first)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=8)
        .batch(microbatch_size=2)
    ]


def test_pipeline_without_all_steps_says_what_is_missing(plan, tokenizer_dir) -> None:
    with pytest.raises(ConfigError, match="got none for pack_flat, batch"):
        iter(Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir))


def test_missing_field_names_dataset_shard_and_columns(plan, tokenizer_dir) -> None:
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir, field="content")
    with pytest.raises(DatasetError, match=r"dataset '(web|code)': shard .* must have the (column|field) 'content'"):
        list(
            iterate_batches(
                plan, ExecutorSpec(tokenize=spec, pack=PackSpec(max_length=8), batch=BatchSpec(microbatch_size=1))
            )
        )


def test_a_shard_changed_after_planning_is_refused(plan, tokenizer_dir) -> None:
    shard = pq.read_table(plan / "shards.parquet").to_pylist()[0]["uri"]
    import pyarrow as pa

    pq.write_table(pa.table({"text": ["changed"] * 9}), shard)
    with pytest.raises(DatasetError, match="changed since planning: size must be"):
        run(plan, tokenizer_dir)


def test_encoder_appends_eos_and_follows_the_bos_convention(tokenizer_dir) -> None:
    enc = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    plain = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json").encode("hello world", add_special_tokens=False).ids
    assert enc.encode(["hello world"])[0].tolist() == [*plain, 0]
    forced = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=True))
    assert forced.encode(["hello world"])[0].tolist() == [0, *plain, 0]


def test_executor_never_imports_the_planner_polars_or_duckdb(plan, tokenizer_dir) -> None:
    code = f"""
import sys
from zephon import Pipeline
p = Pipeline.from_plan({str(plan)!r}).tokenize(tokenizer_id={tokenizer_dir!r}).pack_flat(max_length=8).batch(microbatch_size=2)
assert sum(1 for _ in p) > 0
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'duckdb') or m.startswith('zephon.planner'))
print(bad)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_planner_and_executor_are_not_top_level_modules(tmp_path) -> None:
    code = "import zephon.planner, zephon.executor\ntry:\n import planner\nexcept ImportError: print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "ok"
