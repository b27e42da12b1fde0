"""Homogeneous packing: exact windows on a corpus whose longest documents exceed 50× the sequence length.

Shares are recomputed from the batches the executor yields (each row's tokens attributed through the plan's
pieces) and from documents tokenized independently with `tokenizers`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from zephon.errors import ConfigError
from zephon.executor.encode.text import Encoder
from zephon.executor.runner import iterate_batches
from zephon.executor.settings import ExecutorSpec
from zephon.inspection.audit import AuditSpec, audit_plan
from zephon.io import Dataset
from zephon.planner.homogeneous import homogeneous
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource, TokenEstimation

WEIGHTS = {"prose": 0.5, "code": 0.3, "short": 0.2}
L, BATCH, WINDOW = 33, 8, 100
WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "cloud", "market", "garden"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """prose: 1500 documents of ~40 words; code: 60 documents, a few of 2000+ words (> 50 × L tokens);
    short: 6000 documents of ~4 words."""
    root = tmp_path_factory.mktemp("homog")
    rng = np.random.default_rng(3)
    out = {}
    for name, n, lengths in (
        ("prose", 1500, lambda k: rng.integers(20, 60, k)),
        ("code", 60, lambda k: np.where(rng.random(k) < 0.15, rng.integers(2000, 2600, k), rng.integers(50, 700, k))),
        ("short", 6000, lambda k: rng.integers(2, 7, k)),
    ):
        docs = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), m)) for m in lengths(n)]
        (root / name).mkdir()
        pq.write_table(pa.table({"text": docs}), root / name / "0.parquet", row_group_size=200)
        out[name] = root / name
    return out


def _plan(corpus: dict[str, Path], tmp_path: Path, tokenizer_dir: str, algorithm: str) -> Path:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, p) for n, p in corpus.items()],
        mixture=MixtureSpec(WEIGHTS),
        seed=9,
        token_estimation=TokenEstimation(calibration_samples=64),
        exact_tokens=True,
        num_tokens=400_000,
    )
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    return source.plan(tmp_path / algorithm, tokenize=tok, pack=PackSpec(max_length=L, algorithm=algorithm))


def _row_shares(plan: Path, tokenizer_dir: str, algorithm: str) -> np.ndarray:
    """Tokens per dataset in every row the executor yields, attributed through the rows' pieces."""
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    spec = ExecutorSpec(
        tokenize=tok, pack=PackSpec(max_length=L, algorithm=algorithm), batch=BatchSpec(microbatch_size=BATCH)
    )
    owner = pq.read_table(plan / "samples.parquet").column("dataset_id").to_numpy()
    per_row = []
    for batch in iterate_batches(plan, spec):
        pieces = batch.pieces
        counts = np.zeros((len(batch.lengths), 3))
        np.add.at(counts, (pieces["row"], owner[pieces["position"]]), pieces["length"])
        assert np.array_equal(counts.sum(axis=1), batch.lengths)
        per_row.append(counts)
    return np.concatenate(per_row)


def _worst_window(per_row: np.ndarray) -> float:
    rows = len(per_row) // BATCH * BATCH
    per_batch = per_row[:rows].reshape(-1, BATCH, 3).sum(axis=1)
    sums = np.cumsum(np.vstack([np.zeros((1, 3)), per_batch]), axis=0)
    windows = sums[WINDOW:] - sums[:-WINDOW]
    shares = windows / windows.sum(axis=1, keepdims=True)
    return float(np.abs(shares - np.array(list(WEIGHTS.values()))).max())


def test_homogeneous_rows_hold_every_window_where_wrap_does_not(corpus, tmp_path, tokenizer_dir) -> None:
    texts = {n: pq.read_table(p / "0.parquet").column("text").to_pylist() for n, p in corpus.items()}
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    longest = max(len(e.ids) for e in tok.encode_batch(texts["code"], add_special_tokens=False))
    assert longest > 50 * L  # the case the issue measured
    worst = {}
    for algorithm in ("wrap", "homogeneous"):
        plan = _plan(corpus, tmp_path, tokenizer_dir, algorithm)
        per_row = _row_shares(plan, tokenizer_dir, algorithm)
        assert len(per_row) // BATCH > 3 * WINDOW
        worst[algorithm] = _worst_window(per_row)
        if algorithm == "homogeneous":
            filled = per_row[per_row.sum(axis=1) > 0]  # the last microbatch is completed with empty rows
            assert ((filled > 0).sum(axis=1) == 1).all()  # every row holds one dataset
            m = json.loads((plan / "plan.json").read_text())
            assert m["packing"]["window_bound_rows"] == 2
            audit = audit_plan(plan, AuditSpec(batch_size=BATCH, window=WINDOW))
            assert audit.bound_pp is not None and audit.bound_pp == pytest.approx(100 * 2 / (WINDOW * BATCH))
            assert audit.ok
    print(f"worst window: wrap {worst['wrap']:.4%}, homogeneous {worst['homogeneous']:.4%}")
    assert worst["wrap"] > 0.01  # one long document moves a window of wrap
    assert worst["homogeneous"] <= 0.01


