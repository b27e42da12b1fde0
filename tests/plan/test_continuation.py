"""Continuing a run on a changed plan (``zephon.planner.continuation.child``): the child's first N global steps are
the parent's, byte for byte (batches from the executor), its later segment follows the new configuration, and
a checkpoint state of the parent at a step ≤ N resumes on the child."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline, merge_states
from zephon.errors import ConfigError, PlanFormatError
from zephon.inspection.audit import AuditSpec, audit_plan
from zephon.io import Dataset
from zephon.plan.manifest import read_manifest
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource

MAX_LENGTH = 33
GLOBAL = 12


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer_dir) -> dict[str, object]:
    from zephon.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("continue")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    write_demo_dataset(root / "data")
    datasets = {
        name: Dataset.from_path(name, str(root / "data" / "demo" / f"{name}-*.parquet"))
        for name in ("prose", "code", "short")
    }
    return {"root": root, "datasets": datasets, "tok": TokenizeSpec(tokenizer_id=tokenizer_dir)}


def source(world, names, weights, **kw) -> StaticMixtureWorkSource:
    ds = world["datasets"]
    return StaticMixtureWorkSource(
        datasets=[ds[n] for n in names], mixture=MixtureSpec(dict(zip(names, weights, strict=False))), seed=5, **kw
    )


def pipeline(plan: Path, tokenizer_dir: str, *, rank: int = 0, size: int = 1) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(dp_rank=rank, dp_size=size)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=GLOBAL // size, global_batch_size=GLOBAL)
    )


def step_hashes(pipe: Pipeline, limit: int | None = None) -> dict[int, str]:
    """Step → SHA-256 of its rows (by sequence id), from the executor's batches (steps ``< limit`` only: the
    iteration stops after step ``limit - 1``, one microbatch a step, so its state is at step ``limit``)."""
    rows: dict[int, dict[int, bytes]] = {}
    if limit == 0:
        return {}
    for batch in pipe:
        for i, j in enumerate(batch.sequences.tolist()):
            rows.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
        if limit is not None and batch.step == limit - 1:
            break
    return {s: hashlib.sha256(b"".join(r[j] for j in sorted(r))).hexdigest() for s, r in rows.items()}


def samples(plan: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(plan / "samples.parquet")
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


@pytest.fixture(scope="module")
def exact_pair(world) -> tuple[Path, Path]:
    root = world["root"]
    pack = PackSpec(max_length=MAX_LENGTH)
    parent = source(world, ["prose", "code"], [0.7, 0.3], num_documents=500, exact_tokens=True).plan(
        root / "exact-parent", tokenize=world["tok"], pack=pack
    )
    new = source(world, ["prose", "code", "short"], [0.2, 0.3, 0.5], num_documents=900, exact_tokens=True)
    child = new.plan(root / "exact-child", tokenize=world["tok"], pack=pack, continue_from=parent, at_step=7,
                     global_batch=GLOBAL)  # fmt: skip
    return parent, child


def test_an_exact_continuation_keeps_the_parents_first_steps_and_follows_the_new_mixture_after(
    world, exact_pair, tokenizer_dir
) -> None:
    parent, child = exact_pair
    old = step_hashes(pipeline(parent, tokenizer_dir))
    new = step_hashes(pipeline(child, tokenizer_dir))
    assert [new[s] for s in range(7)] == [old[s] for s in range(7)]
    assert new[7] != old[7]  # the new mixture (a dataset added) starts at the branch
    manifest = read_manifest(child)
    lineage = manifest.lineage
    assert lineage is not None and lineage.branch.step == 7 and lineage.branch.global_batch == GLOBAL
    assert lineage.parent.config_hash == read_manifest(parent).config_hash
    assert [(s.segment, s.first_step) for s in lineage.segments] == [(0, 0), (1, 7)]
    position = lineage.branch.position
    # The branch is the first document at or past token 7·G·L, and the kept rows are the parent's.
    p, c = samples(parent), samples(child)
    assert p["token_offset"][position - 1] < 7 * GLOBAL * MAX_LENGTH <= p["token_offset"][position]
    for column in ("dataset_id", "shard_id", "row", "epoch", "tokens", "token_offset"):
        assert np.array_equal(c[column][:position], p[column][:position]), column
    assert c["token_offset"][position] == p["token_offset"][position]  # offsets continue
    # Nothing read twice: every (shard, row) once within its epoch, across the branch.
    pairs = list(zip(c["shard_id"].tolist(), c["row"].tolist(), c["epoch"].tolist(), strict=False))
    assert len(pairs) == len(set(pairs)) == manifest.totals.documents == 900
    # The later segment meets its own mixture; the prefix its parent's: the audit checks each segment.
    result = audit_plan(child)  # the batch the branch was made for cuts the steps
    assert [p.segment for p in result.phases] == [0, 1]
    assert [ph.segment for ph in manifest.resolved_phases] == [0, 1]
    kept, later = result.phases
    assert (kept.first_position, kept.end_position, later.first_step) == (0, position, 7)
    assert [d.target for d in kept.datasets] == pytest.approx([0.7, 0.3, 0.0])  # the parent's own target
    assert [d.target for d in later.datasets] == pytest.approx([0.2, 0.3, 0.5])
    assert later.ok, later  # within the default 1 pp over windows of 100 steps
    segment = manifest.resolved_phases[1]
    assert segment.first_position == position and segment.end_position == 900
    assert dict(segment.weights) == pytest.approx({"prose": 0.2, "code": 0.3, "short": 0.5})


def test_a_state_of_the_parent_at_or_before_the_branch_resumes_on_the_child(world, exact_pair, tokenizer_dir) -> None:
    parent, child = exact_pair
    full = step_hashes(pipeline(child, tokenizer_dir))
    for at in (3, 7):
        run = pipeline(parent, tokenizer_dir)
        step_hashes(run, limit=at)
        state = run.state_dict()
        assert state["step"] == at
        resumed = pipeline(child, tokenizer_dir)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        got = step_hashes(resumed)
        assert got == {s: h for s, h in full.items() if s >= at}
    late = pipeline(parent, tokenizer_dir)
    step_hashes(late, limit=8)
    bad = pipeline(child, tokenizer_dir)
    with pytest.raises(ConfigError, match=r"≤ the branch step 7\), got step 8"):
        bad.load_state_dict(late.state_dict())
        next(iter(bad))


def test_an_estimated_continuation_branches_where_the_runs_lanes_stood(world, tokenizer_dir) -> None:
    root = world["root"]
    parent = source(world, ["prose", "code", "short"], [0.5, 0.2, 0.3], num_documents=700).plan(root / "est-parent")
    # A 4-rank run checkpointed at step 5: the merged state of all ranks knows every lane's cursor.
    states = []
    for rank in range(4):
        run = pipeline(parent, tokenizer_dir, rank=rank, size=4)
        step_hashes(run, limit=5)
        states.append(run.state_dict())
    state = merge_states(states)
    new = source(world, ["prose", "code", "short"], [0.1, 0.1, 0.8], num_documents=1200)
    child = new.plan(root / "est-child", continue_from=parent, state=state)
    old = step_hashes(pipeline(parent, tokenizer_dir))
    got = step_hashes(pipeline(child, tokenizer_dir, size=1))
    assert [got[s] for s in range(5)] == [old[s] for s in range(5)]
    # Lanes ahead of others at the branch keep the parent's documents a little longer; then the new mixture.
    shared = min(len(got), len(old))
    assert sum(got[s] != old[s] for s in range(5, shared)) > (shared - 5) // 2
    # The state resumes on the child at another dp size, and continues as the child's own run does.
    rows = {}
    for rank in range(3):
        run = pipeline(child, tokenizer_dir, rank=rank, size=3)
        run.load_state_dict(state)
        for batch in run:
            for i, j in enumerate(batch.sequences.tolist()):
                rows.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
    resumed = {s: hashlib.sha256(b"".join(r[j] for j in sorted(r))).hexdigest() for s, r in rows.items()}
    assert resumed == {s: h for s, h in got.items() if s >= 5}
    early = pipeline(parent, tokenizer_dir)
    step_hashes(early, limit=2)
    again = pipeline(child, tokenizer_dir)
    again.load_state_dict(early.state_dict())
    assert step_hashes(again) == {s: h for s, h in got.items() if s >= 2}
    manifest = read_manifest(child)
    assert manifest.lineage is not None and manifest.lineage.branch.step == 5
    c = samples(child)
    pairs = list(zip(c["shard_id"].tolist(), c["row"].tolist(), c["epoch"].tolist(), strict=False))
    assert len(pairs) == len(set(pairs))
    later = audit_plan(child, AuditSpec(batch_size=GLOBAL)).phases[-1]
    assert [d.target for d in later.datasets] == pytest.approx([0.1, 0.1, 0.8]) and later.ok, later


def test_bad_continuations_are_one_line_each(world, exact_pair, tmp_path) -> None:
    parent, _ = exact_pair
    pack = PackSpec(max_length=MAX_LENGTH)
    new = source(world, ["prose", "code"], [0.5, 0.5], num_documents=900, exact_tokens=True)

    def go(**kw):
        return new.plan(
            tmp_path / "out", tokenize=world["tok"], pack=pack, continue_from=kw.pop("parent", parent), **kw
        )

    with pytest.raises(ConfigError, match=r"--at-step must be within the parent's \d+ full steps"):
        go(at_step=10_000, global_batch=GLOBAL)
    with pytest.raises(ConfigError, match="needs the branch step and the run's global batch"):
        go(at_step=3)
    with pytest.raises(ConfigError, match="must come from the parent plan"):
        go(state={"plan": "0" * 64, "step": 3, "microbatch": 0, "global_batch": GLOBAL})
    # (Datasets left out, added or reordered: tests/plan/test_continuation_datasets.py.)
    with pytest.raises(ConfigError, match="must be written to a new directory"):
        new.plan(parent, tokenize=world["tok"], pack=pack, continue_from=parent, at_step=3, global_batch=GLOBAL,
                 overwrite=True)  # fmt: skip
    with pytest.raises(ConfigError, match="budget must exceed"):
        source(world, ["prose", "code"], [0.5, 0.5], num_documents=50, exact_tokens=True).plan(
            tmp_path / "o3", tokenize=world["tok"], pack=pack, continue_from=parent, at_step=100, global_batch=GLOBAL
        )
    # A changed parent: its samples rewritten after it was sealed.
    import shutil

    changed = tmp_path / "changed"
    shutil.copytree(parent, changed)
    table = pq.read_table(changed / "samples.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), changed / "samples.parquet")
    with pytest.raises(PlanFormatError):
        go(parent=changed, at_step=3, global_batch=GLOBAL)
    assert not (tmp_path / "out").exists()


def test_new_phases_and_another_epoch_continue_the_parents_epochs(world, tokenizer_dir) -> None:
    """The new budget counts the whole run and asks for more than one pass: each dataset's reader goes on from
    where the parent's prefix left it, into later epochs, each epoch whole before the next and no document twice
    in one epoch. A phase starting at an absolute position after the branch starts there."""
    root = world["root"]
    parent = source(world, ["prose", "code"], [0.5, 0.5], num_documents=600).plan(root / "ep-parent")
    run = pipeline(parent, tokenizer_dir)
    step_hashes(run, limit=4)
    state = run.state_dict()
    rows = {"prose": 1200, "code": 600}
    new = source(
        world,
        ["prose", "code"],
        [0.5, 0.5],
        num_documents=3000,
        epochs=None,
        phases=[Phase(start=2000, unit="documents", mixture=MixtureSpec({"prose": 1.0}))],
    )
    child = new.plan(root / "ep-child", continue_from=parent, state=state)
    manifest = read_manifest(child)
    position = manifest.lineage.branch.position
    c = samples(child)
    assert len(c["position"]) == 3000
    # The phase starts at absolute position 2000 and reads prose only; segment 1 holds both of its phases.
    phases = manifest.resolved_phases
    assert [(p.segment, p.first_position) for p in phases] == [(0, 0), (1, position), (1, 2000)]
    assert set(c["dataset_id"][2000:].tolist()) == {0}
    # Readers continue: no (shard, row, epoch) twice, and each dataset's epochs never go back.
    triples = list(zip(c["shard_id"].tolist(), c["row"].tolist(), c["epoch"].tolist(), strict=True))
    assert len(triples) == len(set(triples))
    for index, name in enumerate(rows):
        epochs = c["epoch"][c["dataset_id"] == index]
        assert np.all(np.diff(epochs) >= 0), name
        per_epoch = np.bincount(epochs)
        assert np.all(per_epoch[:-1] == rows[name]), (name, per_epoch)  # whole passes, none repeated early


def test_the_cli_continues_names_the_branch_and_shows_segments(world, exact_pair, tokenizer_dir, tmp_path) -> None:
    from click.testing import CliRunner

    from zephon.cli import cli

    root = world["root"]
    parent = source(world, ["prose", "code", "short"], [0.5, 0.2, 0.3], num_documents=700).plan(root / "cli-parent")
    run = pipeline(parent, tokenizer_dir)
    step_hashes(run, limit=6)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(run.state_dict()))
    ds = world["datasets"]
    lines = ["seed: 5", "datasets:"]
    lines += [f"  - {{name: {n}, path: '{ds[n].path}'}}" for n in ("prose", "code", "short")]
    lines += ["mixture: {prose: 0.2, code: 0.2, short: 0.6}", "num_documents: 1500"]
    config = tmp_path / "more.yaml"
    config.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    out = tmp_path / "child"
    args = ["plan", str(config), "-o", str(out), "--continue-from", str(parent)]
    result = runner.invoke(cli, [*args, "--continue-from-state", str(state_file)])
    assert result.exit_code == 0, result.output
    assert f"continues {read_manifest(parent).config_hash[:12]} ({parent}) from step 6 (global batch {GLOBAL})" in (
        result.output
    )
    diff = runner.invoke(cli, ["diff", str(parent), str(out)])
    assert f"branch: B continues A from step 6 (global batch {GLOBAL})" in diff.output
    assert (
        json.loads(runner.invoke(cli, ["diff", str(parent), str(out), "--format", "json"]).output)["branch"]["step"]
        == 6
    )
    sql = runner.invoke(
        cli, ["sql", str(out), "SELECT segment, first_step FROM segments ORDER BY segment", "--format", "csv"]
    )
    assert sql.output.splitlines() == ["segment,first_step", "0,0", "1,6"]
    # A step's segment, from the view: the last segment starting at or before it.
    q = "SELECT max(segment) FROM segments WHERE first_step <= 9"
    assert runner.invoke(cli, ["sql", str(out), q, "--format", "csv"]).output.splitlines()[1] == "1"
    # Bad input, one line each.
    bad = runner.invoke(cli, ["plan", str(config), "-o", str(tmp_path / "x"), "--at-step", "3"])
    assert bad.exit_code != 0 and "must come with --continue-from" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    bad = runner.invoke(cli, [*args[:3], str(tmp_path / "y"), *args[4:]])
    assert bad.exit_code != 0 and "needs the run's checkpoint state" in bad.output
    late = tmp_path / "late.json"
    state = json.loads(state_file.read_text()) | {"microbatch": 1}
    late.write_text(json.dumps(state))
    bad = runner.invoke(cli, [*args[:3], str(tmp_path / "z"), *args[4:], "--continue-from-state", str(late)])
    assert "must be taken at a step boundary" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_a_token_mixture_continues_into_a_phase_in_steps_and_a_continuation_of_a_continuation(
    world, tokenizer_dir
) -> None:
    """Exact token mixtures: a new phase in steps (it leaves ``code`` out) starts in its step of the whole run;
    continuing the child again inside that phase keeps three segments, and a state of the first plan from
    before the first branch still resumes on the grandchild."""
    from zephon.work import TokenEstimation

    root = world["root"]
    pack = PackSpec(max_length=MAX_LENGTH)
    est = TokenEstimation(primer=0.25)
    names = ["prose", "code", "short"]
    parent = source(world, names, [0.5, 0.3, 0.2], num_tokens=60_000, token_estimation=est, exact_tokens=True).plan(
        root / "tok-parent", tokenize=world["tok"], pack=pack
    )
    phase = Phase(start=40, unit="steps", global_batch_size=GLOBAL, mixture=MixtureSpec({"prose": 0.6, "short": 0.4}))
    new = source(
        world, names, [0.3, 0.4, 0.3], num_tokens=90_000, token_estimation=est, exact_tokens=True, phases=[phase]
    )
    child = new.plan(root / "tok-child", tokenize=world["tok"], pack=pack, continue_from=parent, at_step=20,
                     global_batch=GLOBAL)  # fmt: skip
    c = samples(child)
    phases = read_manifest(child).resolved_phases
    assert [p.segment for p in phases] == [0, 1, 1]
    first = phases[2].first_position
    # The phase's first document is the first placed once the stream reached step 40's first token.
    assert c["token_offset"][first - 1] < 40 * GLOBAL * MAX_LENGTH <= c["token_offset"][first]
    assert 1 not in set(c["dataset_id"][first:].tolist())  # the phase leaves code out
    assert 88_000 < int(c["tokens"].sum()) < 91_000  # the budget counts the whole run
    # A continuation of the continuation, branching inside the phase (its segment starts with code left out).
    again = source(
        world, names, [0.3, 0.4, 0.3], num_tokens=120_000, token_estimation=est, exact_tokens=True, phases=[phase]
    )
    grand = again.plan(root / "tok-grand", tokenize=world["tok"], pack=pack, continue_from=child, at_step=50,
                       global_batch=GLOBAL)  # fmt: skip
    lineage = read_manifest(grand).lineage
    assert [(s.segment, s.first_step) for s in lineage.segments] == [(0, 0), (1, 20), (2, 50)]
    g = samples(grand)
    assert 1 not in set(g["dataset_id"][lineage.branch.position :].tolist())
    hashes = {name: step_hashes(pipeline(p, tokenizer_dir)) for name, p in [("p", parent), ("c", child), ("g", grand)]}
    assert [hashes["g"][s] for s in range(50)] == [hashes["c"][s] for s in range(50)]
    assert [hashes["g"][s] for s in range(20)] == [hashes["p"][s] for s in range(20)]
    run = pipeline(parent, tokenizer_dir)
    step_hashes(run, limit=15)
    resumed = pipeline(grand, tokenizer_dir)
    resumed.load_state_dict(run.state_dict())
    assert step_hashes(resumed) == {s: h for s, h in hashes["g"].items() if s >= 15}
    # Continuing the child before its own branch: the child's segment is dropped, its states still resume.
    earlier = again.plan(root / "tok-earlier", tokenize=world["tok"], pack=pack, continue_from=child, at_step=10,
                         global_batch=GLOBAL)  # fmt: skip
    lineage = read_manifest(earlier).lineage
    assert [(s.segment, s.first_step) for s in lineage.segments] == [(0, 0), (1, 10)]
    assert lineage.parent.config_hash == read_manifest(child).config_hash
    run = pipeline(child, tokenizer_dir)
    step_hashes(run, limit=8)
    resumed = pipeline(earlier, tokenizer_dir)
    resumed.load_state_dict(run.state_dict())
    assert step_hashes(resumed) == {s: h for s, h in step_hashes(pipeline(earlier, tokenizer_dir)).items() if s >= 8}
