"""Training integration: global batches identical across dp sizes, execution settings, exact resume."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zephon import Pipeline, merge_states
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

MAX_LENGTH = 33
GLOBAL = 8


@pytest.fixture(scope="module")
def plans(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """An estimated plan (one lane per row of the global batch) and an exact plan over the demo corpus (a slice of it)."""
    from zephon.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("train")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    write_demo_dataset(root / "data")
    datasets = [
        Dataset.from_path("code", str(root / "data" / "demo" / "code-*.parquet")),
        Dataset.from_path("short", str(root / "data" / "demo" / "short-*.parquet")),
    ]
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    out = {}
    for kind, exact in (("estimated", False), ("exact", True)):
        src = StaticMixtureWorkSource(
            datasets=datasets,
            mixture=MixtureSpec({"code": 0.7, "short": 0.3}),
            seed=5,
            token_estimation=TokenEstimation(calibration_samples=64),
            exact_tokens=exact,
            num_tokens=60_000,
        )
        out[kind] = src.plan(root / kind, tokenize=tok, pack=PackSpec(max_length=MAX_LENGTH))
    return out


def pipeline(plan: Path, tokenizer_dir: str, *, rank: int = 0, size: int = 1, micro: int | None = None) -> Pipeline:
    micro = micro or GLOBAL // size
    return (
        Pipeline.from_plan(plan)
        .options(dp_rank=rank, dp_size=size)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=micro, global_batch_size=GLOBAL)
    )


def global_steps(plan: Path, tokenizer_dir: str, size: int, micro: int | None = None, limit: int | None = None):
    """Per step: the union over ranks of (sequence id → row tokens), in sequence order."""
    steps: dict[int, dict[int, bytes]] = {}
    for rank in range(size):
        for batch in pipeline(plan, tokenizer_dir, rank=rank, size=size, micro=micro):
            if limit is not None and batch.step >= limit:
                break
            for i, j in enumerate(batch.sequences.tolist()):
                steps.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
    return [hashlib.sha256(b"".join(rows[j] for j in sorted(rows))).hexdigest() for _, rows in sorted(steps.items())]


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_global_batches_are_identical_for_dp_sizes_1_2_4(plans, tokenizer_dir, kind) -> None:
    one = global_steps(plans[kind], tokenizer_dir, 1)
    assert len(one) > 20
    assert global_steps(plans[kind], tokenizer_dir, 2) == one
    assert global_steps(plans[kind], tokenizer_dir, 4) == one
    # Gradient accumulation: microbatch 2 on 2 ranks (A = 2) gives the same steps too.
    assert global_steps(plans[kind], tokenizer_dir, 2, micro=2) == one


def test_ranks_get_disjoint_slices_in_sequence_order(plans, tokenizer_dir) -> None:
    seen: dict[int, list[int]] = {}
    for rank in range(4):
        for batch in pipeline(plans["exact"], tokenizer_dir, rank=rank, size=4):
            if batch.step < 3:
                seen.setdefault(rank, []).extend(batch.sequences.tolist())
    assert seen == {r: [r, r + 4, r + 8, r + 12, r + 16, r + 20] for r in range(4)}


def test_identity_comes_from_rank_and_world_size(plans, tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    p = Pipeline.from_plan(plans["exact"]).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=MAX_LENGTH)
    g = p.batch(microbatch_size=4).geometry()
    assert (g.dp_rank, g.dp_size, g.global_batch) == (1, 2, 8)
    # Explicit options win (tensor/pipeline-parallel: the data-parallel group is smaller than the world).
    g = p.options(dp_rank=0, dp_size=1).batch(microbatch_size=4).geometry()
    assert (g.dp_rank, g.dp_size) == (0, 1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "2"}, r"got WORLD_SIZE=2 without RANK — launch with torchrun"),
        ({"RANK": "3"}, r"got RANK=3 without WORLD_SIZE — launch with torchrun"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, r"^dp_rank must be in \[0, dp_size\) .* got rank 2 of 2 — fix the launcher"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, r"^RANK and WORLD_SIZE must be integers"),
    ],
)
def test_a_launcher_env_that_would_duplicate_data_is_refused(plans, tokenizer_dir, monkeypatch, env, message) -> None:
    """WORLD_SIZE without RANK made every process rank 0, and a RANK without WORLD_SIZE a world of one: each read
    what the others read. WORLD_SIZE=1 alone, or RANK=0 alone, is one process: fine."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    p = Pipeline.from_plan(plans["exact"]).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=MAX_LENGTH)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=message):
        p.batch(microbatch_size=4).geometry()
    for alone in ({"WORLD_SIZE": "1"}, {"RANK": "0"}):
        monkeypatch.delenv("RANK", raising=False)
        monkeypatch.delenv("WORLD_SIZE", raising=False)
        for key, value in alone.items():
            monkeypatch.setenv(key, value)
        g = p.batch(microbatch_size=4).geometry()
        assert (g.dp_rank, g.dp_size) == (0, 1)


