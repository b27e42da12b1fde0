"""An estimated run's length (``zephon.executor.pack.run_length``): exact when the calibration reads the whole
plan."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.demo_plans import texts_plan

from zephon import Pipeline, ShortRunWarning, ZephonWarning
from zephon.executor.pack import calibration, run_length
from zephon.executor.plan_reader import PlanBundle
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_LENGTH = 33
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "which",
    "or",
    "be",
    "are",
    "this",
    "had",
]


def pipeline(plan: Path, tokenizer_dir: str, *, drop_last: bool = False) -> Pipeline:
    """One row a lane a step: G = 4 = the plan's lanes."""
    return (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=4, drop_last=drop_last)
    )


def lane_lengths(plan: Path, tokenizer_dir: str, *, drop_last: bool) -> tuple[np.ndarray, Pipeline]:
    """Each step's row lengths and the pipeline that made them."""
    pipe = pipeline(plan, tokenizer_dir, drop_last=drop_last)
    lengths = np.stack([batch.lengths for batch in pipe])
    assert len(lengths) == pipe.num_steps()
    return lengths, pipe


def calibrate_on_first(monkeypatch: pytest.MonkeyPatch, documents: int) -> None:
    """The calibration measures the plan's first ``documents`` only, whatever units they hold."""
    monkeypatch.setattr(calibration, "CALIBRATION", documents)
    monkeypatch.setattr(calibration, "CALIBRATION_UNITS", 0)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run_length")
    return texts_plan(root / "web", [f"document {i} " + "word " * (i * 7 % 61) for i in range(600)], root / "plan")


