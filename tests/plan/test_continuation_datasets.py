"""A continuation that leaves out a parent dataset and adds another (``zephon.planner.continuation.datasets``):
the kept steps still read the left-out dataset, byte for byte; after the branch it is read no more and the new
mixture holds; datasets are matched by name and content, whatever order the new config lists them in."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline, merge_states
from zephon.errors import DatasetError
from zephon.inspection.audit import AuditSpec, audit_plan
from zephon.io import Dataset
from zephon.plan.manifest import read_manifest
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

MAX_LENGTH = 33
GLOBAL = 12


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer_dir) -> dict[str, object]:
    from zephon.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("continue-datasets")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    write_demo_dataset(root / "data")
    paths = {name: str(root / "data" / "demo" / f"{name}-*.parquet") for name in ("prose", "code", "short")}
    return {"root": root, "paths": paths, "tok": TokenizeSpec(tokenizer_id=tokenizer_dir)}


def source(world, weights: dict[str, float], **kw) -> StaticMixtureWorkSource:
    paths = world["paths"]
    datasets = [Dataset.from_path(n, paths[n]) for n in weights]
    return StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec(weights), seed=5, **kw)


def pipeline(plan: Path, tokenizer_dir: str, *, rank: int = 0, size: int = 1, batch: int = GLOBAL) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(dp_rank=rank, dp_size=size)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=batch // size, global_batch_size=batch)
    )


def step_hashes(pipes: list[Pipeline], limit: int | None = None) -> dict[int, str]:
    """Step → SHA-256 of its rows (by sequence id) over every rank's batches (steps ``< limit`` only)."""
    rows: dict[int, dict[int, bytes]] = {}
    for pipe in pipes:
        for batch in pipe:
            for i, j in enumerate(batch.sequences.tolist()):
                rows.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
            if limit is not None and batch.step == limit - 1:
                break
    return {s: hashlib.sha256(b"".join(r[j] for j in sorted(r))).hexdigest() for s, r in rows.items()}


