"""Plans over a token store and raw text, checked token for token against the plan's own files (issue #27).

Each test rebuilds every row a run must yield from the plan bundle alone — samples.parquet (and bins.parquet for
best fit) plus the documents' ids: a store document's ids as stored, a text's words' ids then EOS — and asserts
the run's rows equal them exactly: estimated sample and token mixtures (per packing lane), exact wrap plans with
phases and continued from a parent, and exact best-fit packing.

The tokenizer is word-level: ``tN`` is id N, ``</s>`` (2) is EOS, no BOS; so a text's ids are its numbers, then 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_token_store_identity import make_tokenizer
from test_token_store_plans import write_megatron

from zephon import Pipeline
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource, TokenEstimation

LENGTH, GLOBAL = 16, 2


class World:
    """A Megatron store ``web`` (300 documents) and a Parquet text dataset ``prose`` (300 texts) of random ids."""

    def __init__(self, root: Path) -> None:
        rng = np.random.default_rng(11)
        self.docs = [[*rng.integers(3, 60_000, size=int(n)).tolist(), 2] for n in rng.integers(1, 30, size=300)]
        self.texts = [" ".join(f"t{x}" for x in rng.integers(3, 60_000, size=int(n))) for n in rng.integers(1, 30, 300)]
        (root / "store").mkdir()
        (root / "prose").mkdir()
        pq.write_table(pa.table({"text": self.texts}), root / "prose" / "a.parquet", row_group_size=64)
        self.web = Dataset.from_path("web", write_megatron(root / "store" / "web", self.docs))
        self.prose = Dataset.from_path("prose", root / "prose")
        self.tokenizer = make_tokenizer(root / "tok")
        self.root = root

    def ids(self, sample: dict) -> list[int]:
        """The ids a run reads for one planned document (dataset 0: the store; 1: the text, then EOS)."""
        if sample["dataset_id"] == 0:
            return self.docs[sample["row"]]
        return [int(w[1:]) for w in self.texts[sample["row"]].split()] + [2]

    def source(self, weights: tuple[float, float] = (0.5, 0.5), **kw) -> StaticMixtureWorkSource:
        mixture = MixtureSpec({"web": weights[0], "prose": weights[1]})
        return StaticMixtureWorkSource(datasets=[self.web, self.prose], mixture=mixture, seed=7, **kw)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("streams"))


def samples(plan: Path) -> list[dict]:
    return pq.read_table(plan / "samples.parquet").sort_by("position").to_pylist()


def rows_of(plan: Path, world: World, algorithm: str = "wrap") -> dict[tuple[int, int], list[int]]:
    """Every row of a run with dp 1: (step, row in step) → its ids (without padding)."""
    pipe = (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=world.tokenizer)
        .pack_flat(max_length=LENGTH, algorithm=algorithm)
        .batch(microbatch_size=GLOBAL)
    )
    return {(b.step, i): b.tokens[i, : b.lengths[i]].tolist() for b in pipe for i in range(len(b.lengths))}


def by_sequence(plan: Path, world: World, algorithm: str = "wrap") -> list[list[int]]:
    """An exact plan's rows in sequence order (step s, row i is sequence s × GLOBAL + i): plan.json's
    ``packing.sequences`` of them; the rows past them (padding a last step) are empty."""
    rows = rows_of(plan, world, algorithm)
    count = json.loads((plan / "plan.json").read_text())["packing"]["sequences"]
    got = [rows[k] for k in sorted(rows)]
    assert all(not row for row in got[count:]) and len(got) - count < GLOBAL
    return got[:count]


def wrapped(stream: list[int], count: int) -> list[list[int]]:
    return [stream[k * LENGTH : (k + 1) * LENGTH] for k in range(count)]


@pytest.mark.parametrize("mixture", ["samples", "tokens"])
def test_an_estimated_plan_yields_each_lanes_documents_wrapped_token_for_token(world: World, mixture: str) -> None:
    """Estimated plans pack at run time, one lane per row of a step: lane l holds the documents whose deal ≡ l
    (mod GLOBAL), in plan order, wrapped; row l of step s is that stream's s-th row."""
    if mixture == "samples":
        plan = world.source(num_documents=500).plan(world.root / "samples")
    else:
        te = TokenEstimation(calibration_samples=64)
        plan = world.source(num_tokens=6000, token_estimation=te).plan(
            world.root / "tokens", tokenize=TokenizeSpec(tokenizer_id=world.tokenizer)
        )
    planned = samples(plan)
    assert {s["dataset_id"] for s in planned} == {0, 1}
    lanes = [[t for s in planned if s["deal"] % GLOBAL == lane for t in world.ids(s)] for lane in range(GLOBAL)]
    assert all(len(stream) > 4 * LENGTH for stream in lanes)  # both lanes carry documents of both datasets
    rows = rows_of(plan, world)
    steps = max(step for step, _ in rows) + 1
    assert steps >= 4 and len(rows) == steps * GLOBAL
    assert rows == {(s, lane): lanes[lane][s * LENGTH : (s + 1) * LENGTH] for s in range(steps) for lane in range(2)}