def tokens_of(batches) -> list[bytes]:
    return [b.tokens.tobytes() + b.lengths.tobytes() for b in batches]


@pytest.mark.parametrize("kind", ["estimated", "exact"])
@pytest.mark.parametrize("stop_after", [1, 7, 23])
def test_resume_reproduces_the_uninterrupted_run(plans, tokenizer_dir, kind, stop_after) -> None:
    full = tokens_of(pipeline(plans[kind], tokenizer_dir, micro=2))
    first = pipeline(plans[kind], tokenizer_dir, micro=2)
    it = iter(first)
    head = [next(it) for _ in range(stop_after)]  # stop_after=7 and 23 stop mid-step (A = 4)
    state = json.loads(json.dumps(first.state_dict()))  # JSON round trip
    resumed = pipeline(plans[kind], tokenizer_dir, micro=2)
    resumed.load_state_dict(state)
    assert tokens_of(head) + tokens_of(resumed) == full


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_a_mid_step_state_resumes_only_with_the_microbatches_it_was_cut_into(plans, tokenizer_dir, kind) -> None:
    """A mid-step state (microbatch 1 of microbatches of 4 rows) loaded where microbatches are 2 rows repeated
    rows 2-3 of the step without a word; a hand-edited ``microbatch`` ≥ the step's microbatches made a run whose
    step never closed (it never ended). Both are refused; at a step boundary any microbatch size resumes."""

    def resumed_from(state: dict, micro: int) -> Pipeline:
        p = pipeline(plans[kind], tokenizer_dir, micro=micro)
        p.load_state_dict(state)
        return p

    first = pipeline(plans[kind], tokenizer_dir, micro=4)
    it = iter(first)
    head = [next(it) for _ in range(3)]  # step 1, microbatch 1 (A = 2)
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["step"], state["microbatch"], state["microbatch_size"]) == (1, 1, 4)
    with pytest.raises(ConfigError, match=r"mid-step \(microbatch 1\) must resume with the same dp_size 1 and "
                       r"microbatch size 4, got dp_size 1, microbatch size 2 — "):  # fmt: skip
        next(iter(resumed_from(state, 2)))
    for bad in (2, 7):
        with pytest.raises(ConfigError, match=rf"'microbatch' must be < the 2 microbatches of a step .*, got {bad} "):
            next(iter(resumed_from({**state, "microbatch": bad}, 4)))
    older = {k: v for k, v in state.items() if k != "microbatch_size"}  # a state before states recorded it
    assert tokens_of(head) + tokens_of(resumed_from(older, 4)) == tokens_of(
        pipeline(plans[kind], tokenizer_dir, micro=4)
    )
    boundary = first.state_dict()  # after the 4th microbatch: step 2, microbatch 0
    next(it)
    boundary = json.loads(json.dumps(first.state_dict()))
    assert (boundary["step"], boundary["microbatch"]) == (2, 0)
    assert tokens_of(resumed_from(boundary, 2)) == tokens_of(pipeline(plans[kind], tokenizer_dir, micro=2))[8:]


def test_resume_inside_a_partly_packed_document(plans, tokenizer_dir) -> None:
    p = pipeline(plans["estimated"], tokenizer_dir)
    it = iter(p)
    for _ in range(5):
        next(it)
    state = p.state_dict()
    assert any(skip > 0 for _, skip in state["lane_cursors"].values())  # some lane stopped mid-document
    resumed = pipeline(plans["estimated"], tokenizer_dir)
    resumed.load_state_dict(state)
    full = tokens_of(pipeline(plans["estimated"], tokenizer_dir))
    assert tokens_of(resumed) == full[5:]


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_resume_on_another_dp_size_gives_the_same_global_batches(plans, tokenizer_dir, kind) -> None:
    uninterrupted = global_steps(plans[kind], tokenizer_dir, 1)
    # Two ranks run 6 steps, each saves its state; merged, they resume on 4 ranks and on 1 rank.
    states, before = [], {}
    for rank in range(2):
        p = pipeline(plans[kind], tokenizer_dir, rank=rank, size=2)
        for batch in p:
            for i, j in enumerate(batch.sequences.tolist()):
                before.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
            if batch.step == 5:
                break
        states.append(p.state_dict())
    merged = merge_states(states)
    assert merged["step"] == 6 and merged["microbatch"] == 0
    for size in (4, 1):
        after: dict[int, dict[int, bytes]] = {}
        for rank in range(size):
            p = pipeline(plans[kind], tokenizer_dir, rank=rank, size=size)
            p.load_state_dict(merged)
            for batch in p:
                for i, j in enumerate(batch.sequences.tolist()):
                    after.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
        steps = {**before, **after}
        hashes = [hashlib.sha256(b"".join(r[j] for j in sorted(r))).hexdigest() for _, r in sorted(steps.items())]
        assert hashes == uninterrupted, size