def samples(plan: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(plan / "samples.parquet")
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


def check_removed(
    parent: Path, child: Path, *, at: int, removed: int, targets: list[float], batch: int, windows: bool = True
) -> None:
    """The child lists the parent's datasets first (the left-out one at its index, weight 0), keeps the prefix's
    rows, reads the left-out dataset no more after the branch, reads no (shard, row, epoch) twice, and its new
    segment meets its own mixture (a 0 target for the left-out dataset): in every window of the audit, or — with
    ``windows=False``, for token mixtures of this corpus, whose long documents move a 100-step window of 33-token
    rows by more than 1 pp in a fresh plan too — over the segment."""
    manifest, old = read_manifest(child), read_manifest(parent)
    assert list(manifest.dataset_names[: len(old.dataset_names)]) == list(old.dataset_names)
    assert manifest.datasets[removed].weight == 0.0
    assert manifest.config["datasets"][removed]["removed_at_branch"] is True
    assert manifest.config["continue_from"]["removed"] == [old.dataset_names[removed]]
    position = manifest.lineage.branch.position
    p, c = samples(parent), samples(child)
    for column in ("dataset_id", "shard_id", "row", "epoch", "deal"):
        assert np.array_equal(c[column][:position], p[column][:position], equal_nan=True), column
    assert removed in set(c["dataset_id"][:position].tolist())
    assert removed not in set(c["dataset_id"][position:].tolist())
    triples = list(zip(c["shard_id"].tolist(), c["row"].tolist(), c["epoch"].tolist(), strict=True))
    assert len(triples) == len(set(triples))
    assert manifest.datasets[removed].planned_documents == int((c["dataset_id"][:position] == removed).sum())
    result = audit_plan(child, AuditSpec(batch_size=batch))
    kept, later = result.phases[0], result.phases[-1]
    assert (kept.segment, later.segment) == (0, 1)
    assert kept.datasets[removed].target > 0  # the parent's own target for the steps it planned
    assert [d.target for d in later.datasets] == pytest.approx(targets)
    assert later.datasets[removed].overall_share == 0.0
    if windows:
        assert later.ok, later
    else:
        assert [d.overall_share for d in later.datasets] == pytest.approx(targets, abs=0.01)
    if manifest.exact:  # the first new document is the first at or past step `at`'s first token
        offsets = c["token_offset"]
        assert offsets[position - 1] < at * batch * MAX_LENGTH <= offsets[position]
        assert later.first_step == offsets[position] // (batch * MAX_LENGTH)


def test_an_exact_continuation_drops_a_dataset_and_adds_one_in_any_order(world, tokenizer_dir) -> None:
    root, tok, pack = world["root"], world["tok"], PackSpec(max_length=MAX_LENGTH)
    parent = source(world, {"prose": 0.6, "code": 0.4}, num_documents=500, exact_tokens=True).plan(
        root / "x-parent", tokenize=tok, pack=pack
    )
    # code left out, short added, listed before prose: the child is [prose, code, short].
    new = source(world, {"short": 0.5, "prose": 0.5}, num_documents=900, exact_tokens=True)
    child = new.plan(root / "x-child", tokenize=tok, pack=pack, continue_from=parent, at_step=7, global_batch=GLOBAL)
    assert read_manifest(child).dataset_names == ["prose", "code", "short"]
    check_removed(parent, child, at=7, removed=1, targets=[0.5, 0.0, 0.5], batch=GLOBAL)
    old = step_hashes([pipeline(parent, tokenizer_dir)])
    full = step_hashes([pipeline(child, tokenizer_dir)])
    assert [full[s] for s in range(7)] == [old[s] for s in range(7)]
    # A state of the parent resumes on the child, on 3 ranks, and continues as the child's own run.
    run = pipeline(parent, tokenizer_dir)
    step_hashes([run], limit=5)
    state = run.state_dict()
    ranks = [pipeline(child, tokenizer_dir, rank=r, size=3) for r in range(3)]
    for r in ranks:
        r.load_state_dict(state)
    assert step_hashes(ranks) == {s: h for s, h in full.items() if s >= 5}
    # Continuing the child again brings code back: its reader goes on where the first segment left it.
    back = source(world, {"prose": 0.3, "code": 0.3, "short": 0.4}, num_documents=1400, exact_tokens=True)
    grand = back.plan(root / "x-grand", tokenize=tok, pack=pack, continue_from=child, at_step=30, global_batch=GLOBAL)
    manifest = read_manifest(grand)
    assert "removed_at_branch" not in manifest.config["datasets"][1] and manifest.datasets[1].weight == 0.3
    g, position = samples(grand), manifest.lineage.branch.position
    assert 1 in set(g["dataset_id"][position:].tolist())
    triples = list(zip(g["shard_id"].tolist(), g["row"].tolist(), g["epoch"].tolist(), strict=True))
    assert len(triples) == len(set(triples))  # code's documents of the first segment are not read again
    assert [step_hashes([pipeline(grand, tokenizer_dir)], limit=30)[s] for s in range(30)] == [
        full[s] for s in range(30)
    ]


def test_an_estimated_continuation_drops_a_dataset(world, tokenizer_dir) -> None:
    root = world["root"]
    parent = source(world, {"prose": 0.5, "code": 0.2, "short": 0.3}, num_documents=700).plan(root / "e-parent")
    states = []
    for rank in range(4):
        run = pipeline(parent, tokenizer_dir, rank=rank, size=4)
        step_hashes([run], limit=6)
        states.append(run.state_dict())
    state = merge_states(states)
    new = source(world, {"prose": 0.3, "short": 0.7}, num_documents=1500)
    child = new.plan(root / "e-child", continue_from=parent, state=state)
    check_removed(parent, child, at=6, removed=1, targets=[0.3, 0.0, 0.7], batch=GLOBAL)
    old = step_hashes([pipeline(parent, tokenizer_dir)])
    full = step_hashes([pipeline(child, tokenizer_dir)])
    assert [full[s] for s in range(6)] == [old[s] for s in range(6)]
    ranks = [pipeline(child, tokenizer_dir, rank=r, size=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
    assert step_hashes(ranks) == {s: h for s, h in full.items() if s >= 6}


def test_the_cli_drops_a_dataset_and_diff_sql_audit_show_it(world, tokenizer_dir, tmp_path) -> None:
    from click.testing import CliRunner

    from zephon.cli import cli

    root, paths = world["root"], world["paths"]
    parent = source(world, {"prose": 0.5, "code": 0.2, "short": 0.3}, num_documents=700).plan(root / "c-parent")
    run = pipeline(parent, tokenizer_dir)
    step_hashes([run], limit=6)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(run.state_dict()))
    lines = ["seed: 5", "datasets:"]
    lines += [f"  - {{name: {n}, path: '{paths[n]}'}}" for n in ("short", "prose")]
    lines += ["mixture: {prose: 0.4, short: 0.6}", "num_documents: 1500"]
    config = tmp_path / "less.yaml"
    config.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    out = tmp_path / "child"
    args = ["plan", str(config), "-o", str(out), "--continue-from", str(parent), "--continue-from-state"]
    result = runner.invoke(cli, [*args, str(state_file)])
    assert result.exit_code == 0, result.output
    assert "  left out after the branch (read by the kept steps only): code\n" in result.output
    check_removed(parent, out, at=6, removed=1, targets=[0.4, 0.0, 0.6], batch=GLOBAL)
    diff = runner.invoke(cli, ["diff", str(parent), str(out)]).output
    assert "branch: B continues A from step 6 (global batch 12)" in diff
    assert "  datasets at the branch: code left out\n" in diff
    assert 'mixture.weights.code          "1/5" → "0"' in diff
    as_json = json.loads(runner.invoke(cli, ["diff", str(parent), str(out), "--format", "json"]).output)
    assert as_json["branch"]["removed"] == ["code"] and as_json["branch"]["added"] == []
    q = "SELECT name, weight FROM datasets ORDER BY dataset_id"
    csv = runner.invoke(cli, ["sql", str(out), q, "--format", "csv"]).output.splitlines()
    assert csv == ["name,weight", "prose,0.4", "code,0.0", "short,0.6"]
    audit = runner.invoke(cli, ["audit", str(out), "--batch-size", str(GLOBAL)])
    assert audit.exit_code == 0, audit.output
    # Bad input, one line each: a dataset renamed, one whose data changed, a left-out one whose files are gone.
    for text, expected in (
        (
            config.read_text().replace("name: prose", "name: words").replace("{prose:", "{words:"),
            "matched by name and content: name it 'prose' again",
        ),
        (config.read_text().replace(paths["prose"], paths["code"]), "dataset 'prose' must hold the data the parent"),
    ):
        bad_config = tmp_path / "bad.yaml"
        bad_config.write_text(text)
        bad = runner.invoke(cli, ["plan", str(bad_config), "-o", str(tmp_path / "bad"), *args[4:], str(state_file)])
        assert bad.exit_code != 0 and expected in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1, bad.output
    moved = tmp_path / "moved"
    shutil.copytree(root / "data", moved)
    lost = source(world, {"prose": 0.6, "code": 0.4}, num_documents=300)
    lost = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(n, str(moved / "demo" / f"{n}-*.parquet")) for n in ("prose", "code")],
        mixture=lost.mixture, seed=5, num_documents=300,
    )  # fmt: skip
    lost_parent = lost.plan(tmp_path / "lost-parent")
    run = pipeline(lost_parent, tokenizer_dir)
    step_hashes([run], limit=2)
    for f in (moved / "demo").glob("code-*.parquet"):
        f.unlink()
    keep = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("prose", str(moved / "demo" / "prose-*.parquet"))],
        mixture=MixtureSpec({"prose": 1.0}), seed=5, num_documents=600,
    )  # fmt: skip
    with pytest.raises(DatasetError, match=r"dataset 'code', left out of the new config, must still be readable"):
        keep.plan(tmp_path / "lost-child", continue_from=lost_parent, state=run.state_dict())


