"""Dealing estimated plans to packing lanes: chunking never changes a lane, and lanes progress evenly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from zephon.demo import write_demo_dataset
from zephon.io import Dataset
from zephon.planner import lane_dealing as lanes
from zephon.planner.lane_dealing import Dealer
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def test_the_docstring_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes, "QUANTUM", 10)
    deals = Dealer().deal(np.array([4, 4, 8, 3, 12]))
    assert deals.tolist() == [0, 0, 1, 1, 2]
    assert (deals % 2).tolist() == [0, 0, 1, 1, 0] and (deals % 3).tolist() == [0, 0, 1, 1, 2]


def test_chunk_boundaries_never_change_a_lane() -> None:
    rng = np.random.default_rng(0)
    units = rng.integers(0, 20_000, size=5000)
    whole = Dealer().deal(units)
    for _ in range(5):
        cuts = np.sort(rng.integers(0, len(units), size=7))
        dealer = Dealer()
        parts = [dealer.deal(part) for part in np.split(units, cuts)]
        assert np.array_equal(np.concatenate(parts), whole)


def test_a_sample_plan_deals_by_bytes_so_lanes_hold_even_tokens(tmp_path: Path, tokenizer_dir: str) -> None:
    demo = write_demo_dataset(tmp_path)
    datasets = [Dataset.from_path(n, f"{demo}/{n}-*.parquet") for n in ("prose", "code", "short")]

    def source(**kw) -> StaticMixtureWorkSource:
        weights = MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2})
        return StaticMixtureWorkSource(datasets=datasets, mixture=weights, seed=3, num_documents=3000, **kw)

    plan = source().plan(tmp_path / "samples")
    # The same positions with exact token counts: a sample mixture planned with the count pass.
    exact = source(exact_tokens=True).plan(
        tmp_path / "exact", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=512)
    )
    samples, counted = pq.read_table(plan / "samples.parquet"), pq.read_table(exact / "samples.parquet")
    assert samples.column("row").equals(counted.column("row"))
    lane = samples.column("deal").to_numpy() % 8
    tokens = counted.column("tokens").to_numpy().astype(np.int64)
    per_lane = np.zeros((len(lane), 8), np.int64)
    per_lane[np.arange(len(lane)), lane] = tokens
    progress = per_lane.cumsum(axis=0)
    spread = progress.max(axis=1) - progress.min(axis=1)
    totals = progress[-1]
    # Dealing p mod 8 gave 58k..249k tokens per lane here (a spread of 190k growing with the plan).
    assert np.abs(totals / totals.mean() - 1).max() < 0.15, totals
    assert spread.max() < 40_000, spread.max()
