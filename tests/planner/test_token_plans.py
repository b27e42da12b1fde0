"""Token mixtures and exact plans: estimated shares, exact counts, windows that hold their shares, best fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError
from zephon.executor.encode.text import Encoder
from zephon.executor.exact import ExactSequences
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.runner import iterate_batches
from zephon.executor.settings import ExecutorSpec
from zephon.io import Dataset
from zephon.planner.best_fit import pack, padding_fraction
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "light",
    "cloud",
    "market",
    "garden",
    "number",
    "signal",
    "window",
    "paper",
]
WEIGHTS = {"long": 0.5, "mid": 0.3, "short": 0.2}


def _docs(seed: int, n: int, mean_words: int) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, mean_words // 2), mean_words * 3 // 2 + 1, size=n)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=k)) for k in lengths]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """Three datasets whose mean document lengths differ by 20× (400, 100, 20 words)."""
    root = tmp_path_factory.mktemp("corpus")
    out = {}
    for seed, (name, n, mean, shards) in enumerate(
        (("long", 600, 400, 3), ("mid", 1200, 100, 2), ("short", 3000, 20, 2))
    ):
        docs = _docs(seed, n, mean)
        (root / name).mkdir()
        per = -(-n // shards)
        for s in range(shards):
            pq.write_table(
                pa.table({"text": docs[s * per : (s + 1) * per]}), root / name / f"{s}.parquet", row_group_size=100
            )
        out[name] = root / name
    return out


def source(corpus, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, p) for n, p in corpus.items()],
        mixture=MixtureSpec(WEIGHTS),
        seed=11,
        token_estimation=kw.pop("token_estimation", TokenEstimation(calibration_samples=256, calibration_shards_max=2)),
        **kw,
    )


def independent_tokens(plan: Path, tokenizer_dir: str) -> np.ndarray:
    """Every planned document tokenized directly with `tokenizers` (+ EOS), in plan order."""
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    shards = pq.read_table(plan / "shards.parquet").to_pylist()
    samples = pq.read_table(plan / "samples.parquet", columns=["shard_id", "row"]).to_pydict()
    texts = {sh["shard_id"]: pq.read_table(sh["uri"]).column("text").to_pylist() for sh in shards}
    docs = [texts[s][r] for s, r in zip(samples["shard_id"], samples["row"], strict=True)]
    return np.array([len(e.ids) + 1 for e in tok.encode_batch(docs, add_special_tokens=False)])


def test_estimated_plan_records_ratios_provenance_and_both_shares(corpus, tokenizer_dir, tmp_path) -> None:
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    plan = source(corpus).plan(tmp_path / "p", tokenize=tok)
    m = json.loads((plan / "plan.json").read_text())
    assert m["mixture"]["unit"] == "tokens" and m["kind"] == "estimated" and m["packing"] is None
    for name in WEIGHTS:
        prov = m["token_estimation"][name]
        assert prov["method"] == "measure" and prov["byte_unit"] == "utf8 text"
        assert prov["calibration"]["documents"] == 256 and len(prov["calibration"]["shards"]) == 2
        assert prov["tokens_per_byte"] == prov["calibration"]["tokens"] / prov["calibration"]["bytes"]
    planned = {d["name"]: d["planned_token_share"] for d in m["datasets"]}
    assert all(abs(planned[n] - w) < 0.005 for n, w in WEIGHTS.items())
    # Realized shares, from running the plan, are reported by the pipeline and close to the estimate.
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=129).batch(microbatch_size=8)
    )
    for _ in pipe:
        pass
    realized = pipe.stats().token_shares()
    assert all(abs(realized[n] - planned[n]) < 0.02 for n in WEIGHTS)
    expected = independent_tokens(plan, tokenizer_dir)
    ids = pq.read_table(plan / "samples.parquet").column("dataset_id").to_numpy()
    assert sum(pipe.stats().tokens.values()) == int(expected.sum())
    assert pipe.stats().tokens["long"] == int(expected[ids == 0].sum())


def test_calibration_is_seeded_and_pinned_ratios_skip_it(corpus, tokenizer_dir, tmp_path) -> None:
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    a = source(corpus).plan(tmp_path / "a", tokenize=tok)
    b = source(corpus).plan(tmp_path / "b", tokenize=tok)
    assert (a / "samples.parquet").read_bytes() == (b / "samples.parquet").read_bytes()
    pinned = source(corpus, token_estimation=TokenEstimation(primer={"long": 0.3, "mid": 0.3, "short": 0.3}))
    m = json.loads((pinned.plan(tmp_path / "c", tokenize=tok) / "plan.json").read_text())
    assert m["token_estimation"]["long"] == {
        "method": "pinned",
        "tokens_per_byte": 0.3,
        "byte_unit": "utf8 text",
        "specials": 1,
    }


def test_a_token_count_column_is_used_as_counts(corpus, tokenizer_dir, tmp_path) -> None:
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    for f in sorted((corpus["short"]).glob("*.parquet")):
        t = pq.read_table(f)
        counts = [len(e.ids) for e in tok.encode_batch(t.column("text").to_pylist(), add_special_tokens=False)]
        pq.write_table(t.append_column("token_count", pa.array(counts, pa.int64())), tmp_path / f.name)
    ds = {**corpus, "short": tmp_path}
    te = TokenEstimation(calibration_samples=64, token_count_columns={"short": "token_count"})
    plan = source(ds, token_estimation=te).plan(tmp_path / "p", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir))
    m = json.loads((plan / "plan.json").read_text())
    assert m["token_estimation"]["short"] == {"method": "column", "column": "token_count", "specials": 1}
    s = pq.read_table(plan / "samples.parquet").to_pydict()
    short = np.array(s["dataset_id"]) == 2
    assert np.array_equal(np.array(s["tokens"])[short], independent_tokens(plan, tokenizer_dir)[short])


def window_shares(plan: Path, tokens: np.ndarray, batch_tokens: int, window: int) -> np.ndarray:
    """Token share of each dataset in every window of `window` consecutive batches (wrap: stream slices)."""
    ids = pq.read_table(plan / "samples.parquet").column("dataset_id").to_numpy()
    stream_owner = np.repeat(ids, tokens)
    n_batches = len(stream_owner) // batch_tokens
    per_batch = np.stack(
        [np.bincount(stream_owner[b * batch_tokens : (b + 1) * batch_tokens], minlength=3) for b in range(n_batches)]
    )
    sums = np.cumsum(np.vstack([np.zeros((1, 3)), per_batch]), axis=0)
    windows = sums[window:] - sums[:-window]
    return windows / windows.sum(axis=1, keepdims=True)


def test_exact_plan_holds_token_shares_in_every_window_of_100_batches(corpus, tokenizer_dir, tmp_path) -> None:
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    plan = source(corpus, exact_tokens=True).plan(tmp_path / "p", tokenize=tok, pack=PackSpec(max_length=257))
    m = json.loads((plan / "plan.json").read_text())
    assert m["kind"] == "exact" and m["packing"]["algorithm"] == "wrap"
    tokens = independent_tokens(plan, tokenizer_dir)
    planned = pq.read_table(plan / "samples.parquet").column("tokens").to_numpy()
    assert np.array_equal(planned, tokens)  # exact counts are exact
    shares = window_shares(plan, tokens, batch_tokens=8 * 257, window=100)
    assert len(shares) > 100
    worst = np.abs(shares - np.array(list(WEIGHTS.values()))).max()
    print(f"worst window deviation {worst:.4%} over {len(shares)} windows")
    assert worst <= 0.01, worst


def test_exact_wrap_sequences_are_stream_slices_and_random_access(corpus, tokenizer_dir, tmp_path) -> None:
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    pack_spec = PackSpec(max_length=64)
    plan = source(corpus, exact_tokens=True, num_tokens=40_000).plan(tmp_path / "p", tokenize=tok, pack=pack_spec)
    spec = ExecutorSpec(tokenize=tok, pack=pack_spec, batch=BatchSpec(microbatch_size=5))
    batches = list(iterate_batches(plan, spec))
    rows = np.concatenate([b.tokens for b in batches])
    lengths = np.concatenate([b.lengths for b in batches])
    stream = np.concatenate([rows[i, : lengths[i]] for i in range(len(rows))])
    m = json.loads((plan / "plan.json").read_text())
    n = m["packing"]["sequences"]
    assert len(stream) == m["totals"]["tokens"] and len(rows) == -(-n // 5) * 5
    assert (lengths[n:] == 0).all()  # the last microbatch is filled with empty rows past the plan
    rows, lengths = rows[:n], lengths[:n]
    assert (lengths[:-1] == 64).all() and 0 < lengths[-1] <= 64
    bundle = PlanBundle(plan)
    encoder = Encoder(tok)
    seqs = ExactSequences(bundle, encoder, ShardReader(bundle.shards, "text", capacity=8), encoder.pad_id)
    for k in (len(rows) - 1, 0, 417, 33):  # any order, no state carried between calls
        assert np.array_equal(seqs.rows([k]).tokens[0], rows[k])


def test_best_fit_keeps_documents_whole_and_reports_padding_against_first_fit(corpus, tokenizer_dir, tmp_path) -> None:
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    pack_spec = PackSpec(max_length=257, algorithm="best_fit", oversize="split")
    plan = source(corpus, exact_tokens=True).plan(tmp_path / "p", tokenize=tok, pack=pack_spec)
    m = json.loads((plan / "plan.json").read_text())["packing"]
    assert 0 <= m["padding_fraction"] <= m["first_fit_padding_fraction"] < 0.2
    batches = list(
        iterate_batches(plan, ExecutorSpec(tokenize=tok, pack=pack_spec, batch=BatchSpec(microbatch_size=8)))
    )
    assert sum(len(b) for b in batches) == m["sequences"]
    bins = pq.read_table(plan / "bins.parquet").to_pydict()
    counts = pq.read_table(plan / "samples.parquet").column("tokens").to_numpy()
    # Every token of every document is placed exactly once; unsplit documents sit in one row.
    placed = np.bincount(np.array(bins["position"]), weights=np.array(bins["length"]), minlength=len(counts))
    assert np.array_equal(placed.astype(np.int64), counts)
    short_docs = counts <= 257
    pieces_per_doc = np.bincount(np.array(bins["position"]), minlength=len(counts))
    assert (pieces_per_doc[short_docs] == 1).all()
    assert m["split_documents"] == int((~short_docs).sum())


def test_best_fit_docstring_example_and_drop_counting() -> None:
    bins = pack(np.array([6, 5, 4, 3, 12]), 10)
    assert bins.sequence.tolist() == [0, 0, 1, 1, 1, 2]
    assert bins.position.tolist() == [0, 2, 1, 3, 4, 4] and bins.doc_start.tolist() == [0, 0, 0, 0, 10, 0]
    assert bins.padding_tokens == 0 and bins.split_documents == 1
    dropped = pack(np.array([6, 5, 4, 3, 12]), 10, oversize="drop")
    assert dropped.dropped_documents == 1 and dropped.dropped_tokens == 12
    assert padding_fraction(dropped, 10) == pytest.approx(2 / 20)


def test_exact_plan_refuses_other_settings(corpus, tokenizer_dir, tmp_path) -> None:
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    plan = source(corpus, exact_tokens=True, num_tokens=5000).plan(
        tmp_path / "p", tokenize=tok, pack=PackSpec(max_length=64)
    )
    spec = ExecutorSpec(tokenize=tok, pack=PackSpec(max_length=128), batch=BatchSpec(microbatch_size=2))
    with pytest.raises(ConfigError, match="planned with, got max_length 128 \\(planned 64\\)"):
        next(iterate_batches(plan, spec))
    other = ExecutorSpec(
        tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=True),
        pack=PackSpec(max_length=64),
        batch=BatchSpec(microbatch_size=2),
    )
    with pytest.raises(ConfigError, match="fingerprints differ"):
        next(iterate_batches(plan, other))


def test_count_pass_caches_per_shard_and_tokenizer(corpus, tokenizer_dir) -> None:
    from zephon.planner.prepare import prepare

    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    first = prepare(source(corpus, exact_tokens=True), tokenize=tok, pack=PackSpec(max_length=64), workers=2)
    assert first.count_report is not None and first.count_report.counted == 7 and first.count_report.cached == 0
    again = prepare(source(corpus, exact_tokens=True), tokenize=tok, pack=PackSpec(max_length=64))
    assert again.count_report is not None and again.count_report.counted == 0 and again.count_report.cached == 7
    assert again.count_report.tokens == first.count_report.tokens
    bos = prepare(
        source(corpus, exact_tokens=True),
        tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=True),
        pack=PackSpec(max_length=64),
    )
    assert bos.count_report is not None and bos.count_report.counted == 7
    assert bos.count_report.tokens == first.count_report.tokens + sum(d["rows"] for d in bos.config["datasets"])


def test_changed_data_under_an_exact_plan_is_refused(corpus, tokenizer_dir, tmp_path) -> None:
    import shutil

    copy = {n: Path(shutil.copytree(p, tmp_path / n)) for n, p in corpus.items()}
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    plan = source(copy, exact_tokens=True, num_tokens=3000).plan(
        tmp_path / "p", tokenize=tok, pack=PackSpec(max_length=64)
    )
    for f in (copy["long"]).glob("*.parquet"):
        t = pq.read_table(f)
        pq.write_table(pa.table({"text": [x.upper() for x in t.column("text").to_pylist()]}), f, row_group_size=100)
    spec = ExecutorSpec(tokenize=tok, pack=PackSpec(max_length=64), batch=BatchSpec(microbatch_size=2))
    with pytest.raises(DatasetError, match="dataset 'long'"):
        list(iterate_batches(plan, spec))