def test_an_exact_token_continuation_drops_a_dataset(world, tokenizer_dir) -> None:
    root, tok, pack = world["root"], world["tok"], PackSpec(max_length=MAX_LENGTH)
    est = TokenEstimation(primer=0.25)
    weights = {"prose": 0.5, "code": 0.2, "short": 0.3}
    parent = source(world, weights, num_tokens=60_000, token_estimation=est, exact_tokens=True)
    parent = parent.plan(root / "t-parent", tokenize=tok, pack=pack)
    new = source(world, {"prose": 0.4, "short": 0.6}, num_tokens=120_000, token_estimation=est, exact_tokens=True)
    child = new.plan(root / "t-child", tokenize=tok, pack=pack, continue_from=parent, at_step=20, global_batch=GLOBAL)
    check_removed(parent, child, at=20, removed=1, targets=[0.4, 0.0, 0.6], batch=GLOBAL, windows=False)
    old, full = step_hashes([pipeline(parent, tokenizer_dir)]), step_hashes([pipeline(child, tokenizer_dir)])
    assert [full[s] for s in range(20)] == [old[s] for s in range(20)]
    assert 119_000 < int(samples(child)["tokens"].sum()) < 121_000  # the budget counts the whole run


@pytest.mark.parametrize("tokens", [False, True], ids=["samples", "tokens"])
def test_an_epochs_budget_counts_the_passes_of_the_datasets_still_read(world, tokenizer_dir, tokens) -> None:
    """Without a document or token budget (``epochs``), the left-out dataset's passes no longer end the plan."""
    root = world["root"]
    kw = {"token_estimation": TokenEstimation(primer=0.25)} if tokens else {}
    tok = {"tokenize": world["tok"]} if tokens else {}
    budget = {"num_tokens": 60_000} if tokens else {"num_documents": 700}
    parent = source(world, {"prose": 0.5, "code": 0.2, "short": 0.3}, **budget, **kw).plan(
        root / f"p-parent-{tokens}", **tok
    )
    run = pipeline(parent, tokenizer_dir)
    step_hashes([run], limit=6)
    new = source(world, {"prose": 0.4, "short": 0.6}, epochs=1, on_exhaustion="stop", **kw)
    child = new.plan(root / f"p-child-{tokens}", continue_from=parent, state=run.state_dict(), **tok)
    manifest = read_manifest(child)
    assert all("'code'" not in w.message for w in manifest.warnings)  # a left-out dataset owes no pass
    prose, code, short = manifest.datasets
    assert code.planned_documents < code.rows  # its pass never completes: it is read no more
    assert max(prose.planned_documents / prose.rows, short.planned_documents / short.rows) == 1.0  # a pass, no more
    c = samples(child)
    assert 1 not in set(c["dataset_id"][manifest.lineage.branch.position :].tolist())
