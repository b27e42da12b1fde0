"""The estimated-plan stages (``zephon.executor.estimated``) on the worked example of their module docstring.

A one-shard plan of documents whose tokens are known (demo tokenizer, EOS 0): its ``lane`` column is set by
hand, and the real stages — ``ReadPlanRows`` → ``FetchTexts`` → ``Tokenize`` → ``DealLanes`` → ``LaneBatches`` —
read it. Every row, cursor and microbatch is asserted exactly; so is which microbatches ``Progress`` gives to
DataLoader worker ``w`` of ``N``: running numbers ``w, w + N, …``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.executor import estimated
from zephon.executor.encode.text import Encoder
from zephon.executor.estimated import (
    DealLanes,
    FetchTexts,
    LaneBatches,
    LaneMicrobatch,
    ReadPlanRows,
    Tokenize,
)
from zephon.executor.geometry import Geometry
from zephon.executor.pack.lanes import Lane
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.progress import MicrobatchAt, Progress
from zephon.executor.read.ahead import ReadAhead
from zephon.executor.read.remote import RemoteAccess
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.read.skipped_documents import SkippedDocument, SkipReports
from zephon.executor.settings import RunStats
from zephon.executor.worker_share import WorkerShare, worker_share
from zephon.io import Dataset
from zephon.plan.format import SAMPLES_SCHEMA
from zephon.planner.build import seal_bundle
from zephon.specs import StoreOptions, TokenizeSpec
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

# The worked example's documents: 0: [a a E], 1: [b E], 2: [c E], 3: [d d d E] (demo tokenizer, E = EOS = 0).
TEXTS = ["a b", "the", "and", "data"]
A, B, C, D = [65, 280], [3932], [2540], [68, 303, 65]
E = 0
P = -1  # the lanes' pad id: distinct from EOS, so padding shows in the rows
MAX_LENGTH = 4


def write_plan(root: Path, texts: list[str], lanes: list[int]) -> Path:
    """Plan one Parquet shard holding ``texts`` in row order (no shuffle: position p is row p), then set the
    plan's ``lane`` column to ``lanes``."""
    data = root / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.table({"text": texts}), data / "part-00000.parquet", row_group_size=3)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("tiny", data)],
        mixture=MixtureSpec({"tiny": 1.0}),
        seed=0,
        epochs=1,
        lanes=2,
        shuffle=ShuffleSpec(enabled=False),
    )
    plan = source.plan(root / "plan")
    samples = pq.read_table(plan / "samples.parquet")
    assert samples.column("row").to_pylist() == list(range(len(texts)))  # position p is row p
    deal = SAMPLES_SCHEMA.field("deal")  # with 2 lanes, deal d is lane d mod 2
    samples = samples.set_column(samples.schema.get_field_index("deal"), deal, pa.array(lanes, pa.int64()))
    pq.write_table(samples, plan / "samples.parquet")
    seal_bundle(plan)  # rewritten on purpose: recorded as the bundle's own file
    return plan


@pytest.fixture
def encoder(tokenizer_dir: str) -> Encoder:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir, field="text"))
    assert [ids.tolist() for ids in encoder.encode(TEXTS)] == [[*A, E], [*B, E], [*C, E], [*D, E]]
    return encoder


@pytest.fixture
def example(tmp_path: Path) -> PlanBundle:
    """The worked example's plan: positions 0-3 with lanes [0, 1, 0, 1]."""
    return PlanBundle(write_plan(tmp_path, TEXTS, [0, 1, 0, 1]))


def producer(plan: PlanBundle, lanes: dict[int, Lane], *, chunk_size: int) -> FetchTexts:
    """Stages 1-2 over ``plan``, reading local shards."""
    rows = ReadPlanRows(plan, lanes, num_lanes=2, chunk_size=chunk_size)
    reader = ShardReader(plan.shards, "text", capacity=2)
    return FetchTexts(rows, reader, RemoteAccess(plan, StoreOptions(), reader), SkipReports())


