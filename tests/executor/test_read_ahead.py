"""The executor's hot path: reading ahead on a thread, joined tiktoken encoding, per-shard text lists and
per-lane pushes change speed only — every batch stays identical, errors keep their messages."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError
from zephon.executor import cores
from zephon.executor.batch import Batch
from zephon.executor.encode.text import Encoder
from zephon.executor.engines.tiktoken_derive import encode_buffers, join_ranks, separator
from zephon.executor.pack.lanes import Lane
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.read.ahead import READ_AHEAD_ENV, ReadAhead, read_ahead_enabled
from zephon.executor.read.parquet import ParquetShard
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.runner import iterate_batches
from zephon.executor.settings import ExecutorSpec
from zephon.io import Dataset
from zephon.plan.records import ShardRef
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(("zephon-read-ahead", "zephon-encode"))}


@pytest.fixture
def datasets(make_parquet, make_jsonl) -> list[Dataset]:
    return [
        Dataset.from_path("web", make_parquet("web", [40, 25, 31], row_group_size=7)),
        Dataset.from_path("code", make_jsonl("code", [30, 17], compression="gz")),
    ]


def _small_pipeline(plan: Path, tokenizer_dir: str) -> Pipeline:
    """Chunks of 4 documents, rows of 32 tokens, microbatches of 3: many chunks and hand-overs on a tiny plan."""
    return (
        Pipeline.from_plan(plan)
        .options(read_chunk=4)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=32)
        .batch(microbatch_size=3)
    )


def _plan(datasets: list[Dataset], tmp_path: Path, tokenizer_dir: str, *, exact: bool = False) -> Path:
    mixture = MixtureSpec({"web": 0.7, "code": 0.3})
    if not exact:
        return StaticMixtureWorkSource(datasets=datasets, mixture=mixture, seed=3, epochs=2).plan(tmp_path / "est")
    src = StaticMixtureWorkSource(
        datasets=datasets, mixture=mixture, seed=3, token_estimation=TokenEstimation(), num_tokens=3000,
        exact_tokens=True,
    )  # fmt: skip
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    return src.plan(tmp_path / "exact", tokenize=tok, pack=PackSpec(max_length=32))


def _batches(plan: Path, tokenizer_dir: str, *, chunk: int = 16) -> list[Batch]:
    spec = ExecutorSpec(
        tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir),
        pack=PackSpec(max_length=32),
        batch=BatchSpec(microbatch_size=3),
        read_chunk=chunk,
    )
    return list(iterate_batches(plan, spec))


def _same(a: list[Batch], b: list[Batch]) -> None:
    assert len(a) == len(b) and len(a) > 3
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.doc_start, y.doc_start)
        assert np.array_equal(x.lengths, y.lengths) and np.array_equal(x.pieces, y.pieces)


@pytest.mark.parametrize("exact", [False, True])
def test_batches_are_identical_with_and_without_the_read_ahead_thread(
    datasets, tmp_path, tokenizer_dir, monkeypatch, exact
) -> None:
    plan = _plan(datasets, tmp_path, tokenizer_dir, exact=exact)
    monkeypatch.setenv(READ_AHEAD_ENV, "off")
    inline = _batches(plan, tokenizer_dir)
    monkeypatch.setenv(READ_AHEAD_ENV, "on")
    _same(inline, _batches(plan, tokenizer_dir))
    _same(inline, _batches(plan, tokenizer_dir, chunk=5))
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")  # three encode threads, chunks encoded in parallel
    _same(inline, _batches(plan, tokenizer_dir, chunk=3))
    assert not _threads()  # every run shut its thread down


def test_an_unsplit_encode_gives_the_same_ids(tokenizer_dir) -> None:
    from zephon.executor.encode.text import Encoder

    texts = [f"text {i} " + "word " * (i % 13) for i in range(100)]
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    first = encoder.encode_flat(texts)  # verifies the engine
    again = encoder.encode_flat(texts, split=False)
    assert np.array_equal(first.ids, again.ids) and np.array_equal(first.sizes, again.sizes)


def test_dropping_the_iterator_or_resuming_stops_the_thread(datasets, tmp_path, tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setenv(READ_AHEAD_ENV, "on")
    plan = _plan(datasets, tmp_path, tokenizer_dir)
    pipe = _small_pipeline(plan, tokenizer_dir)
    everything = [b.tokens for b in pipe]
    pipe = _small_pipeline(plan, tokenizer_dir)
    it = iter(pipe)
    head = [next(it).tokens for _ in range(3)]
    assert _threads()
    state = pipe.state_dict()
    it.close()
    assert not _threads()
    resumed = (
        Pipeline.from_plan(plan)
        .options(read_chunk=4)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=32)
        .batch(microbatch_size=3)
    )
    resumed.load_state_dict(state)
    rest = [b.tokens for b in resumed]
    assert len(head) + len(rest) == len(everything)
    assert all(np.array_equal(x, y) for x, y in zip(head + rest, everything, strict=True))
    assert not _threads()


def test_a_bad_document_raises_the_same_error_with_the_thread(make_parquet, tmp_path, tokenizer_dir, monkeypatch):
    web = make_parquet("web", [12, 9])
    shard = sorted(web.glob("*.parquet"))[1]
    table = pq.read_table(shard)
    texts = table.column("text").to_pylist()
    texts[4] = None
    pq.write_table(table.set_column(1, "text", pa.array(texts, pa.string())), shard, row_group_size=4)
    plan = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", web)], mixture=MixtureSpec({"web": 1.0}), seed=1
    ).plan(tmp_path / "p")
    messages = []
    for mode in ("off", "on"):
        monkeypatch.setenv(READ_AHEAD_ENV, mode)
        with pytest.raises(DatasetError, match=r"row 4 field 'text' must be a string, got null") as err:
            _batches(plan, tokenizer_dir, chunk=4)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert not _threads()


def test_read_ahead_keeps_order_hands_errors_over_and_closes() -> None:
    items = iter(range(50))

    def produce() -> int | None:
        value = next(items, None)
        if value == 7:
            raise ValueError("seven must be eight, got 7 — fix")
        return value

    source: ReadAhead[int] = ReadAhead(produce, threaded=True, depth=3)
    assert [source.next() for _ in range(7)] == list(range(7))
    with pytest.raises(ValueError, match="seven must be eight"):
        source.next()
    assert source.next() is None
    source.close()
    slow: ReadAhead[int] = ReadAhead(lambda: (time.sleep(0.001), 1)[1], threaded=True, depth=2)
    assert slow.next() == 1
    slow.close()  # a producer blocked on a full queue stops
    assert not _threads()
    inline: ReadAhead[int] = ReadAhead(iter([1, 2, None]).__next__, threaded=False)
    assert [inline.next(), inline.next(), inline.next(), inline.next()] == [1, 2, None, None]


def test_read_ahead_setting(monkeypatch) -> None:
    assert read_ahead_enabled("on") and not read_ahead_enabled("off")
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0}, raising=False)
    assert not read_ahead_enabled("auto")
    # One of several DataLoader workers reads ahead even on a share of one core: it waits for the loader often
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1}, raising=False)
    monkeypatch.setattr(cores, "_workers", [2])
    assert cores.usable_cores() == 1 and read_ahead_enabled("auto") and not read_ahead_enabled("off")
    monkeypatch.setattr(cores, "_workers", [1])
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0}, raising=False)
    assert not read_ahead_enabled("auto")
    with pytest.raises(ConfigError, match="ZEPHON_READ_AHEAD must be"):
        read_ahead_enabled("sometimes")


TRICKY = [
    "",
    "plain words",
    "ends with a partial <|endof",
    "text|> starts with the rest",
    "contains <|endoftext|> the separator itself",
    "   \n\n trailing spaces   ",
    "<|endoftext|>",
    "über naïve 東京 🙂",
    "x",
]


def test_joined_encoding_gives_each_texts_own_ids(tokenizer_dir) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="tiktoken")
    assert encoder._choice.engine.sep is not None
    reference = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="tokenizers")
    for texts in (TRICKY, [t for t in TRICKY if "<|endoftext|>" not in t] * 5, ["a"] * 40, []):
        got = encoder.encode(texts)
        want = reference.encode(texts)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    order = np.array([3, 0, 2, 1])
    flat = encoder.encode_flat(TRICKY[:4], order=order)
    expected = reference.encode([TRICKY[i] for i in order])
    assert np.array_equal(flat.ids, np.concatenate(expected))
    assert flat.sizes.tolist() == [len(e) for e in expected]


def test_separator_has_no_border_and_per_text_join_matches() -> None:
    class Fake:
        def __init__(self, specials: set[str]) -> None:
            self.special_tokens_set = specials

        @staticmethod
        def encode_single_token(token: str) -> int:
            return {"<|x|>": 7, "abab": 8, "a": 9}[token]

    assert separator(Fake({"<|x|>", "abab", "a"}), "abab") == ("<|x|>", 7)  # "abab" has a border; "a" is short
    assert separator(Fake({"abab"}), None) is None
    ranks, sizes = join_ranks([np.array([1, 2], np.uint32), np.array([], np.uint32)], (5,), (6,))
    assert ranks.tolist() == [5, 1, 2, 6, 5, 6] and sizes.tolist() == [4, 2]


def test_per_text_buffers_are_the_fallback(tokenizer_dir) -> None:
    engine = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="tiktoken")._choice.engine
    texts = ["one", "two <|endoftext|> three", ""]
    got = engine.encode(texts)  # a text holds the separator: encoded one by one
    joined, joined_sizes = join_ranks(encode_buffers(engine.encoding, texts), (), ())
    assert np.array_equal(got.ids, joined) and np.array_equal(got.sizes, joined_sizes)


def test_shard_reader_texts_match_pyarrow_across_shards_and_row_groups(make_parquet, make_jsonl) -> None:
    web = make_parquet("web", [23, 17], row_group_size=5)
    code = make_jsonl("code", [11])
    files = sorted(web.glob("*.parquet"))
    refs = [
        ShardRef(shard_id=i, dataset_id=0, dataset="web", uri=str(f), format="parquet", rows=n,
                 bytes=f.stat().st_size, fingerprint="")
        for i, (f, n) in enumerate(zip(files, [23, 17], strict=True))
    ]  # fmt: skip
    jsonl = next(code.glob("*.jsonl"))
    refs.append(ShardRef(shard_id=2, dataset_id=1, dataset="code", uri=str(jsonl), format="jsonl", rows=11,
                         bytes=jsonl.stat().st_size, fingerprint=""))  # fmt: skip
    expected = {i: pq.read_table(f).column("text").to_pylist() for i, f in enumerate(files)}
    expected[2] = [json.loads(line)["text"] for line in jsonl.read_text().splitlines() if line]
    rng = np.random.default_rng(0)
    reader = ShardReader(refs, "text", capacity=1)  # evictions between and within calls
    for _ in range(20):
        shard_ids = rng.integers(0, 3, size=rng.integers(0, 30))
        rows = np.array([rng.integers(0, refs[s].rows) for s in shard_ids.tolist()], dtype=np.int64)
        got = reader.texts(shard_ids.astype(np.int64), rows)
        assert got == [expected[s][r] for s, r in zip(shard_ids.tolist(), rows.tolist(), strict=True)]


def test_a_slow_dataset_keeps_its_window_open_while_another_streams(make_parquet, monkeypatch) -> None:
    """Per-dataset quotas: a dataset read rarely (few long documents) keeps its shards decoded while another
    streams through many shards; a global LRU of the same capacity evicted them and decoded them again."""
    slow, fast = make_parquet("slow", [6, 6], row_group_size=6), make_parquet("fast", [3] * 8, row_group_size=3)
    refs = []
    for dataset_id, directory in enumerate((slow, fast)):
        for f in sorted(directory.glob("*.parquet")):
            refs.append(ShardRef(shard_id=len(refs), dataset_id=dataset_id, dataset=directory.name, uri=str(f),
                                 format="parquet", rows=pq.ParquetFile(f).metadata.num_rows,
                                 bytes=f.stat().st_size, fingerprint=""))  # fmt: skip
    # The plan's pattern: the slow dataset's two shards in its window, the fast one's eight shards streaming.
    calls = []
    for k in range(8):
        calls += [(k % 2, k % 6)] if k % 4 < 2 else []  # the slow one: two reads, then two fast shards without
        calls += [(2 + k, 0), (2 + k, 1), (2 + k, 2)]
    decodes: list[int] = []
    original = ParquetShard.row_group

    def counted(self, g):
        decodes.append(self.ref.shard_id)
        return original(self, g)

    monkeypatch.setattr(ParquetShard, "row_group", counted)
    texts = {}
    for per_dataset in (None, 2):
        decodes.clear()
        reader = ShardReader(refs, "text", capacity=4, per_dataset=per_dataset)
        texts[per_dataset] = [reader.texts(np.array([s]), np.array([r]))[0] for s, r in calls]
        slow_decodes = decodes.count(0) + decodes.count(1)
        assert slow_decodes == (2 if per_dataset else 4), (per_dataset, decodes)
    assert texts[None] == texts[2]


def test_push_many_is_push_one_by_one_also_when_resuming() -> None:
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 99, size=rng.integers(1, 9)) for _ in range(60)]
    positions = np.arange(0, 180, 3)
    for start in [(0, 0), (27, 2), (30, 0), (31, 0)]:
        one, many = Lane(8, 0, start=start), Lane(8, 0, start=start)
        for p, d in zip(positions.tolist(), docs, strict=True):
            one.push(p, d)
        for a in range(0, 60, 7):
            group = docs[a : a + 7]
            many.push_many(positions[a : a + 7], np.concatenate(group), np.array([len(d) for d in group]))
        assert one.cursor() == many.cursor() and one.buffered == many.buffered
        while one.buffered:
            x, y = one.pop_row(), many.pop_row()
            assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.pieces, y.pieces)
            assert one.cursor() == many.cursor()


def test_exact_read_ahead_stops_with_the_run(datasets, tmp_path, tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setenv(READ_AHEAD_ENV, "on")
    plan = _plan(datasets, tmp_path, tokenizer_dir, exact=True)
    bundle = PlanBundle(plan)
    assert bundle.manifest.kind == "exact"
    pipe = _small_pipeline(plan, tokenizer_dir)
    it = iter(pipe)
    for _ in range(4):
        next(it)
    it.close()
    assert not _threads()


def test_exact_read_ahead_keeps_jobs_windows_in_flight(datasets, tmp_path, tokenizer_dir, monkeypatch) -> None:
    """With calls at a steady stride, ``JOBS`` windows are scheduled at once (not one window at a time), so
    the encoder's threads have work while the following window is read; rows stay those of a plain instance.
    The read thread is held until the calls already cached are done, so the count does not depend on timing."""
    from zephon.executor import exact

    monkeypatch.setattr(exact, "READ_AHEAD", 10**6)  # windows of MAX_AHEAD_CALLS = 2 calls of 3 sequences
    monkeypatch.setattr(exact, "MAX_AHEAD_CALLS", 2)
    bundle = PlanBundle(_plan(datasets, tmp_path, tokenizer_dir, exact=True))
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))

    def sequences(background: bool) -> exact.ExactSequences:
        reader = ShardReader(bundle.shards, "text", capacity=8)
        return exact.ExactSequences(bundle, encoder, reader, encoder.pad_id, background=background)

    ahead, plain = sequences(True), sequences(False)
    release, read = threading.Event(), ahead.reader.texts

    def held_texts(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            assert release.wait(10), "a call waited for the held read thread"
        return read(*args, **kwargs)

    merged: list[int] = []  # the positions of every document read into the cache, inline or ahead
    merge = ahead._merge
    monkeypatch.setattr(
        ahead, "_merge", lambda positions, want, *rest: merged.extend(want.tolist()) or merge(positions, want, *rest)
    )

    monkeypatch.setattr(ahead.reader, "texts", held_texts)
    in_flight = []
    try:
        for call in range(12):
            if call == 4:  # calls 2 and 3 came from the inline read of call 1; call 4 needs the first window
                release.set()
            ks = list(range(3 * call, 3 * call + 3))
            got, want = ahead.rows(ks), plain.rows(ks)
            assert np.array_equal(got.tokens, want.tokens) and np.array_equal(got.pieces, want.pieces)
            in_flight.append(len(ahead._jobs))
    finally:
        release.set()
        ahead.close()
    assert ahead._stride == (3, 2)
    assert len(merged) == len(set(merged))  # no document read twice (a window's is not read again while pending)
    # call 0 sets no stride; call 1 reads calls 2-3 inline and schedules the windows after them up to JOBS
    # windows ahead (JOBS - 1 jobs); from call 3 on, each window of calls used up is replaced at once
    assert in_flight[:4] == [0, exact.JOBS - 1, exact.JOBS - 1, exact.JOBS], in_flight


@pytest.mark.parametrize("workers", [1, 2])
def test_exact_chunks_tell_the_read_ahead_their_next_chunk(
    datasets, tmp_path, tokenizer_dir, monkeypatch, workers
) -> None:
    """``exact_microbatches`` passes each call the next chunk's sequences (``ExactSequences._expect``): after the
    first call (one microbatch, read inline for a first batch soon) no document is read on the caller's thread —
    before, the first chunk after it (no stride yet) and the one after that were read inline. Also for each of 2
    DataLoader workers' shares (pieces of every microbatch); the batches are those without read-ahead."""
    from zephon.executor import exact_chunks
    from zephon.executor.runner import RankRunner

    monkeypatch.setattr(exact_chunks, "MAX_CHUNK", 4)  # chunks of 4 microbatches: many calls on a tiny plan
    plan = _plan(datasets, tmp_path, tokenizer_dir, exact=True)
    inline: list[int] = []  # documents read on the caller's thread, per call of ShardReader.texts
    texts = ShardReader.texts

    def counted(self, shard_ids, row_ids):
        if threading.current_thread() is threading.main_thread():
            inline.append(len(row_ids))
        return texts(self, shard_ids, row_ids)

    monkeypatch.setattr(ShardReader, "texts", counted)

    def run(mode: str, worker: int) -> list[tuple[list, list]]:
        monkeypatch.setenv(READ_AHEAD_ENV, mode)
        pipe = _small_pipeline(plan, tokenizer_dir)
        runner = RankRunner(plan, pipe.executor_spec(), pipe.geometry(), worker=(worker, workers), pieces=workers)
        return [
            (b.tokens.tolist(), None if b.pieces is None else b.pieces.tolist()) for b in runner
        ]  # None: past the plan

    for worker in range(workers):
        inline.clear()
        ahead = run("on", worker)
        assert len(inline) == 1 and len(ahead) > 3 * 4, (inline, len(ahead))  # the first call only, of many
        assert ahead == run("off", worker)