def test_a_single_ranks_state_cannot_resume_other_lanes(plans, tokenizer_dir) -> None:
    p = pipeline(plans["estimated"], tokenizer_dir, rank=0, size=2)
    next(iter(p))
    next(iter(p))
    state = p.state_dict()
    other = pipeline(plans["estimated"], tokenizer_dir, rank=1, size=2)
    with pytest.raises(ConfigError, match="must hold the cursor of lane 1 for dp_rank 1"):
        other.load_state_dict(state)


def test_resume_against_another_plan_tokenizer_or_max_length_is_refused(plans, tokenizer_dir) -> None:
    p = pipeline(plans["exact"], tokenizer_dir)
    next(iter(p))
    state = p.state_dict()
    with pytest.raises(ConfigError, match="plan \\(config_hash\\)"):
        pipeline(plans["estimated"], tokenizer_dir).load_state_dict(state)
    other_len = (
        Pipeline.from_plan(plans["estimated"])
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=17)
        .batch(microbatch_size=8)
    )
    est = pipeline(plans["estimated"], tokenizer_dir)
    next(iter(est))
    with pytest.raises(ConfigError, match="max_length 33 \\(this pipeline: 17\\)"):
        other_len.load_state_dict(est.state_dict())
    bos = (
        Pipeline.from_plan(plans["estimated"])
        .tokenize(tokenizer_id=tokenizer_dir, add_bos=True)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=8)
    )
    with pytest.raises(ConfigError, match="tokenizer fingerprint"):
        bos.load_state_dict(est.state_dict())
    with pytest.raises(ConfigError, match="state version must be 1"):
        est.load_state_dict({**est.state_dict(), "version": 99})


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_dataloader_workers_never_change_the_data(plans, tokenizer_dir, kind) -> None:
    p = pipeline(plans[kind], tokenizer_dir, micro=4)
    reference = [b.to_training()["input_ids"] for b in p]
    for workers in (0, 1, 2):
        loader = torch.utils.data.DataLoader(p.to_torch_dataset(), batch_size=None, num_workers=workers)
        got = [t["input_ids"] for t in loader]
        assert len(got) == len(reference) and all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))


def test_tokenizer_threads_never_change_the_data(plans, tokenizer_dir) -> None:
    code = (
        "import hashlib, sys\nfrom zephon import Pipeline\n"
        f"p = Pipeline.from_plan({str(plans['estimated'])!r}).tokenize(tokenizer_id={tokenizer_dir!r})"
        f".pack_flat(max_length={MAX_LENGTH}).batch(microbatch_size=8).options(read_chunk=int(sys.argv[1]))\n"
        "h = hashlib.sha256()\nfor b in p: h.update(b.tokens.tobytes())\nprint(h.hexdigest())"
    )
    outs = set()
    for threads, chunk in (("1", "1024"), ("2", "37")):
        env = {**os.environ, "RAYON_NUM_THREADS": threads}
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code, chunk], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(outs) == 1


def test_exact_plan_knows_its_steps(plans, tokenizer_dir) -> None:
    p = pipeline(plans["exact"], tokenizer_dir)
    n = json.loads((plans["exact"] / "plan.json").read_text())["packing"]["sequences"]
    assert p.num_steps() == -(-n // GLOBAL) == sum(1 for _ in p)
    assert np.isclose(
        n, json.loads((plans["exact"] / "plan.json").read_text())["totals"]["tokens"] / MAX_LENGTH, atol=1
    )


def test_train_tiny_example_resumes_on_one_process_with_identical_losses(tmp_path) -> None:
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            str(repo / "examples" / "train_tiny.py"),
            "--workdir",
            str(tmp_path),
            "--steps",
            "5",
            "--checkpoint-at",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    losses = json.loads(out.stdout.splitlines()[0])
    assert len(losses["uninterrupted"]) == 5 and losses["two_processes_then_resumed"] == losses["uninterrupted"]
    assert out.stdout.splitlines()[1] == "losses identical over 5 steps (checkpoint after step 2)"
