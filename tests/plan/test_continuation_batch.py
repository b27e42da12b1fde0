"""A continued plan and its global batch (``zephon.executor.state.check_run_batch``,
``zephon.planner.continuation.child``): an estimated plan with one lane per row refuses another global batch (its
kept steps would no longer be its parent's); exact plans yield the same rows at any batch and warn where the
branch falls; a continuation never mixes global batches in one lineage."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_continuation_datasets import GLOBAL, MAX_LENGTH, pipeline, source, step_hashes, world  # noqa: F401

from zephon.errors import ConfigError, PlanWarning
from zephon.specs import PackSpec


def rows(plan: Path, tokenizer_dir: str, batch: int) -> list[bytes]:
    """Every row of a run, in global sequence order."""
    out: dict[int, bytes] = {}
    for b in pipeline(plan, tokenizer_dir, batch=batch):
        for i, j in enumerate(b.sequences.tolist()):
            out[j] = b.tokens[i, : b.lengths[i]].tobytes()
    return [out[j] for j in sorted(out)]


def test_an_estimated_continuation_runs_only_at_its_branchs_global_batch(world, tokenizer_dir, tmp_path) -> None:  # noqa: F811
    parent = source(world, {"prose": 0.5, "code": 0.5}, num_documents=400).plan(tmp_path / "parent")
    run = pipeline(parent, tokenizer_dir)
    step_hashes([run], limit=4)
    state = run.state_dict()
    new = source(world, {"prose": 0.2, "code": 0.8}, num_documents=800)
    with pytest.raises(ConfigError, match=r"--global-batch must be the state's global batch 12, got 6 — leave it"):
        new.plan(tmp_path / "bad", continue_from=parent, state=state, global_batch=6)
    child = new.plan(tmp_path / "child", continue_from=parent, state=state, global_batch=GLOBAL)
    with pytest.raises(ConfigError, match=r"the global batch must be 12 for the continued plan \w+, got 6 — its kept"):
        next(iter(pipeline(child, tokenizer_dir, batch=6)))
    with pytest.raises(ConfigError, match=r"global_batch_size=12"):
        pipeline(child, tokenizer_dir, batch=24).num_steps()
    assert step_hashes([pipeline(child, tokenizer_dir)], limit=4) == step_hashes([pipeline(parent, tokenizer_dir)], 4)


def test_an_exact_continuation_yields_the_same_rows_at_another_batch_and_says_where_the_branch_falls(
    world,  # noqa: F811
    tokenizer_dir,
    tmp_path,
) -> None:
    tok, pack = world["tok"], PackSpec(max_length=MAX_LENGTH)
    parent = source(world, {"prose": 0.6, "code": 0.4}, num_documents=300, exact_tokens=True).plan(
        tmp_path / "parent", tokenize=tok, pack=pack
    )
    new = source(world, {"prose": 0.3, "code": 0.7}, num_documents=600, exact_tokens=True)
    child = new.plan(tmp_path / "child", tokenize=tok, pack=pack, continue_from=parent, at_step=5, global_batch=GLOBAL)
    same = rows(child, tokenizer_dir, GLOBAL)
    with pytest.warns(PlanWarning, match=r"the branch is row 60, step 15 at 4\)"):
        other = rows(child, tokenizer_dir, 4)
    assert other == same
    # Continuing the continued plan keeps its lineage's global batch.
    again = source(world, {"prose": 0.5, "code": 0.5}, num_documents=900, exact_tokens=True)
    with pytest.raises(ConfigError, match=r"--global-batch must be 12, the global batch of the continued parent"):
        again.plan(tmp_path / "grand", tokenize=tok, pack=pack, continue_from=child, at_step=20, global_batch=6)


def test_a_branch_after_a_lane_ran_out_is_refused(world, tokenizer_dir, tmp_path) -> None:  # noqa: F811
    """30,000 estimated tokens fill 8 deals of 4,096: lanes 8..11 of 12 never get a document and pack empty rows,
    which a continuation's new documents would fill (its kept steps would differ from the parent's)."""
    from zephon.planner.continuation.child import DryLanes
    from zephon.work import TokenEstimation

    est = TokenEstimation(primer=0.25)
    weights = {"prose": 0.5, "code": 0.2, "short": 0.3}
    parent = source(world, weights, num_tokens=30_000, token_estimation=est).plan(tmp_path / "p", tokenize=world["tok"])
    run = pipeline(parent, tokenizer_dir)
    step_hashes([run], limit=3)
    new = source(world, weights, num_tokens=60_000, token_estimation=est)
    with pytest.raises(DryLanes, match=r"got step 3, where lanes \[8, 9, 10, 11\] of 12 had run out"):
        new.plan(tmp_path / "c", tokenize=world["tok"], continue_from=parent, state=run.state_dict())
    assert not (tmp_path / "c").exists()
