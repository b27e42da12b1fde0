"""Honest stats: ``Pipeline.stats()`` describes what was handed out, for every plan kind, whatever the read-ahead
and chunk sizes; a run whose whole share was skipped is an error (``zephon.executor.settings.RunStats``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl_dataset, write_parquet_dataset

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource, TokenEstimation

MAX_LENGTH, MICROBATCH = 33, 2

#: Work-source keywords and packing algorithm (exact plans) of each plan kind.
KINDS = {
    "samples": ({"lanes": 2}, None),
    "tokens": ({"lanes": 3, "token_estimation": TokenEstimation(primer="measure", calibration_samples=16)}, None),
    "exact_wrap": ({"token_estimation": TokenEstimation(primer="measure"), "exact_tokens": True}, "wrap"),
    "exact_best_fit": ({"token_estimation": TokenEstimation(primer="measure"), "exact_tokens": True}, "best_fit"),
}


def make_plan(root: Path, kind: str, tokenizer_dir: str) -> Path:
    kw, algorithm = KINDS[kind]
    web = write_parquet_dataset(root, "web", [13, 9, 11])
    books = write_jsonl_dataset(root, "books", [7, 12])
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web)), Dataset.from_path("books", str(books))],
        mixture=MixtureSpec({"web": 0.6, "books": 0.4}),
        seed=3,
        **kw,
    )
    pack = PackSpec(max_length=MAX_LENGTH, algorithm=algorithm) if algorithm else None
    return source.plan(root / "plan", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=pack)


def pipeline(plan: Path, tokenizer_dir: str, *, algorithm: str = "wrap", **options) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(**options)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH, algorithm=algorithm)
        .batch(microbatch_size=MICROBATCH)
    )


def algorithm_of(kind: str) -> str:
    return KINDS[kind][1] or "wrap"


def yielded(plan: Path, batches) -> tuple[dict[str, int], dict[str, int]]:
    """Documents (first token handed out) and tokens per dataset of ``batches``, from their pieces' positions
    looked up in samples.parquet — independently of the executor's own bookkeeping."""
    names = [d["name"] for d in json.loads((plan / "plan.json").read_text(encoding="utf-8"))["datasets"]]
    dataset_id = pq.read_table(plan / "samples.parquet", columns=["dataset_id"]).column(0).to_numpy()
    documents, tokens = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    for batch in batches:
        if batch.pieces is None:  # sequences past the end of an exact plan: empty rows
            assert not batch.lengths.any()
            continue
        assert int(batch.pieces["length"].sum()) == int(batch.lengths.sum())
        for position, doc_start, length in batch.pieces[["position", "doc_start", "length"]].tolist():
            name = names[dataset_id[position]]
            tokens[name] += length
            documents[name] += doc_start == 0
    return documents, tokens


def check(pipe: Pipeline, plan: Path, batches) -> None:
    documents, tokens = yielded(plan, batches)
    stats = pipe.stats()
    assert (stats.documents, stats.tokens) == (documents, tokens)
    assert sum(stats.tokens.values()) == sum(int(b.lengths.sum()) for b in batches)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("read_ahead", ["on", "off"])
def test_stats_are_what_was_handed_out_for_every_plan_kind(tmp_path, tokenizer_dir, monkeypatch, kind, read_ahead):
    monkeypatch.setenv("ZEPHON_READ_AHEAD", read_ahead)
    plan = make_plan(tmp_path, kind, tokenizer_dir)
    manifest = json.loads((plan / "plan.json").read_text(encoding="utf-8"))
    results = []
    for read_chunk in (3, 1024):
        pipe = pipeline(plan, tokenizer_dir, algorithm=algorithm_of(kind), read_chunk=read_chunk)
        it = iter(pipe)
        head = [next(it) for _ in range(5)]
        check(pipe, plan, head)  # part way: only what was handed out, nothing read ahead
        partial = (dict(pipe.stats().documents), dict(pipe.stats().tokens))
        rest = list(it)
        check(pipe, plan, head + rest)
        results.append((partial, pipe.stats().documents, pipe.stats().tokens))
    assert results[0] == results[1]  # chunk sizes never change the stats
    _, documents, tokens = results[0]
    # The whole plan was handed out: every planned document once (best fit splits none here).
    assert documents == {d["name"]: d["planned_documents"] for d in manifest["datasets"]}
    if manifest["kind"] == "exact":
        assert tokens == {d["name"]: d["planned_tokens"] for d in manifest["datasets"]}


@pytest.mark.parametrize("kind", ["samples", "exact_wrap"])
def test_each_rank_counts_its_own_batches_and_a_resumed_run_what_it_hands_out(tmp_path, tokenizer_dir, kind):
    plan = make_plan(tmp_path, kind, tokenizer_dir)
    algorithm = algorithm_of(kind)
    whole = pipeline(plan, tokenizer_dir, algorithm=algorithm)
    list(whole)
    ranks = []
    for rank in (0, 1):
        pipe = pipeline(plan, tokenizer_dir, algorithm=algorithm, dp_rank=rank, dp_size=2)
        batches = list(pipe)
        check(pipe, plan, batches)
        ranks.append(pipe.stats().tokens)
    assert {n: ranks[0][n] + ranks[1][n] for n in ranks[0]} == whole.stats().tokens
    # Resumed: the second run counts only its own batches; a document split at the checkpoint counts once.
    first = pipeline(plan, tokenizer_dir, algorithm=algorithm)
    it = iter(first)
    head = [next(it) for _ in range(7)]
    second = pipeline(plan, tokenizer_dir, algorithm=algorithm)
    second.load_state_dict(first.state_dict())
    rest = list(second)
    check(second, plan, rest)
    for field in ("documents", "tokens"):
        a, b = getattr(first.stats(), field), getattr(second.stats(), field)
        assert {n: a[n] + b[n] for n in a} == getattr(whole.stats(), field), field
    assert yielded(plan, head)[1] == first.stats().tokens