def run(
    plan: PlanBundle,
    encoder: Encoder,
    geometry: Geometry,
    progress: Progress,
    *,
    chunk_size: int = 1024,
    threaded: bool = False,
    threads: int | None = None,
    share: WorkerShare | None = None,
    num_steps: int | None = None,
) -> tuple[list[LaneMicrobatch], dict[int, Lane]]:
    """Every microbatch the five stages yield, and the lanes (their cursors) at the end; with a ``share``, only
    its lanes are packed."""
    held = share.lanes if share is not None and share.lanes is not None else (0, 1)
    lanes = {k: Lane(MAX_LENGTH, P) for k in held}
    tokens = Tokenize(producer(plan, lanes, chunk_size=chunk_size), encoder, threads=threads)
    source = ReadAhead(tokens.next, threaded=threaded)
    deal = DealLanes(
        source, lanes, num_documents=plan.num_documents, dataset_names=plan.dataset_names, stats=None, log=None
    )
    batches = LaneBatches(
        deal, geometry, progress, drop_last=False, max_length=MAX_LENGTH, share=share, num_steps=num_steps
    )
    try:
        return list(batches), lanes
    finally:
        source.close()
        tokens.close()


def pieces(microbatch: LaneMicrobatch) -> list[tuple[int, ...]]:
    """``(row, offset, position, doc_start, length)`` of every piece of the microbatch's rows."""
    assert microbatch.rows.pieces is not None
    return [tuple(int(v) for v in piece) for piece in microbatch.rows.pieces.tolist()]


def test_stages_1_2_keep_every_document_and_group_them_by_lane(example) -> None:
    lanes = {0: Lane(MAX_LENGTH, P), 1: Lane(MAX_LENGTH, P)}
    fetch = producer(example, lanes, chunk_size=1024)
    first = fetch.rows.next()
    assert first is not None and first.keep.tolist() == [0, 1, 2, 3]
    assert first.chunk.start == 0 and first.chunk.lane is not None and first.chunk.lane.tolist() == [0, 1, 0, 1]
    assert fetch.rows.next() is None  # one chunk

    fetch = producer(example, lanes, chunk_size=1024)
    texts = fetch.next()
    assert texts is not None
    assert texts.keep.tolist() == [0, 2, 1, 3]  # grouped by lane, plan order within a lane
    assert texts.texts == ["a b", "and", "the", "data"]
    assert texts.skipped == ()
    assert fetch.next() is None


class _Log:
    """The provenance log's ``skip``, recorded."""

    def __init__(self) -> None:
        self.skipped: list[SkippedDocument] = []

    def skip(self, documents) -> None:
        self.skipped.extend(documents)


def test_a_skipped_document_is_one_record_from_the_reader_to_the_stats_and_the_log(tmp_path, encoder) -> None:
    plan = PlanBundle(write_plan(tmp_path, ["a b", None, "and", "data"], [0, 1, 0, 1]))  # row 1: null text
    lanes = {0: Lane(MAX_LENGTH, P), 1: Lane(MAX_LENGTH, P)}
    reports = SkipReports()
    reader = ShardReader(plan.shards, "text", capacity=2, on_bad_document="skip", on_skip=reports.add, skippable=True)
    rows = ReadPlanRows(plan, lanes, num_lanes=2, chunk_size=1024)
    fetch = FetchTexts(rows, reader, RemoteAccess(plan, StoreOptions(), reader), reports)
    stats, log = RunStats(), _Log()
    tokens = Tokenize(fetch, encoder, threads=None)
    deal = DealLanes(
        ReadAhead(tokens.next, threaded=False),
        lanes,
        num_documents=plan.num_documents,
        dataset_names=plan.dataset_names,
        stats=stats,
        log=log,  # type: ignore[arg-type]
    )
    batches = list(
        LaneBatches(
            deal,
            Geometry.for_plan(microbatch=2, global_batch=2, dp_size=1, dp_rank=0, exact=False, plan_lanes=2),
            Progress(accumulation=1),
            drop_last=False,
            max_length=MAX_LENGTH,
        )
    )
    tokens.close()
    shard = reader.ref(0)
    assert log.skipped == [SkippedDocument(ref=shard, row=1, reason="null_text", position=1, lane=1)]
    assert deal.skipped == {"null_text": 1}
    assert stats.skipped == {"null_text": 1} and stats.skipped_by_shard == {shard.uri: {"null_text": 1}}
    assert [piece[2] for b in batches for piece in pieces(b)] == [0, 2, 3, 2]  # position 1 has no tokens


