"""Any cluster size: a default plan runs, with identical global batches and the same number of steps on every
rank, at every data-parallel size dividing the global batch; states move between sizes; each rank tokenizes
only its own documents (plus the bounded calibration of ``zephon.executor.pack.run_length``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from zephon import Pipeline, merge_states
from zephon.errors import ConfigError
from zephon.executor.encode.text import Encoder
from zephon.executor.pack import calibration, run_length
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_LENGTH = 65
GLOBAL = 48  # divisible by 1, 2, 3, 4, 6, 8, 12, 16, 24, 48
SIZES = [d for d in range(1, GLOBAL + 1) if GLOBAL % d == 0]


@pytest.fixture(scope="module")
def plans(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """A plan made with the defaults (a sample mixture, no lanes, no tokenizer) and an exact plan."""
    from zephon.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("cluster")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    write_demo_dataset(root / "data")
    datasets = [
        Dataset.from_path(name, str(root / "data" / "demo" / f"{name}-*.parquet"))
        for name in ("prose", "code", "short")
    ]
    mixture = MixtureSpec({"prose": 0.5, "code": 0.2, "short": 0.3})
    default = StaticMixtureWorkSource(datasets=datasets, mixture=mixture, seed=11, num_documents=900)
    exact = StaticMixtureWorkSource(datasets=datasets, mixture=mixture, seed=11, num_documents=900, exact_tokens=True)
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    return {
        "estimated": default.plan(root / "estimated"),
        "exact": exact.plan(root / "exact", tokenize=tok, pack=PackSpec(max_length=MAX_LENGTH)),
    }


def pipeline(plan: Path, tokenizer_dir: str, rank: int, size: int, *, drop_last: bool = False) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(dp_rank=rank, dp_size=size)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=GLOBAL // size, global_batch_size=GLOBAL, drop_last=drop_last)
    )


Rows = dict[int, dict[int, bytes]]  # step → sequence id → its valid tokens


def collect(batches, into: Rows) -> int:
    """Add the batches' rows to ``into``; the number of steps seen."""
    steps = set()
    for batch in batches:
        steps.add(batch.step)
        for i, j in enumerate(batch.sequences.tolist()):
            into.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
    return len(steps)


def hashes(rows: Rows) -> list[str]:
    return [hashlib.sha256(b"".join(r[j] for j in sorted(r))).hexdigest() for _, r in sorted(rows.items())]


def run_all_ranks(plan: Path, tokenizer_dir: str, size: int, *, drop_last: bool = False) -> tuple[list[str], set[int]]:
    """Step hashes of all ranks together, and the number of steps each rank yielded."""
    rows: Rows = {}
    ends = {collect(pipeline(plan, tokenizer_dir, r, size, drop_last=drop_last), rows) for r in range(size)}
    return hashes(rows), ends


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_every_dp_size_dividing_the_global_batch_gives_the_same_global_batches_and_ends_on_the_same_step(
    plans, tokenizer_dir, kind
) -> None:
    reference, (steps,) = run_all_ranks(plans[kind], tokenizer_dir, 1)
    assert steps == pipeline(plans[kind], tokenizer_dir, 0, 1).num_steps() and steps > 5
    for size in SIZES[1:]:
        got, ends = run_all_ranks(plans[kind], tokenizer_dir, size)
        assert ends == {steps}, size  # every rank yields num_steps() steps
        assert got == reference, size


def test_with_drop_last_every_rank_ends_on_the_same_full_step(plans, tokenizer_dir) -> None:
    p = pipeline(plans["estimated"], tokenizer_dir, 0, 1, drop_last=True)
    steps = p.num_steps()
    assert 0 < steps < pipeline(plans["estimated"], tokenizer_dir, 0, 1).num_steps()
    batches = list(p)
    assert {b.step for b in batches} == set(range(steps))
    assert all(int(n) == MAX_LENGTH for b in batches for n in b.lengths)  # full rows only
    assert p.stats().short_rows == 0
    reference, _ = run_all_ranks(plans["estimated"], tokenizer_dir, 1, drop_last=True)
    for size in (3, 16):
        assert run_all_ranks(plans["estimated"], tokenizer_dir, size, drop_last=True) == (reference, {steps})


def test_the_default_end_hands_out_every_token_of_the_plan(plans, tokenizer_dir) -> None:
    """``drop_last=False``: the estimated end leaves no lane holding tokens, so every document is handed out."""
    for size in (1, 6):
        documents: Counter[str] = Counter()
        for rank in range(size):
            p = pipeline(plans["estimated"], tokenizer_dir, rank, size)
            list(p)
            assert p.stats().lanes_cut == 0
            documents.update(p.stats().documents)
        assert sum(documents.values()) == 900, size