def test_each_dataset_s_rows_are_its_own_stream_in_order(corpus, tmp_path, tokenizer_dir) -> None:
    plan = _plan(corpus, tmp_path, tokenizer_dir, "homogeneous")
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    spec = ExecutorSpec(
        tokenize=tok, pack=PackSpec(max_length=L, algorithm="homogeneous"), batch=BatchSpec(microbatch_size=BATCH)
    )
    samples = pq.read_table(plan / "samples.parquet").to_pydict()
    texts = {n: pq.read_table(p / "0.parquet").column("text").to_pylist() for n, p in corpus.items()}
    names = list(WEIGHTS)
    tokenizer = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    eos = Encoder(tok).eos_id  # the id the pipeline appends; the texts are tokenized by `tokenizers` here
    assert Encoder(tok).prefix == []
    streams: dict[int, list[np.ndarray]] = {0: [], 1: [], 2: []}
    for batch in iterate_batches(plan, spec):
        for r in range(len(batch.lengths)):
            n = int(batch.lengths[r])
            if n:
                d = int(samples["dataset_id"][int(batch.pieces["position"][batch.pieces["row"] == r][0])])
                streams[d].append(batch.tokens[r, :n])
    for d in range(3):
        got = np.concatenate(streams[d])
        docs = [
            texts[names[d]][row] for did, row in zip(samples["dataset_id"], samples["row"], strict=True) if did == d
        ]
        want = np.concatenate(
            [
                np.array(e.ids + ([eos] if eos is not None else []))
                for e in tokenizer.encode_batch(docs, add_special_tokens=False)
            ]
        )
        assert len(got) == len(want)
        if eos is not None:
            assert np.array_equal(got, want)


def test_docstring_example_and_refusals(corpus, tmp_path, tokenizer_dir) -> None:
    b = homogeneous(np.array([6, 2, 3]), np.array([0, 0, 1]), 4)
    rows = list(
        zip(
            b.sequence.tolist(),
            b.offset.tolist(),
            b.position.tolist(),
            b.doc_start.tolist(),
            b.length.tolist(),
            strict=True,
        )
    )
    assert rows == [(0, 0, 0, 0, 4), (1, 0, 2, 0, 3), (2, 0, 0, 4, 2), (2, 2, 1, 0, 2)]
    assert (b.sequences, b.padding_tokens, b.split_documents) == (3, 1, 1)
    with pytest.raises(ConfigError, match=r'pack_flat algorithm must be "wrap", "best_fit" or "homogeneous"'):
        PackSpec(max_length=8, algorithm="homog")
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    estimated = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, p) for n, p in corpus.items()],
        mixture=MixtureSpec(WEIGHTS),
        seed=1,
        token_estimation=TokenEstimation(calibration_samples=64),
    )
    with pytest.raises(ConfigError, match=r'algorithm="homogeneous"\) must run on an exact plan'):
        estimated.plan(tmp_path / "e", tokenize=tok, pack=PackSpec(max_length=L, algorithm="homogeneous"))
    phased = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, p) for n, p in corpus.items()],
        mixture=MixtureSpec(WEIGHTS),
        seed=1,
        token_estimation=TokenEstimation(calibration_samples=64),
        exact_tokens=True,
        num_tokens=10_000,
        phases=[Phase(start=0.5, mixture=MixtureSpec({"prose": 1.0}))],
    )
    with pytest.raises(ConfigError, match=r"must plan a static mixture, got phases"):
        phased.plan(tmp_path / "f", tokenize=tok, pack=PackSpec(max_length=L, algorithm="homogeneous"))