def test_stages_1_2_start_each_lane_at_its_cursor(example) -> None:
    # Resumed at lane 0's cursor (2, 1) and lane 1's (3, 2): only documents 2 and 3 are read again.
    lanes = {0: Lane(MAX_LENGTH, P, start=(2, 1)), 1: Lane(MAX_LENGTH, P, start=(3, 2))}
    texts = producer(example, lanes, chunk_size=1024).next()
    assert texts is not None and texts.chunk.start == 2
    assert texts.keep.tolist() == [0, 1] and texts.texts == ["and", "data"]


@pytest.mark.parametrize(
    ("chunk_size", "threaded", "threads"),
    [(1024, False, None), (1, False, None), (3, True, 2)],
    ids=["one-chunk", "chunks-of-1", "chunks-of-3-read-ahead-encode-pool"],
)
def test_the_worked_example_row_by_row(example, encoder, chunk_size, threaded, threads) -> None:
    geometry = Geometry(microbatch=2, global_batch=2, dp_size=1, dp_rank=0, lanes=2)
    progress = Progress(accumulation=geometry.accumulation)
    got, lanes = run(example, encoder, geometry, progress, chunk_size=chunk_size, threaded=threaded, threads=threads)

    assert [(m.at, m.sequences.tolist()) for m in got] == [
        (MicrobatchAt(step=0, index=0), [0, 1]),
        (MicrobatchAt(step=1, index=0), [2, 3]),
    ]
    step0, step1 = got
    # Step 0: row 0 of lane 0 [a a E c], row 0 of lane 1 [b E d d].
    assert step0.rows.tokens.tolist() == [[*A, E, *C], [*B, E, D[0], D[1]]]
    assert step0.rows.lengths.tolist() == [4, 4]
    assert step0.rows.doc_start.tolist() == [[True, False, False, True], [True, False, True, False]]
    assert pieces(step0) == [(0, 0, 0, 0, 3), (0, 3, 2, 0, 1), (1, 0, 1, 0, 2), (1, 2, 3, 0, 2)]
    # Step 1, the plan read to the end: [E p p p] (the rest of c) and [d E p p] (the rest of d), padded.
    assert step1.rows.tokens.tolist() == [[E, P, P, P], [D[2], E, P, P]]
    assert step1.rows.lengths.tolist() == [1, 2]
    assert step1.rows.doc_start.tolist() == [[False] * 4, [False] * 4]
    assert pieces(step1) == [(0, 0, 2, 1, 1), (1, 0, 3, 2, 2)]
    # No lane has tokens left: the iteration ended after step 1, each lane one past its last document.
    assert (progress.step, progress.microbatch) == (2, 0)
    assert lanes[0].cursor() == (3, 0) and lanes[1].cursor() == (4, 0)


def test_the_cursors_after_step_0_are_the_worked_examples(example, encoder) -> None:
    geometry = Geometry(microbatch=2, global_batch=2, dp_size=1, dp_rank=0, lanes=2)
    lanes = {0: Lane(MAX_LENGTH, P), 1: Lane(MAX_LENGTH, P)}
    tokens = Tokenize(producer(example, lanes, chunk_size=1024), encoder, threads=None)
    deal = DealLanes(
        ReadAhead(tokens.next, threaded=False),
        lanes,
        num_documents=4,
        dataset_names=example.dataset_names,
        stats=None,
        log=None,
    )
    batches = iter(LaneBatches(deal, geometry, Progress(accumulation=1), drop_last=False, max_length=MAX_LENGTH))
    first = next(batches)
    assert first.at == MicrobatchAt(step=0, index=0)
    assert lanes[0].cursor() == (2, 1) and lanes[1].cursor() == (3, 2)
    # Lane 0's stream is a a E c E, lane 1's b E d d d E: what is left after step 0 is buffered.
    assert lanes[0].buffered == 1 and lanes[1].buffered == 2