def test_a_rank_tokenizes_only_its_own_documents_beyond_the_calibration(plans, tokenizer_dir, monkeypatch) -> None:
    """The documents tokenized on all ranks together are the plan's, once each, plus each rank's calibration."""
    counted: list[int] = []
    encode = Encoder.encode_flat

    def counting(self, texts, **kw):
        counted.append(len(texts))
        return encode(self, texts, **kw)

    monkeypatch.setattr(Encoder, "encode_flat", counting)
    calibrated = min(calibration.CALIBRATION, 900)  # the plan's 900 documents hold fewer than CALIBRATION_UNITS
    for size in (1, 3, 8, 24):
        counted.clear()
        for rank in range(size):
            list(pipeline(plans["estimated"], tokenizer_dir, rank, size))
        assert sum(counted) == 900 + size * calibrated, size


def test_a_16_rank_state_resumes_on_3_ranks(plans, tokenizer_dir) -> None:
    for kind in ("estimated", "exact"):
        reference, _ = run_all_ranks(plans[kind], tokenizer_dir, 1)
        before: Rows = {}
        states = []
        for rank in range(16):
            p = pipeline(plans[kind], tokenizer_dir, rank, 16)
            for batch in p:
                collect([batch], before)
                if batch.step == 2:
                    break
            states.append(p.state_dict())
        merged = merge_states(states)
        assert (merged["step"], merged["microbatch"], merged["dp_size"]) == (3, 0, 16)
        after: Rows = {}
        for rank in range(3):
            p = pipeline(plans[kind], tokenizer_dir, rank, 3)
            p.load_state_dict(json.loads(json.dumps(merged)))  # as saved to and read from a checkpoint
            collect(p, after)
        assert hashes({**before, **after}) == reference, kind


RANK_SCRIPT = """
import hashlib, json, sys
from zephon import Pipeline
plan, tokenizer, out = sys.argv[1:4]
p = (Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer).pack_flat(max_length={max_length})
     .batch(microbatch_size={micro}, global_batch_size={global_batch}))
rows = {{}}
for b in p:
    for i, j in enumerate(b.sequences.tolist()):
        rows[j] = [b.step, b.tokens[i, : b.lengths[i]].tobytes().hex()]
json.dump({{"rows": rows, "num_steps": p.num_steps()}}, open(out, "w"))
"""


#: One size a plan kind, each size once: every size is run in one process above; these are the ranks as a
#: launcher starts them (RANK, WORLD_SIZE), each a Python process of its own.
@pytest.mark.parametrize(("kind", "size"), [("estimated", 4), ("exact", 2)])
def test_ranks_in_separate_processes_give_the_global_batches_of_one(plans, tokenizer_dir, kind, size, tmp_path) -> None:
    reference, (steps,) = run_all_ranks(plans[kind], tokenizer_dir, 1)
    script = RANK_SCRIPT.format(max_length=MAX_LENGTH, micro=GLOBAL // size // 2, global_batch=GLOBAL)
    procs = []
    for rank in range(size):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(size)}
        out = tmp_path / f"{kind}-{size}-{rank}.json"
        cmd = [sys.executable, "-c", script, str(plans[kind]), tokenizer_dir, str(out)]
        procs.append((subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True), out))
    rows: Rows = {}
    for proc, out in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
        got = json.loads(out.read_text())
        assert got["num_steps"] == steps
        for j, (step, hexed) in got["rows"].items():
            rows.setdefault(step, {})[int(j)] = bytes.fromhex(hexed)
    assert hashes(rows) == reference, size


def test_a_dp_size_that_does_not_divide_the_global_batch_is_one_line_naming_the_fix(plans, tokenizer_dir) -> None:
    p = (
        Pipeline.from_plan(plans["estimated"])
        .options(dp_rank=0, dp_size=5)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=1, global_batch_size=GLOBAL)
    )
    with pytest.raises(
        ConfigError,
        match=r"^dp_size \(WORLD_SIZE\) must divide the global batch of 48 sequences, got 5 — run on one of 1, 2, "
        r"3, 4, 6, 8, 12, 16, 24, 48 ranks, or make the global batch a multiple of 5: "
        r"\.batch\(global_batch_size=\.\.\.\) in Python",
    ):
        p.geometry()