# ---------------------------------------------------------------- skipped documents


def bad_jsonl(root: Path, name: str, bad: set[int], rows: int = 24, pad: int = 0) -> Path:
    """Rows in ``bad`` have a null text; ``pad`` bytes more per line deal a plan without tokens to more lanes."""
    directory = root / name
    directory.mkdir(parents=True)
    lines = [
        json.dumps(
            {"text": None if r in bad else f"{name} document {r} " + "word " * (r % 7), "pad": "x" * pad},
        )
        for r in range(rows)
    ]
    (directory / "part-0.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def skip_plan(root: Path, bad: set[int], pad: int = 0, **kw) -> Path:
    web = bad_jsonl(root, "web", bad, pad=pad)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))],
        mixture=MixtureSpec({"web": 1}),
        seed=0,
        shuffle=ShuffleSpec(enabled=False),
        **kw,
    )
    return source.plan(root / "plan")


@pytest.mark.parametrize("read_ahead", ["on", "off"])
def test_skipped_documents_are_counted_as_batches_move_past_them(tmp_path, tokenizer_dir, monkeypatch, read_ahead):
    monkeypatch.setenv("ZEPHON_READ_AHEAD", read_ahead)
    plan = skip_plan(tmp_path, {2, 3, 11, 20, 23}, lanes=2)
    seen = []
    for read_chunk in (1, 4, 1024):
        pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip", read_chunk=read_chunk)
        batches, counts = [], []
        for batch in pipe:
            batches.append(batch)
            counts.append(sum(pipe.stats().skipped.values()))
        check(pipe, plan, batches)
        assert pipe.stats().skipped == {"null_text": 5}
        assert pipe.stats().documents == {"web": 19}
        seen.append(counts)
    assert seen[0] == seen[1] == seen[2]  # counted at the same batch whatever the chunk size
    assert seen[0][0] < 5  # not all counted up front, as the read-ahead reads them


def test_a_run_that_skipped_every_document_is_an_error(tmp_path, tokenizer_dir) -> None:
    plan = skip_plan(tmp_path, set(range(24)), lanes=2)
    pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    with pytest.raises(
        DatasetError,
        match="^"
        + re.escape(
            'on_bad_document="skip" must leave documents to train on, got all 24 documents of the plan skipped '
            "(null_text 24) — check the text field 'text' and the data; Pipeline.stats().skipped_by_shard names the "
            "shards"
        )
        + "$",
    ):
        list(pipe)
    assert pipe.stats().skipped == {"null_text": 24}
    assert pipe.stats().documents == {"web": 0}


def test_a_rank_whose_whole_share_was_skipped_is_an_error_naming_it(tmp_path, tokenizer_dir) -> None:
    plan = skip_plan(tmp_path, set(range(24)), pad=1000, lanes=2)
    lanes = [d % 2 for d in pq.read_table(plan / "samples.parquet", columns=["deal"]).column(0).to_pylist()]
    assert 0 < sum(lanes) < len(lanes)  # both ranks have a share
    for rank in (0, 1):
        pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip", dp_rank=rank, dp_size=2)
        with pytest.raises(
            DatasetError, match=rf"got all \d+ documents of dp_rank {rank}'s share \(dp_size 2\) skipped"
        ):
            list(pipe)


def test_good_documents_left_are_no_error_and_a_stopped_run_counts_only_the_skips_it_passed(
    tmp_path, tokenizer_dir
) -> None:
    web = tmp_path / "web"
    web.mkdir()
    lines = [{"text": None}] * 24
    lines[0] = lines[23] = {"text": "word " * 100}  # longer than a microbatch (2 rows of 33 tokens)
    (web / "part-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))],
        mixture=MixtureSpec({"web": 1}),
        seed=0,
        shuffle=ShuffleSpec(enabled=False),  # plan order = row order
        lanes=1,
    )
    plan = source.plan(tmp_path / "plan")
    pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    batches = list(pipe)
    assert len(batches) > 2
    assert pipe.stats().documents == {"web": 2} and pipe.stats().skipped == {"null_text": 22}
    stopped = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    it = iter(stopped)
    next(it)  # only row 0: the skipped rows 1-22 are read (read-ahead) but not passed yet
    assert stopped.stats().skipped == {}
    for _ in range(len(batches) - 2):
        next(it)  # the last batch but one reaches row 23, past them
    assert stopped.stats().skipped == {"null_text": 22}


def test_an_empty_share_is_no_error(tmp_path, tokenizer_dir) -> None:
    plan = skip_plan(tmp_path, set(range(24)), lanes=2)  # tiny lines: every document is dealt to lane 0
    assert set(pq.read_table(plan / "samples.parquet", columns=["deal"]).column(0).to_pylist()) == {0}
    pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip", dp_rank=1, dp_size=2)
    assert list(pipe) == [] and pipe.stats().skipped == {}