def test_an_exact_plan_with_phases_changes_the_mixture_at_its_phase_token_for_token(world: World) -> None:
    """Phase 1 (from document 150) reads only the store: the rows are the plan's documents wrapped."""
    source = world.source(
        num_documents=300,
        exact_tokens=True,
        phases=[Phase(start=150, unit="documents", mixture=MixtureSpec({"web": 1.0}))],
    )
    pack = PackSpec(max_length=LENGTH)
    plan = source.plan(world.root / "phases", tokenize=TokenizeSpec(tokenizer_id=world.tokenizer), pack=pack)
    planned = samples(plan)
    assert {s["dataset_id"] for s in planned[:150]} == {0, 1} and {s["dataset_id"] for s in planned[150:]} == {0}
    stream = [t for s in planned for t in world.ids(s)]
    got = by_sequence(plan, world)
    assert len(got) == -(-len(stream) // LENGTH)  # the last row holds the rest
    assert got == wrapped(stream, len(got))


def test_an_exact_plan_continued_from_another_keeps_its_rows_then_follows_the_new_mixture(world: World) -> None:
    tok, pack = TokenizeSpec(tokenizer_id=world.tokenizer), PackSpec(max_length=LENGTH)
    parent = world.source(num_documents=200, exact_tokens=True).plan(world.root / "parent", tokenize=tok, pack=pack)
    child = world.source((0.9, 0.1), num_documents=300, exact_tokens=True).plan(
        world.root / "child", tokenize=tok, pack=pack, continue_from=parent, at_step=5, global_batch=GLOBAL
    )
    before, after = by_sequence(parent, world), by_sequence(child, world)
    assert after[: 5 * GLOBAL] == before[: 5 * GLOBAL]  # the parent's first 5 steps, id for id
    stream = [t for s in samples(child) for t in world.ids(s)]
    assert after == wrapped(stream, len(after)) and len(after) > len(before) // 2
    tail = [s["dataset_id"] for s in samples(child)[-100:]]
    assert tail.count(0) > 70  # the new segment mixes 0.9 / 0.1


def test_an_exact_best_fit_plan_yields_its_bins_token_for_token(world: World) -> None:
    """bins.parquet says which slice of which document fills each row at which offset."""
    tok, pack = TokenizeSpec(tokenizer_id=world.tokenizer), PackSpec(max_length=LENGTH, algorithm="best_fit")
    plan = world.source(num_documents=200, exact_tokens=True).plan(world.root / "best_fit", tokenize=tok, pack=pack)
    planned = {s["position"]: s for s in samples(plan)}
    want: dict[int, list[int]] = {}
    for b in (
        pq.read_table(plan / "bins.parquet").sort_by([("sequence", "ascending"), ("offset", "ascending")]).to_pylist()
    ):
        row = want.setdefault(b["sequence"], [])
        assert len(row) == b["offset"]
        row += world.ids(planned[b["position"]])[b["doc_start"] : b["doc_start"] + b["length"]]
    got = by_sequence(plan, world, "best_fit")
    assert got == [want[k] for k in sorted(want)] and len(got) > 20
    assert {s["dataset_id"] for s in planned.values()} == {0, 1}
