"""A bundle that cannot fit on its disk is refused in one line before any layout, for every budget and plan kind:
token mixtures (estimated and exact), cost mixtures, selections with a sidecar and continuations, not only
``num_documents`` and ``epochs`` (tests/reliability/test_reliability_bounds.py). A ``num_tokens``/``num_cost``
budget B over passes of mean m and excess C (the tokens above the mean) needs ``D ≥ (B − ΣC) / max m`` documents
(``zephon.planner.room``; 2·ΣC for a continuation); a budget of 10^15 tokens needs hundreds of TiB, so the real disk refuses it.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

BUDGET = 10**15
#: Per dataset: the token_count column of its documents, two shards each (a dataset's own counts: no calibration).
COUNTS = {"web": [[3, 9, 4], [7, 1]], "code": [[20, 30], [10, 40, 50]]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("room")
    for name, shards in COUNTS.items():
        (root / name).mkdir()
        for s, counts in enumerate(shards):
            ids = [f"{name}-{s}-{r}" for r in range(len(counts))]
            text = [f"{name} shard {s} row {r} " + "word " * c for r, c in enumerate(counts)]
            table = pa.table({"id": ids, "text": text, "token_count": pa.array(counts, pa.int64())})
            pq.write_table(table, root / name / f"part-{s}.parquet", row_group_size=2)
    (root / "side").mkdir()
    side = {"id": ["web-0-0", "web-0-1", "web-0-2", "web-1-0", "web-1-1"], "quality": [0.9, 0.1, 0.8, 0.2, 0.7]}
    pq.write_table(pa.table(side), root / "side" / "q.parquet")
    return root


def _source(corpus: Path, datasets: list[Dataset] | None = None, **kw) -> StaticMixtureWorkSource:
    datasets = datasets or [Dataset.from_path(n, corpus / n) for n in COUNTS]
    columns = {d.name: "token_count" for d in datasets}
    kw.setdefault("token_estimation", TokenEstimation(calibration_samples=8, token_count_columns=columns))
    return StaticMixtureWorkSource(
        datasets=datasets, mixture=MixtureSpec({d.name: 1.0 for d in datasets}), seed=4, **kw
    )


def _refusal(out: Path, documents: int, per: float, budget: str = "num_tokens", unit: str = "tokens") -> str:
    """The one line, with the free space left open."""
    need = documents * 4 / 2**30
    return (
        rf"^the plan bundle must fit on the disk of {re.escape(str(out))}, got about {need:.1f} GiB needed for "
        rf"{documents} documents \(≥ 4 bytes each; {budget} {BUDGET} at ≤ {per:.1f} {unit} a document\) and "
        rf"[\d.]+ GiB free — lower {budget}, free space, or write the plan to another disk$"
    )


def _bound(docs: list[list[int]], placed: int = 0, done: int = 0, s: int = 1) -> tuple[int, float]:
    """The documents the room check must count, by hand: per dataset one pass's document tokens; ``s`` is 2 for a
    continuation (a partial pass at each end)."""
    means = [Fraction(sum(d), len(d)) for d in docs]
    excess = sum(sum(max(0, t - m) for t in d) for d, m in zip(docs, means, strict=True))
    longest = max(means)
    return placed + max(0, math.ceil((BUDGET - done - s * excess) / longest)), float(longest)


def _first_passes(rows: dict[str, list]) -> list[list[int]]:
    """Each dataset's first pass (its epoch 0) in a written plan's samples: its documents' tokens."""
    first = [(d, t) for d, t, e in zip(rows["dataset_id"], rows["tokens"], rows["epoch"], strict=True) if e == 0]
    return [[t for d, t in first if d == i] for i in range(2)]


def test_a_token_mixture_of_10_to_the_15_tokens_is_refused_with_its_estimate(corpus, tokenizer_dir, tmp_path):
    # A count column's documents are its value + 1 (the EOS): web 4 10 5 8 2 (mean 5.8, 6.4 above it), code
    # 21 31 11 41 51 (mean 31, 30 above it): D ≥ (10^15 − 36.4) / 31.
    documents, per = _bound([[4, 10, 5, 8, 2], [21, 31, 11, 41, 51]])
    assert documents == 32_258_064_516_128 and per == 31.0
    out = tmp_path / "plans" / "tokens"
    with pytest.raises(ConfigError, match=_refusal(out, documents, per)):
        _source(corpus, num_tokens=BUDGET).plan(out, tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir))
    assert not (tmp_path / "plans").exists()  # refused before the writer's lock or temporary