def test_drop_last_stops_before_the_first_padded_microbatch(example, encoder) -> None:
    geometry = Geometry(microbatch=2, global_batch=2, dp_size=1, dp_rank=0, lanes=2)
    lanes = {0: Lane(MAX_LENGTH, P), 1: Lane(MAX_LENGTH, P)}
    tokens = Tokenize(producer(example, lanes, chunk_size=1024), encoder, threads=None)
    deal = DealLanes(
        ReadAhead(tokens.next, threaded=False), lanes, num_documents=4, dataset_names=["tiny"], stats=None, log=None
    )
    got = list(LaneBatches(deal, geometry, Progress(accumulation=1), drop_last=True, max_length=MAX_LENGTH))
    assert [m.at for m in got] == [MicrobatchAt(step=0, index=0)]


def test_block_sequences_are_each_microbatchs_sequences_stacked() -> None:
    """``Geometry.block_sequences`` (one call for a block of ``LaneBatches``) against ``microbatch_sequences`` one
    microbatch at a time, across steps, ranks and accumulation."""
    for b, g, dp in ((2, 2, 1), (2, 12, 2), (3, 18, 3), (4, 8, 2), (1, 6, 1)):
        for rank in range(dp):
            geometry = Geometry(microbatch=b, global_batch=g, dp_size=dp, dp_rank=rank, lanes=g)
            for running, count in ((0, 1), (0, 7), (5, 4), (11, 9)):
                want = [
                    geometry.microbatch_sequences(*divmod(r, geometry.accumulation))
                    for r in range(running, running + count)
                ]
                got = geometry.block_sequences(running, count)
                assert got.shape == (count, b) and got.tolist() == np.stack(want).tolist()


# -- WorkerShare: DataLoader worker w of N yields microbatches w, w + N, ... of the iteration -------------------


def test_worker_w_of_n_yields_every_nth_microbatch_of_the_iteration() -> None:
    # A = 3, whole microbatches (c = 1): running numbers m0, m0 + 1, ... go to workers 0, 1, ..., N - 1, 0, ...
    geometry = Geometry(microbatch=2, global_batch=6, dp_size=1, dp_rank=0, lanes=None)
    for first in (0, 1, 4):  # a resumed iteration starts its items at worker 0 too
        for workers in (1, 2, 3, 4):
            for worker in range(workers):
                share = worker_share(geometry, worker=worker, workers=workers, pieces=1, first=first)
                mine = [m for m in range(first, first + 9) if share.rows(m) is not None]
                assert mine == list(range(first + worker, first + 9, workers))
                assert all(share.rows(m) == (0, 2) for m in mine)


@pytest.fixture
def longer(tmp_path: Path) -> PlanBundle:
    """The worked example's documents three times over, lanes alternating: lane 0's stream is (a a E c E) × 3,
    15 tokens, 4 rows; lane 1's is (b E d d d E) × 3, 18 tokens, 5 rows."""
    return PlanBundle(write_plan(tmp_path, TEXTS * 3, [0, 1] * 6))


def test_lane_batches_give_worker_w_of_n_microbatches_w_w_plus_n_and_so_on(longer, encoder) -> None:
    # One sequence per microbatch, two per step (A = 2): microbatch k is sequence k, row k // 4 of lane k % 2.
    geometry = Geometry(microbatch=1, global_batch=2, dp_size=1, dp_rank=0, lanes=2)
    every, _ = run(longer, encoder, geometry, Progress(accumulation=2))
    lane0 = [*A, E, *C, E] * 3
    lane1 = [*B, E, *D, E] * 3
    rows = {0: [lane0[i : i + 4] for i in range(0, 16, 4)], 1: [lane1[i : i + 4] for i in range(0, 20, 4)]}
    assert len(every) == 10  # steps 0-4: lane 1's row 4 still holds tokens (lane 0's is empty)
    for k, microbatch in enumerate(every):
        assert microbatch.at == MicrobatchAt(step=k // 2, index=k % 2)
        assert microbatch.sequences.tolist() == [k]
        want = rows[k % 2][k // 2] if k // 2 < len(rows[k % 2]) else []
        assert microbatch.rows.lengths.tolist() == [len(want)]
        assert microbatch.rows.tokens.tolist() == [want + [P] * (4 - len(want))]

    expected = {
        (2, 0): [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)],
        (2, 1): [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)],
        (3, 0): [(0, 0), (1, 1), (3, 0), (4, 1)],
        (3, 1): [(0, 1), (2, 0), (3, 1)],
        (3, 2): [(1, 0), (2, 1), (4, 0)],
    }
    for (workers, worker), want_at in expected.items():
        progress = Progress(accumulation=2)
        share = worker_share(geometry, worker=worker, workers=workers, pieces=1, first=0)
        assert share.lanes == ((worker,) if workers == 2 else (0, 1))  # N = 2 divides A: one lane each
        # The run's length, as a runner passes it: a worker that holds lane 0 only must not end when lane 0 does.
        mine, _ = run(longer, encoder, geometry, progress, share=share, num_steps=5)
        assert [(m.at.step, m.at.index) for m in mine] == want_at
        assert [2 * m.at.step + m.at.index for m in mine] == list(range(worker, 10, workers))
        for m in mine:  # the same rows as the single worker's microbatch
            same = every[2 * m.at.step + m.at.index]
            assert m.sequences.tolist() == same.sequences.tolist()
            assert m.rows.tokens.tolist() == same.rows.tokens.tolist()
            assert m.rows.lengths.tolist() == same.rows.lengths.tolist()
        assert (progress.step, progress.microbatch) == (5, 0)  # every worker advanced through all ten


