"""A hand-edited or truncated training state is refused in one line naming the field, wherever it is loaded:
``Pipeline.load_state_dict`` and ``zephon plan --continue-from-state`` (docs/training.md)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon import Pipeline
from zephon.cli import cli
from zephon.errors import ConfigError

FIX = re.escape(" — fix the state file, or save it again with json.dump(pipeline.state_dict())")


@pytest.fixture
def run(make_parquet, tmp_path, tokenizer_dir) -> tuple[Path, Path, dict[str, Any]]:
    """An estimated plan of one dataset, its CONFIG, and the state of a run after 2 steps."""
    data = make_parquet("web", [40, 40])
    config = tmp_path / "plan.yaml"
    config.write_text(f"seed: 3\ndatasets:\n  - name: web\n    path: {data}\nmixture: {{web: 1.0}}\n", encoding="utf-8")
    plan = tmp_path / "plan"
    assert CliRunner().invoke(cli, ["plan", str(config), "-o", str(plan)]).exit_code == 0
    pipe = _pipeline(plan, tokenizer_dir)
    list(itertools.islice(iter(pipe), 2))
    return plan, config, pipe.state_dict()


def _pipeline(plan: Path, tokenizer_dir: str) -> Pipeline:
    pipe = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=33)
    return pipe.batch(microbatch_size=2)


def _without(state: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != key}


EDITS = [
    (lambda s: _without(s, "step"), r"pipeline state must hold 'step', got keys \[.*\]" + FIX),
    (lambda s: s | {"step": "3"}, "pipeline state 'step' must be an integer ≥ 0, got '3'" + FIX),
    (lambda s: s | {"step": -1}, "pipeline state 'step' must be an integer ≥ 0, got -1" + FIX),
    (lambda s: s | {"step": 10**9}, r"pipeline state 'step' must be ≤ its run's num_steps \d+, got 1000000000" + FIX),
    (lambda s: s | {"microbatch": 1.5}, "pipeline state 'microbatch' must be an integer ≥ 0, got 1.5" + FIX),
    (lambda s: s | {"lane_cursors": [[0, 0]]}, r"'lane_cursors' must be an object of lane → \[position, skip\]"),
    (lambda s: s | {"lane_cursors": {"0": [5]}}, r"'lane_cursors' lane 0 must be \[position, skip\] of two integers"),
    (
        lambda s: s | {"lane_cursors": {"99": [0, 0]}},
        "'lane_cursors' key must be a lane number below lanes 2, got '99'",
    ),
    (lambda s: s | {"lane_cursors": {"0": [10**9, 0]}}, r"lane 0 position must be ≤ the plan's 80 documents, got 10+"),
    (lambda s: s | {"num_steps": {"steps": 5}}, r"'num_steps' must be \{\"steps\": N, \"drop_last\": true\|false\}"),
    (lambda s: s | {"num_steps": {"steps": "x", "drop_last": True}}, "'steps' must be an integer ≥ 0, got 'x'"),
    # a dp size that does not split the global batch: no Zephon run saves one (it was accepted outside the
    # integrations, which refused it)
    (
        lambda s: s | {"dp_size": 3},
        "pipeline state 'dp_size' must be a divisor of its global batch of 2 sequences, got 3" + FIX,
    ),
    # the form a framework's checkpoint holds (DataCheckpoint's): blamed on the version before
    (
        lambda s: {"zephon_state": json.dumps(s)},
        r"^pipeline state must be the dict state_dict\(\) returned, got the packed form \{'zephon_state': JSON "
        r"text\} a framework's checkpoint holds — pass json.loads\(saved\['zephon_state'\]\)",
    ),
]


@pytest.mark.parametrize(("edit", "message"), EDITS, ids=[m[:40] for _, m in EDITS])
def test_a_hand_edited_state_is_refused_in_one_line_naming_the_field(run, tokenizer_dir, edit, message) -> None:
    plan, _, state = run
    assert state["lanes"] == 2 and "num_steps" in state
    with pytest.raises(ConfigError, match=message):
        _pipeline(plan, tokenizer_dir).load_state_dict(edit(state))


@pytest.mark.parametrize(("edit", "message"), EDITS[1:4] + EDITS[7:9], ids=[m[:40] for _, m in EDITS[1:4] + EDITS[7:9]])
def test_zephon_plan_continue_from_state_refuses_it_in_one_line(run, tmp_path, edit, message) -> None:
    plan, config, state = run
    file = tmp_path / "state.json"
    file.write_text(json.dumps(edit(state)), encoding="utf-8")
    args = ["plan", str(config), "-o", str(tmp_path / "child"), "--continue-from", str(plan)]
    result = CliRunner().invoke(cli, [*args, "--continue-from-state", str(file)])
    assert result.exit_code == 1
    assert len(result.output.splitlines()) == 1 and result.output.startswith("zephon: error: ")
    assert re.search(message, result.output), result.output


def test_a_step_past_the_run_without_a_recorded_length_is_refused_when_the_run_starts(run, tokenizer_dir) -> None:
    plan, _, state = run
    pipe = _pipeline(plan, tokenizer_dir)
    pipe.load_state_dict(_without(state, "num_steps") | {"step": 10**9})
    with pytest.raises(ConfigError, match=r"^pipeline state 'step' must be ≤ this run's \d+ steps, got 1000000000 — "):
        next(iter(pipe))


def test_a_lane_cursor_skipping_past_its_document_or_naming_another_lanes_is_refused_when_the_run_starts(
    run, tokenizer_dir
) -> None:
    """A cursor ``[position, skip]`` whose skip is past its document's tokens (or whose document is not its lane's)
    was taken as it was: the lane resumed elsewhere and the batches differed from the uninterrupted run's."""
    plan, _, state = run
    lane, (position, _) = next(iter(state["lane_cursors"].items()))
    deal = pq.read_table(plan / "samples.parquet", columns=["position", "deal"]).to_pylist()
    other = next(r["position"] for r in deal if r["deal"] % state["lanes"] != int(lane) and r["position"] >= position)
    for cursor in ([position, 10**9], [other, 1]):
        edited = state | {"lane_cursors": state["lane_cursors"] | {lane: cursor}}
        pipe = _pipeline(plan, tokenizer_dir)
        pipe.load_state_dict(edited)
        with pytest.raises(
            ConfigError, match=r"^pipeline state lane cursor \[\d+, \d+\] must name a document of its lane and skip at "
            r"most its tokens, got document \d+ of \d+" + FIX
        ):  # fmt: skip
            list(pipe)


def test_zephon_plan_continue_from_state_names_a_framework_checkpoints_packed_form(run, tmp_path) -> None:
    """The packed form (``{"zephon_state": JSON}``, DataCheckpoint's) was refused as a dict without 'plan' and
    'step'; it is named, with its fix, as ``load_state_dict`` names it."""
    plan, config, state = run
    file = tmp_path / "state.json"
    file.write_text(json.dumps({"zephon_state": json.dumps(state)}), encoding="utf-8")
    args = ["plan", str(config), "-o", str(tmp_path / "child"), "--continue-from", str(plan)]
    result = CliRunner().invoke(cli, [*args, "--continue-from-state", str(file)])
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1
    assert "got the packed form {'zephon_state': JSON text}" in result.output
    assert "pass json.loads(saved['zephon_state'])" in result.output
    assert not (tmp_path / "child").exists()
