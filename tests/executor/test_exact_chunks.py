"""Exact runs built a chunk of microbatches at a time (``zephon.executor.exact_chunks``,
``zephon.executor.pack.exact_rows``) hand out exactly the batches, states and errors of building each
microbatch alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.executor import exact_chunks
from zephon.executor.batch import Batch
from zephon.executor.geometry import Geometry
from zephon.executor.pack.exact_rows import cut_rows, split_rows
from zephon.executor.pack.rows import make_pieces
from zephon.executor.runner import RankRunner
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

WIDTH = 16


def _plan(
    tmp_path: Path, make_parquet, tokenizer_dir: str, algorithm: str, shards: tuple[int, ...] = (40, 25, 31)
) -> Path:
    datasets = [Dataset.from_path("web", make_parquet("web", list(shards), row_group_size=7))]
    source = StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec({"web": 1.0}), seed=5, exact_tokens=True)
    tok, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=WIDTH, algorithm=algorithm)
    return source.plan(tmp_path / algorithm, tokenize=tok, pack=pack)


def _runner(plan: Path, tokenizer_dir: str, algorithm: str, *, rank: int = 0, dp: int = 1, **kwargs) -> RankRunner:
    spec = (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=WIDTH, algorithm=algorithm)
        .batch(microbatch_size=3, global_batch_size=6 * dp)
        .executor_spec()
    )
    geometry = Geometry.for_plan(
        microbatch=3, global_batch=6 * dp, dp_size=dp, dp_rank=rank, exact=True, plan_lanes=None
    )
    return RankRunner(plan, spec, geometry, **kwargs)


def _same(a: Batch, b: Batch) -> None:
    assert (a.step, a.microbatch) == (b.step, b.microbatch)
    for name in ("tokens", "doc_start", "lengths", "sequences", "pieces"):
        got, want = getattr(a, name), getattr(b, name)
        if want is None:  # pieces of a microbatch wholly past the plan
            assert got is None, name
            continue
        assert got.dtype == want.dtype and np.array_equal(got, want), name


@pytest.mark.parametrize("algorithm", ["wrap", "best_fit"])
@pytest.mark.parametrize(("dp", "worker"), [(1, (0, 1)), (2, (0, 1)), (2, (1, 1)), (1, (1, 3))])
def test_chunks_hand_out_the_batches_and_states_of_one_microbatch_at_a_time(
    tmp_path, make_parquet, tokenizer_dir, monkeypatch, algorithm, dp, worker
) -> None:
    """Chunks of 5 microbatches (and the last, shorter one, past the end of the plan) against chunks of one:
    every batch and the state after each are the same, for dp 1 and 2 and a DataLoader worker's share."""
    plan = _plan(tmp_path, make_parquet, tokenizer_dir, algorithm)
    rank, (w, n) = (worker[0], (0, 1)) if dp == 2 else (0, worker)

    def run(chunk: int) -> tuple[list[Batch], list[dict]]:
        monkeypatch.setattr(exact_chunks, "MAX_CHUNK", chunk)
        runner = _runner(plan, tokenizer_dir, algorithm, rank=rank, dp=dp, worker=(w, n))
        batches, states = [], []
        for b in runner:
            batches.append(b)
            states.append(runner.state())
        return batches, states

    (alone, alone_states), (chunked, chunked_states) = run(1), run(5)
    assert len(chunked) == len(alone) > 10
    for a, b in zip(chunked, alone, strict=True):
        _same(a, b)
    assert chunked_states == alone_states
    if n == 1:
        assert chunked[-1].lengths.min() == 0  # the last microbatch reaches past the plan: empty rows