def test_a_plan_the_calibration_reads_whole_ends_on_its_data(plan, tokenizer_dir, monkeypatch) -> None:
    """A plan of at most ``CALIBRATION`` documents is tokenized whole by the calibration, so each lane's tokens
    are known: the run used to add its 3σ margin all the same and end on steps of padding alone (the README's
    demo plan: 5 of its 59 steps)."""
    lengths, pipe = lane_lengths(plan, tokenizer_dir, drop_last=False)
    assert lengths[-1].max() > 0 and pipe.stats().lanes_cut == 0  # the last step holds the longest lane's last row
    full, pipe = lane_lengths(plan, tokenizer_dir, drop_last=True)
    assert (full == MAX_LENGTH).all() and pipe.stats().short_rows == 0
    per_lane = lengths.sum(axis=0)
    assert len(full) == int((per_lane // MAX_LENGTH).min())  # every full row of the shortest lane
    # 100 documents are not enough while they hold fewer than CALIBRATION_UNITS units: still read whole
    monkeypatch.setattr(calibration, "CALIBRATION", 100)
    assert (lane_lengths(plan, tokenizer_dir, drop_last=False)[0] == lengths).all()
    # measured on fewer documents than the plan's (the calibration no longer whole): the margin, and its padding
    calibrate_on_first(monkeypatch, 100)
    estimated, _ = lane_lengths(plan, tokenizer_dir, drop_last=False)
    assert len(estimated) > len(lengths) and (estimated[len(lengths) :] == 0).all()
    assert (estimated[: len(lengths)] == lengths).all()  # the same rows: only the end moved


def test_whole_steps_are_the_longest_lanes_rows_or_the_shortest_lanes_full_ones() -> None:
    lanes = np.array([5000, 3100])
    assert run_length.whole_steps(lanes, 1000, global_batch=2, drop_last=False) == 5
    assert run_length.whole_steps(lanes, 1000, global_batch=2, drop_last=True) == 3
    assert run_length.whole_steps(lanes, 1000, global_batch=4, drop_last=False) == 3  # 2 lanes × 5 rows over G = 4


def test_the_calibration_is_the_shortest_prefix_with_enough_documents_and_units(plan, monkeypatch) -> None:
    """The plan's first documents until both ``count`` documents and ``units`` planned units are held (the units are
    what the margin's calibration term shrinks with: 2,048 short documents measured a heavy-tailed corpus to ±21 %)."""
    monkeypatch.setattr(calibration, "LATE_DOCUMENTS", 0)  # the prefix alone (a dataset with fewer adds its first)
    bundle = PlanBundle(plan)
    rows = pa.concat_tables(pq.read_table(f.path) for f in bundle.checked.samples)
    units = run_length.document_units(bundle)[rows["shard_id"].to_numpy()]  # a sample mixture: bytes per row
    cumulative = np.cumsum(units)
    for count, budget in ((10, 0), (10, int(cumulative[99])), (300, int(cumulative[20])), (1, 10**12)):
        got = calibration.calibration_documents(bundle, count, max_shards=1, units=budget)
        end = min(len(rows), max(count, int(np.searchsorted(cumulative, budget)) + 1))
        assert got.row.tolist() == rows["row"].to_numpy()[:end].tolist(), (count, budget)
        assert got.units.sum() == cumulative[end - 1] and got.whole is (end == len(rows))
    # documents so long that CALIBRATION_MAX_UNITS come first: that many units, however few the documents
    monkeypatch.setattr(calibration, "CALIBRATION_MAX_UNITS", int(cumulative[49]))
    assert len(calibration.calibration_documents(bundle, 300, max_shards=1, units=10**12).row) == 50


def test_each_dataset_is_measured_on_its_own_documents() -> None:
    """A calibration whose mix is not the plan's (its first shards: 900 documents of a dataset at 1 token a unit,
    100 of one at 2) measures each dataset alone and weighs it by each lane's units of it: one pooled ratio
    (1.1) would put lanes of 15,000 real tokens at 11,000 and cut 35 rows of each."""
    real = np.array([9.0, 11.0] * 450 + [19.0, 21.0] * 50)
    units, datasets = np.full(1000, 10.0), np.repeat([0, 1], [900, 100])
    ratios = run_length.Ratios.measure(real, units, datasets, 2)
    assert [round(m.ratio, 6) for m in ratios.by_dataset] == [1.0, 2.0] and ratios.pooled.ratio == pytest.approx(1.1)
    lanes = run_length.LaneUnits(
        units=np.full((2, 2), 5000.0), documents=np.full((2, 2), 500), squares=np.full((2, 2), 50_000.0)
    )
    # T = 5,000 + 10,000; own s_d²·r_d²·Q: 0.01·1·50,000 + 0.0025·4·50,000 = 1,000 tokens², calibration 277.8 + 2,500:
    # √(z_2² · 1,000 + 9 · 2,777.8) / 15,000 = 1.25 % (z_2 = 3.21), so ⌈1.0125 · 150⌉ = 152 rows
    assert run_length.estimated_steps(lanes, ratios, 100, global_batch=2, drop_last=False) == 152
    pooled = run_length.Ratios.single(ratios.pooled, 2)
    assert run_length.estimated_steps(lanes, pooled, 100, global_batch=2, drop_last=False) == 115  # < 150: cut
    few = run_length.Ratios.measure(real[850:], units[850:], datasets[850:], 2)  # 50 of the first: below MIN_STRATUM
    assert few.by_dataset[0] is few.pooled and few.by_dataset[1] is not few.pooled


def test_a_run_that_ends_before_its_data_says_so(tmp_path, tokenizer_dir, monkeypatch) -> None:
    """The end is a measured bound, not a proof: calibration documents unlike the rest (here the first 100 of a shard
    whose later documents are 100 times longer, a sample mixture's units being the shard's mean bytes per row) make
    it fall short. The lanes still holding tokens are counted and warned of, never silent."""
    calibrate_on_first(monkeypatch, 100)
    plan = texts_plan(tmp_path / "web", ["short"] * 300 + ["word " * 100] * 300, tmp_path / "plan")
    pipe = pipeline(plan, tokenizer_dir)
    message = (
        r"an estimated run must end on its data, got [\d,]+ tokens left in 4 packing lane\(s\) \(0, 1, 2, 3\) after"
    )
    with pytest.warns(ShortRunWarning, match=message):
        handed = sum(1 for _ in pipe)
    assert handed == pipe.num_steps() and pipe.stats().lanes_cut == 4
    # through DataLoader workers: once, in the trainer's process (where a filter sees it), for every worker's lanes
    tokens = pipe.stats().tokens_cut
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(1 for _ in pipe.dataloader(num_workers=2)) == handed
    said = [str(w.message) for w in caught if w.category is ShortRunWarning]
    assert len(said) == 1 and f"got {tokens:,} tokens left in 4 packing lane(s) after its {handed} steps" in said[0]


def test_a_run_expected_to_be_mostly_margin_says_so(tmp_path, tokenizer_dir, monkeypatch) -> None:
    """Documents of 1 and 60 words in turn, whose shard knows only their mean size, 50 a lane: each lane's tokens
    are known to about ±10 %, the margin covers all 4 at once, and a third of the rows are expected padding —
    one ``ZephonWarning`` before the first batch, naming the fix."""
    calibrate_on_first(monkeypatch, 100)
    plan = texts_plan(tmp_path / "web", ["word " * (1 if i % 2 else 60) for i in range(200)], tmp_path / "plan")
    pipe = pipeline(plan, tokenizer_dir)
    message = r"an estimated run's rows should be mostly data, got 3\d% expected padding: \d+ steps for about 51 steps"
    with pytest.warns(ZephonWarning, match=message + r".* — plan with exact_tokens=True"):
        steps = pipe.num_steps()
    lengths = np.stack([batch.lengths for batch in pipe])
    assert len(lengths) == steps and pipe.stats().lanes_cut == 0
    assert (lengths == 0).mean() > 0.25  # the padding it announced


def test_a_dataset_of_a_later_phase_is_measured_on_its_own_documents(tmp_path, tokenizer_dir, monkeypatch) -> None:
    """A phase at 80 % of the plan switches to a dataset whose texts tokenize to several times the tokens a byte
    (digits and commas against words): the first documents hold almost none of it, and the pooled ratio of the
    words left every lane with tokens at the end (26,785 of them). Its first ``LATE_DOCUMENTS`` are measured
    wherever they are."""
    from zephon.work import Phase

    for name, texts in (
        ("words", [" ".join(random.Random(i).choices(WORDS, k=15 + i % 60)) for i in range(3000)]),
        ("digits", ["".join(f"{i * j % 97:02d}," for j in range(30 + i % 40)) for i in range(1000)]),
    ):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"text": texts}), tmp_path / name / "part-0.parquet")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, str(tmp_path / n)) for n in ("words", "digits")],
        mixture=MixtureSpec({"words": 1.0, "digits": 0.001}),
        phases=[Phase(start=0.8, mixture=MixtureSpec({"digits": 1.0}))],
        seed=0,
        num_documents=3500,
    )
    plan = source.plan(tmp_path / "plan")
    calibrate_on_first(monkeypatch, 500)
    first = calibration.calibration_documents(PlanBundle(plan), max_shards=2)
    assert (first.dataset[:500] == 1).sum() < run_length.MIN_STRATUM and (first.dataset == 1).sum() == 256
    cuts = {}
    for late in (256, 0):  # 0: the pooled ratio, as before
        monkeypatch.setattr(calibration, "LATE_DOCUMENTS", late)
        pipe = (
            Pipeline.from_plan(plan)
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=65)
            .batch(microbatch_size=8)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert sum(1 for _ in pipe) == pipe.num_steps()
        cuts[late] = (pipe.stats().lanes_cut, any(w.category is ShortRunWarning for w in caught))
    assert cuts[256] == (0, False) and cuts[0][0] > 0 and cuts[0][1]