@pytest.mark.filterwarnings("ignore:heavy repetition")
def test_a_plan_that_fits_is_written_and_its_budget_bounds_its_documents(corpus, tokenizer_dir, tmp_path):
    """The bound is a lower bound: plans of one pass (184 tokens; 2·ΣE would bound it by 0) and of 1000 tokens hold
    at least the documents it counts."""
    from zephon.planner.prepare import prepare
    from zephon.planner.room import planned_documents

    tokenize = TokenizeSpec(tokenizer_id=tokenizer_dir)
    for budget, expected in ((184, 5), (1000, 32)):  # ⌈(B − 36.4) / 31⌉
        source = _source(corpus, num_tokens=budget)
        bound = planned_documents(prepare(source, tokenize=tokenize))
        plan = source.plan(tmp_path / str(budget), tokenize=tokenize)
        written = pq.read_table(plan / "samples.parquet", columns=["tokens"]).column("tokens").to_pylist()
        assert bound == math.ceil((budget - Fraction(364, 10)) / 31) == expected and len(written) >= bound
        assert sum(written) >= budget and sum(written[:-1]) < budget


def test_an_exact_token_plan_is_refused_from_its_counted_passes(corpus, tokenizer_dir, tmp_path):
    tokenize, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=33)
    one_pass = _source(corpus, exact_tokens=True, epochs=1).plan(tmp_path / "pass", tokenize=tokenize, pack=pack)
    rows = pq.read_table(one_pass / "samples.parquet").to_pydict()
    passes = _first_passes(rows)
    documents, per = _bound(passes)
    out = tmp_path / "exact"
    with pytest.raises(ConfigError, match=_refusal(out, documents, per)):
        _source(corpus, exact_tokens=True, num_tokens=BUDGET).plan(out, tokenize=tokenize, pack=pack)
    assert not out.exists()


def test_a_cost_mixture_is_refused_from_its_costs(corpus, tmp_path):
    datasets = [
        Dataset.from_path("web", corpus / "web", cost="3"),
        Dataset.from_path("code", corpus / "code", cost="token_count"),
    ]
    source = _source(corpus, datasets, token_estimation=None, mixture_unit="cost", num_cost=BUDGET)
    documents, per = _bound([[3] * 5, [20, 30, 10, 40, 50]])  # web never above its mean; code 30 above 30
    assert documents == 33_333_333_333_333
    with pytest.raises(ConfigError, match=_refusal(tmp_path / "c", documents, per, "num_cost", "cost")):
        source.plan(tmp_path / "c")


def test_a_selection_with_a_sidecar_counts_only_its_selected_rows(corpus, tokenizer_dir, tmp_path):
    # quality > 0.5 keeps web-0-0, web-0-2, web-1-1: 3 documents of 4 + 5 + 2 = 11 tokens, longer on average
    # than all of web (29 / 5) — so the bound rises.
    web = Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="id", where="quality > 0.5")
    documents, per = _bound([[4, 5, 2]])
    assert documents == 272_727_272_727_273
    with pytest.raises(ConfigError, match=_refusal(tmp_path / "s", documents, per)):
        _source(corpus, [web], num_tokens=BUDGET).plan(
            tmp_path / "s", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir)
        )


def test_a_continuation_counts_its_kept_prefix_and_the_new_segment(corpus, tokenizer_dir, tmp_path):
    tokenize, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=9)
    parent = _source(corpus, exact_tokens=True, epochs=1).plan(tmp_path / "parent", tokenize=tokenize, pack=pack)
    rows = pq.read_table(parent / "samples.parquet").to_pydict()
    # Step 1 of 2 rows of 9 tokens ends at token 18: the prefix is the documents starting before it.
    placed = sum(1 for o in rows["token_offset"] if o < 18)
    done = rows["token_offset"][placed]
    passes = _first_passes(rows)
    documents, per = _bound(passes, placed, done, s=2)
    assert 0 < placed < len(rows["position"])
    out = tmp_path / "child"
    with pytest.raises(ConfigError, match=_refusal(out, documents, per)):
        _source(corpus, exact_tokens=True, num_tokens=BUDGET).plan(
            out, tokenize=tokenize, pack=pack, continue_from=parent, at_step=1, global_batch=2
        )
    assert not out.exists()