def test_chunks_grow_while_their_documents_units_fit_the_budget_up_to_grow_times_the_chunk(tmp_path) -> None:
    """``PlanBundle.chunks`` with units: after the first whole chunk each takes documents while their units add
    up to the budget, at least ``chunk_size``, at most ``grow × chunk_size``; the ramp as without."""
    plan = PlanBundle(write_plan(tmp_path, [TEXTS[i % 4] for i in range(100)], [i % 2 for i in range(100)]))
    assert len(plan.shards) == 1

    def sizes(units: int, budget: int) -> list[int]:
        return [len(c) for c in plan.chunks(4, ramp=2, units=np.array([units]), budget=budget, grow=4)]

    assert sizes(1, 0) == [2, 4] + [4] * 23 + [2]  # nothing fits: chunk_size
    assert sizes(1, 10) == [2, 4] + [10] * 9 + [4]  # 10 units a chunk
    assert sizes(1, 1000) == [2, 4] + [16] * 5 + [14]  # capped at 4 × 4
    assert sizes(5, 30) == [2, 4] + [6] * 15 + [4]
    assert [len(c) for c in plan.chunks(4, ramp=2)] == [2] + [4] * 24 + [2]  # without units


def test_chunks_of_small_documents_grow_and_the_microbatches_stay_the_same(tmp_path, encoder, monkeypatch) -> None:
    """400 small documents, ``read_chunk`` 4: the chunks grow to ``GROW`` × 4 documents, and the microbatches are
    those of chunks of 4 (no growth) and of 1,024 documents."""
    texts = [TEXTS[i % 4] for i in range(400)]
    plan = PlanBundle(write_plan(tmp_path, texts, [i % 2 for i in range(400)]))
    lanes = {0: Lane(MAX_LENGTH, P), 1: Lane(MAX_LENGTH, P)}
    fetch = producer(plan, lanes, chunk_size=4)
    sizes = []
    while (got := fetch.next()) is not None:
        sizes.append(len(got.chunk))
    assert sizes[:2] == [4, 16] and set(sizes[1:-1]) == {16} and sum(sizes) == 400
    geometry = Geometry.for_plan(microbatch=2, global_batch=2, dp_size=1, dp_rank=0, exact=False, plan_lanes=2)
    got, _ = run(plan, encoder, geometry, Progress(accumulation=1), chunk_size=4)
    whole, _ = run(plan, encoder, geometry, Progress(accumulation=1), chunk_size=1024)
    monkeypatch.setattr(estimated, "GROW", 1)  # no growth
    want, _ = run(plan, encoder, geometry, Progress(accumulation=1), chunk_size=4)
    assert len(want) > 50
    for a, b, c in zip(want, got, whole, strict=True):
        assert a.rows.tokens.tolist() == b.rows.tokens.tolist() == c.rows.tokens.tolist()
        assert a.rows.pieces.tolist() == b.rows.pieces.tolist() == c.rows.pieces.tolist()