def test_a_plan_with_fixed_lanes_names_the_replan_in_python_and_config_terms(tmp_path, tokenizer_dir) -> None:
    from zephon.demo import write_demo_dataset

    write_demo_dataset(tmp_path)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("short", str(tmp_path / "demo" / "short-*.parquet"))],
        mixture=MixtureSpec({"short": 1.0}),
        seed=0,
        num_documents=50,
        lanes=8,
    )
    plan = source.plan(tmp_path / "plan")
    with pytest.raises(ConfigError, match=r"dp_size must divide the plan's 8 packing lanes, got 3 — re-plan without"):
        pipeline(plan, tokenizer_dir, 0, 3).geometry()
    assert pipeline(plan, tokenizer_dir, 1, 4).geometry().my_lanes == [1, 5]


def test_the_run_length_docstring_example() -> None:
    lanes = run_length.LaneUnits(
        units=np.array([[100_000.0], [95_000.0]]),
        documents=np.array([[400], [380]]),
        squares=np.array([[2.5e7], [2.375e7]]),
    )
    measured = run_length.Ratios.single(
        run_length.TokensPerUnit(ratio=1.0, residual=20.0, relative=0.2048, documents=512, units=50_000.0)
    )
    assert run_length.estimated_steps(lanes, measured, 1000, global_batch=2, drop_last=False) == 105
    # drop_last: min over lanes of floor((1 - m) T / W) rows = floor(0.9567 · 95) = 90.
    assert run_length.estimated_steps(lanes, measured, 1000, global_batch=2, drop_last=True) == 90


def test_dp_sizes_up_to_512_give_the_first_global_batches_of_one_rank(tmp_path, tokenizer_dir, monkeypatch) -> None:
    """G = 1536 = 512 · 3: sizes from 3 to 512 on the first two steps of a default plan, dealt by small quanta so
    that all 1536 lanes hold documents."""
    from zephon.demo import write_demo_dataset
    from zephon.planner import lane_dealing

    monkeypatch.setattr(lane_dealing, "QUANTUM", 16)
    monkeypatch.setattr(calibration, "CALIBRATION", 16)  # 512 ranks in one process: keep each rank's start short
    monkeypatch.setattr(calibration, "CALIBRATION_UNITS", 0)
    write_demo_dataset(tmp_path)
    names = ("prose", "code", "short")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, str(tmp_path / "demo" / f"{n}-*.parquet")) for n in names],
        mixture=MixtureSpec({"prose": 0.5, "code": 0.2, "short": 0.3}),
        seed=2,
        num_documents=3000,
    )
    plan = source.plan(tmp_path / "plan")
    big = 1536

    def first_steps(size: int, ranks: list[int]) -> Rows:
        rows: Rows = {}
        for rank in ranks:
            p = (
                Pipeline.from_plan(plan)
                .options(dp_rank=rank, dp_size=size, read_chunk=256)
                .tokenize(tokenizer_id=tokenizer_dir)
                .pack_flat(max_length=MAX_LENGTH)
                .batch(microbatch_size=big // size, global_batch_size=big)
            )
            for batch in p:
                if batch.step == 2:
                    break
                collect([batch], rows)
        return rows

    reference = first_steps(1, [0])
    assert sorted(reference) == [0, 1] and all(len(r) == big for r in reference.values())
    assert sum(1 for r in reference.values() for row in r.values() if row) > big  # most lanes hold documents
    for size in (3, 32, 64, 96, 128, 256, 512):
        # Some ranks of each size (all of them would take minutes in one process): row for row as one rank's.
        ranks = sorted({0, 1, size // 2, size - 1})
        got = first_steps(size, ranks)
        for step, rows in got.items():
            assert len(rows) == len(ranks) * big // size
            assert all(rows[j] == reference[step][j] for j in rows), size


def test_a_resumed_run_takes_its_length_from_the_state(plans, tokenizer_dir, monkeypatch) -> None:
    from zephon.executor.runner import RankRunner

    p = pipeline(plans["estimated"], tokenizer_dir, 0, 1)
    it = iter(p)
    next(it)
    state = json.loads(json.dumps(p.state_dict()))
    assert state["num_steps"] == {"steps": p.num_steps(), "drop_last": False}

    def measured_again(self):
        raise AssertionError("a resumed run must not calibrate again")

    monkeypatch.setattr(RankRunner, "_calibrate", measured_again)
    resumed = pipeline(plans["estimated"], tokenizer_dir, 0, 1)
    resumed.load_state_dict(state)
    assert {b.step for b in resumed} == set(range(1, state["num_steps"]["steps"]))
    # Another drop_last needs another length: it is computed, not taken from the state.
    other = pipeline(plans["estimated"], tokenizer_dir, 0, 1, drop_last=True)
    other.load_state_dict(state)
    with pytest.raises(AssertionError, match="must not calibrate again"):
        other.num_steps()