def drop_a_third(record: dict) -> dict | None:
    """Drops the documents whose text's number is a multiple of 3."""
    return None if int(record["text"].split()[1]) % 3 == 0 else record


def test_documents_the_operators_drop_count_as_none_of_their_units(plan, tokenizer_dir, monkeypatch) -> None:
    """A ``map_transform`` dropping a third of the documents: the calibration measured tokens per unit on the kept
    ones and applied it to every planned unit, overestimating each lane by half — with ``drop_last=True`` the
    run handed out short and empty rows (``stats().short_rows``), with ``drop_last=False`` padding the warning
    did not see. A dropped (or skipped) document now counts as 0 tokens of its units; on this small plan (150
    documents a lane) the margin that leaves is large, and both settings say so."""
    calibrate_on_first(monkeypatch, 100)
    for drop_last, said in ((True, "of its tokens expected left out"), (False, "expected padding")):
        pipe = pipeline(plan, tokenizer_dir, drop_last=drop_last).map_transform(drop_a_third, version=1)
        with pytest.warns(ZephonWarning, match=said):
            lengths = np.stack([batch.lengths for batch in pipe])
        assert pipe.stats().short_rows == 0 and pipe.stats().lanes_cut == 0
        assert (lengths == MAX_LENGTH).all() or not drop_last


def test_a_small_plan_of_local_files_is_calibrated_whole_in_any_shards(tmp_path, tokenizer_dir) -> None:
    """1,000 documents in 20 local shards: the shards a run opens first hold a fraction of them, which made the end
    an estimate with its margin (206 steps at G = 8 where the longest lane held 181 rows). Local files cost no
    download, so a plan the calibration would take whole is read whole, whatever shards hold it: an exact end."""
    web = tmp_path / "web"
    web.mkdir()
    for k in range(20):
        texts = [" ".join(random.Random(k * 50 + i).choices(WORDS, k=5 + i % 40)) for i in range(50)]
        pq.write_table(pa.table({"text": texts}), web / f"part-{k:02d}.parquet")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))], mixture=MixtureSpec({"web": 1}), seed=0
    )
    plan = source.plan(tmp_path / "plan")
    first = calibration.calibration_documents(PlanBundle(plan), max_shards=2)
    assert first.whole and len(first.row) == 1000 and len(np.unique(first.shard_id)) == 20
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=65).batch(microbatch_size=8)
    )
    lengths = np.stack([batch.lengths for batch in pipe])
    assert lengths[-1].max() > 0 and pipe.stats().lanes_cut == 0  # the last step holds the longest lane's last row