def test_a_resume_mid_chunk_continues_with_the_same_batches(tmp_path, make_parquet, tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setattr(exact_chunks, "MAX_CHUNK", 4)
    plan = _plan(tmp_path, make_parquet, tokenizer_dir, "wrap")
    whole = list(_runner(plan, tokenizer_dir, "wrap"))
    runner = _runner(plan, tokenizer_dir, "wrap")
    it = iter(runner)
    for _ in range(3):  # microbatch 0 alone, then 2 of the chunk of microbatches 1-4
        next(it)
    state = runner.state()
    it.close()
    rest = list(_runner(plan, tokenizer_dir, "wrap", state=state))
    assert len(rest) == len(whole) - 3
    for a, b in zip(rest, whole[3:], strict=True):
        _same(a, b)


def test_an_error_inside_a_chunk_is_raised_as_without_chunks(
    tmp_path, make_parquet, tokenizer_dir, monkeypatch
) -> None:
    """A shard changed after planning (refused when read): the chunk is built again one microbatch at a time, so
    the error and the batches handed out before it are those of building each microbatch alone."""
    from zephon.executor import exact

    monkeypatch.setenv("ZEPHON_READ_AHEAD", "off")
    monkeypatch.setattr(exact, "READ_AHEAD", 1)  # read one call ahead: the error comes near its microbatch
    plan = _plan(tmp_path, make_parquet, tokenizer_dir, "wrap", shards=(40, 40, 40, 40, 2))
    shard = sorted((tmp_path / "data" / "web").glob("*.parquet"))[-1]
    table = pq.read_table(shard)
    texts = table.column("text").to_pylist()
    texts[-1] = texts[-1] + " and then some more words"
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts)), shard)

    def run(chunk: int) -> tuple[list[Batch], str]:
        monkeypatch.setattr(exact_chunks, "MAX_CHUNK", chunk)
        got: list[Batch] = []
        with pytest.raises(DatasetError, match="changed since planning") as err:
            got.extend(_runner(plan, tokenizer_dir, "wrap"))
        return got, str(err.value)

    (alone, alone_error), (chunked, chunked_error) = run(1), run(64)
    assert chunked_error == alone_error
    assert len(chunked) == len(alone) > 10  # the microbatches before the one that reads the shard
    for a, b in zip(chunked, alone, strict=True):
        _same(a, b)


def test_cut_rows_copies_a_run_of_consecutive_rows_at_once_and_split_rows_renumbers_pieces() -> None:
    """The module docstring's example: cache [a a a E b E c c E] (a=1, b=2, c=3, E=0), two one-row microbatches."""
    source = np.array([1, 1, 1, 0, 2, 0, 3, 3, 0], dtype=np.int64)
    base = np.array([0, 4, 6])
    pieces = make_pieces([(0, 0, 10, 0, 4), (1, 0, 11, 0, 2), (1, 2, 12, 0, 2)])
    src = base[[0, 1, 2]] + pieces["doc_start"]
    packed = cut_rows(pieces, src, source, rows=2, width=4, pad_id=-1, starts_all=False)
    assert packed.tokens.tolist() == [[1, 1, 1, 0], [2, 0, 3, 3]]
    assert packed.doc_start.tolist() == [[True, False, False, False], [True, False, True, False]]
    assert packed.lengths.tolist() == [4, 4]
    (first, d0), (second, d1) = split_rows(packed, np.array([7, 8, 9]), [1, 1])
    assert second.tokens.base is not None and np.shares_memory(second.tokens, packed.tokens)
    assert second.tokens.tolist() == [[2, 0, 3, 3]] and second.pieces["row"].tolist() == [0, 0]
    assert first.pieces["position"].tolist() == [10] and d0.tolist() == [7] and d1.tolist() == [8, 9]
    # a row ending early (the end of the plan) is padded
    short = make_pieces([(0, 0, 12, 0, 3)])
    packed = cut_rows(short, np.array([6]), source, rows=1, width=4, pad_id=-1, starts_all=True)
    assert packed.tokens.tolist() == [[3, 3, 0, -1]] and packed.lengths.tolist() == [3]


def test_chunk_size_bounds_the_chunk_by_microbatches_and_tokens() -> None:
    assert exact_chunks.chunk_size(8, 2049) == 63  # the module docstring's example
    assert exact_chunks.chunk_size(32, 2049) == 15  # 2^20 tokens
    assert exact_chunks.chunk_size(64, 131073) == 1
