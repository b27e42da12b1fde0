"""The provenance log: ranks log what they yield; `zephon audit PLAN --log DIR` checks it against the plan."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon import Pipeline
from zephon.cli import cli
from zephon.inspection.log_check import check_log
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


@pytest.fixture(scope="module")
def plans(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    from zephon.demo import write_demo_dataset

    root = tmp_path_factory.mktemp("prov")
    write_demo_dataset(root / "data")
    datasets = [Dataset.from_path(k, str(root / "data" / "demo" / f"{k}-*.parquet")) for k in ("code", "short")]
    out = {}
    for kind, exact, algorithm in (
        ("estimated", False, "wrap"),
        ("wrap", True, "wrap"),
        ("best_fit", True, "best_fit"),
    ):
        src = StaticMixtureWorkSource(
            datasets=datasets,
            mixture=MixtureSpec({"code": 0.6, "short": 0.4}),
            seed=1,
            token_estimation=TokenEstimation(calibration_samples=32),
            exact_tokens=exact,
            num_tokens=20_000,
        )
        out[kind] = src.plan(
            root / kind,
            tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir),
            pack=PackSpec(max_length=65, algorithm=algorithm),
        )
    return out


def run(
    plan: Path,
    tokenizer_dir: str,
    log: Path,
    *,
    ranks: int = 2,
    algorithm: str = "wrap",
    steps: int | None = None,
    state: dict | None = None,
) -> list[dict]:
    states = []
    for rank in range(ranks):
        p = (
            Pipeline.from_plan(plan)
            .options(dp_rank=rank, dp_size=ranks, provenance_dir=log)
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=65, algorithm=algorithm)
            .batch(microbatch_size=2, global_batch_size=4)
        )
        if state is not None:
            p.load_state_dict(state)
        for batch in p:
            if steps is not None and batch.step + 1 == steps:
                break
        states.append(p.state_dict())
    return states


@pytest.mark.parametrize("kind", ["estimated", "wrap", "best_fit"])
def test_a_faithful_log_passes_the_audit(plans, tokenizer_dir, tmp_path, kind) -> None:
    algorithm = "best_fit" if kind == "best_fit" else "wrap"
    run(plans[kind], tokenizer_dir, tmp_path / "log", algorithm=algorithm)
    result = CliRunner().invoke(cli, ["audit", str(plans[kind]), "--log", str(tmp_path / "log")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("log: 2 file(s), ") and lines[-1] == "ok: the log matches the plan"
    check = check_log(plans[kind], tmp_path / "log")
    assert check.ok and check.pieces > 0 and check.steps is not None and check.steps[0] == 0


def test_a_resumed_run_adds_a_file_and_still_passes(plans, tokenizer_dir, tmp_path) -> None:
    from zephon import merge_states

    states = run(plans["estimated"], tokenizer_dir, tmp_path / "log", steps=5)
    run(plans["estimated"], tokenizer_dir, tmp_path / "log", state=merge_states(states))
    assert len(list((tmp_path / "log").glob("rank-*.parquet"))) == 4
    check = check_log(plans["estimated"], tmp_path / "log")
    assert check.ok, check.mismatches


@pytest.mark.parametrize("kind", ["estimated", "wrap"])
def test_a_planted_mismatch_fails_the_audit(plans, tokenizer_dir, tmp_path, kind) -> None:
    run(plans[kind], tokenizer_dir, tmp_path / "log")
    victim = sorted((tmp_path / "log").glob("rank-00001-*.parquet"))[0]
    table = pq.read_table(victim)
    positions = table.column("position").to_pylist()
    positions[3] = positions[3] + 1  # a document that was not planned there
    table = table.set_column(table.schema.get_field_index("position"), "position", pa.array(positions, pa.int64()))
    pq.write_table(table, victim)
    result = CliRunner().invoke(cli, ["audit", str(plans[kind]), "--log", str(tmp_path / "log")])
    assert result.exit_code == 1
    assert any(line.startswith("MISMATCH ") for line in result.output.splitlines())
    assert result.output.splitlines()[-1].startswith("FAIL: ")


def test_a_log_of_another_plan_is_reported(plans, tokenizer_dir, tmp_path) -> None:
    run(plans["wrap"], tokenizer_dir, tmp_path / "log", ranks=1)
    check = check_log(plans["best_fit"], tmp_path / "log")
    assert not check.ok and check.mismatches[0].startswith("log must be for plan ")


def test_documents_skipped_by_the_policy_are_reported_not_mismatched(tokenizer_dir, tmp_path) -> None:
    import json

    lines = [json.dumps({"text": f"document {i} " + "word " * (i % 7)}) for i in range(60)]
    for bad in (5, 17, 18, 41):
        lines[bad] = json.dumps({"text": None})
    lines[23] = json.dumps({"body": "no text"})
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    src = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(tmp_path / "web"))], mixture=MixtureSpec({"web": 1}), seed=2, lanes=4
    )
    plan = src.plan(tmp_path / "plan")
    log = tmp_path / "log"
    for rank in range(2):
        pipe = (
            Pipeline.from_plan(plan)
            .options(dp_rank=rank, dp_size=2, provenance_dir=log, on_bad_document="skip")
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=16)
            .batch(microbatch_size=2, global_batch_size=4)
        )
        for _ in pipe:
            pass
    check = check_log(plan, log)
    assert check.ok, check.mismatches
    assert check.skipped == {"missing_field": 1, "null_text": 4}
    result = CliRunner().invoke(cli, ["audit", str(plan), "--log", str(log)])
    assert result.exit_code == 0, result.output
    assert "  skipped by the skip policy: 5 documents (missing_field 1, null_text 4)" in result.output.splitlines()
    # Without the list of skipped documents, the lanes have holes: the check must fail.
    moved = []
    for f in sorted(log.glob("skipped-*.parquet")):
        moved.append(f.rename(tmp_path / f.name))
    assert not check_log(plan, log).ok
    for f in moved:
        f.rename(log / f.name)
    # A document listed as skipped whose tokens were yielded anyway is a mismatch.
    meta = pq.read_table(log / moved[0].name).schema.metadata
    logged = pq.read_table(sorted(log.glob("rank-*.parquet"))[0]).column("position").to_pylist()[0]
    fake = pa.table({"position": [logged], "reason": ["null_text"]}).replace_schema_metadata(meta)
    pq.write_table(fake, log / "skipped-rank-99999-worker-00-from-000000000.parquet")
    bad = check_log(plan, log)
    assert not bad.ok
    assert bad.mismatches[0].startswith(f"position {logged} was skipped (null_text), got its tokens in sequence")


def test_a_log_is_replaced_only_by_a_log_of_its_own_plan(plans, tokenizer_dir, tmp_path) -> None:
    """provenance_dir shared by two runs, or pointed at a folder of the user's: nothing but this plan's own log (or
    one a crash left without its footer) is overwritten."""
    import pytest as _pytest

    from zephon.errors import ConfigError

    log = tmp_path / "log"
    run(plans["wrap"], tokenizer_dir, log, ranks=1)
    (first,) = sorted(log.glob("rank-*.parquet"))
    before = first.read_bytes()
    run(plans["wrap"], tokenizer_dir, log, ranks=1)  # the same plan's steps logged again: replaced
    assert check_log(plans["wrap"], log).ok and first.read_bytes() == before
    with _pytest.raises(ConfigError, match=rf"^provenance_dir must hold this plan's logs only, got {first}: a log of "
                        r"another plan \(config_hash [0-9a-f]{16}…\) — choose another provenance_dir, or move that "
                        r"file away \(nothing was replaced\)$"):
        run(plans["best_fit"], tokenizer_dir, log, ranks=1, algorithm="best_fit")
    assert first.read_bytes() == before
    first.write_text("my notes\n")  # a file of the user's under that name
    with _pytest.raises(ConfigError, match=r"got \S+: not a Zephon provenance log — "):
        run(plans["wrap"], tokenizer_dir, log, ranks=1)
    assert first.read_text() == "my notes\n"
    first.write_bytes(before[: len(before) // 2])  # a log a crash cut short: PAR1 and no footer
    run(plans["wrap"], tokenizer_dir, log, ranks=1)
    assert first.read_bytes() == before


def test_a_provenance_dir_that_cannot_be_a_local_folder_is_one_line(plans, tokenizer_dir, tmp_path) -> None:
    """An empty path logged into the working directory; a URL into a local folder named 's3:'; a file was
    FileExistsError; a file above it NotADirectoryError."""
    import pytest as _pytest

    from zephon.errors import ConfigError
    from zephon.executor.settings import ExecutorSpec

    (tmp_path / "afile").write_text("mine")
    cases = [
        ("", r"^provenance_dir must name a local directory, got '' — pass a path such as 'logs/run1'$"),
        ("  ", r"^provenance_dir must name a local directory, got '  '"),
        ("s3://bucket/logs", r"^provenance_dir must be a local directory, got 's3://bucket/logs' — logs are written "
         r"where the rank runs: log to a local folder and copy it afterwards$"),
        (str(tmp_path / "afile"), r"^provenance_dir must be a directory, got a file at '\S+afile' — choose another "
         r"provenance_dir$"),
    ]  # fmt: skip
    for path, message in cases:
        with _pytest.raises(ConfigError, match=message):  # refused as the option is given
            ExecutorSpec(provenance_dir=path)
        with _pytest.raises(ConfigError, match=message):
            Pipeline.from_plan(plans["wrap"]).options(provenance_dir=path)
    with _pytest.raises(ConfigError, match=r"^provenance_dir '\S+afile/sub' must be a folder Zephon can make, got "
                        r"\[Errno 20\] Not a directory: .* — choose another provenance_dir$"):
        run(plans["wrap"], tokenizer_dir, tmp_path / "afile" / "sub", ranks=1)
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("kind", ["estimated", "wrap"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_loader_with_workers_logs_what_it_handed_out(plans, tokenizer_dir, tmp_path, kind, workers) -> None:
    """A DataLoader worker makes pieces ahead of training (its prefetch), and each wrote them to its log as it
    made them: after 7 microbatches handed out, the log held up to 64 (2 workers: 112), and a resume from the
    loader's state logged those again — the log said training saw what it never took. The loader now writes
    each piece's rows when it hands the piece out."""
    import duckdb

    def loader(log: Path):
        return (
            Pipeline.from_plan(plans[kind])
            .options(provenance_dir=log)
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=65)
            .batch(microbatch_size=2, global_batch_size=4)
            .dataloader(num_workers=workers)
        )

    whole = tmp_path / "whole"
    for _ in loader(whole):
        pass
    log = tmp_path / "log"
    first = loader(log)
    batches = iter(first)
    for _ in range(7):
        next(batches)
    state = first.state_dict()
    del batches  # the run stops here (a preemption)
    taken = duckdb.sql(f"select count(distinct (step, microbatch)) from '{log}/rank-*.parquet'").fetchall()
    assert taken == [(7,)]  # what training took, not what the workers made ahead
    second = loader(log)
    second.load_state_dict(state)
    for _ in second:
        pass
    query = "select step, microbatch, sequence, \"offset\", position, doc_start, length from '{}/rank-*.parquet' order by all"
    assert duckdb.sql(query.format(log)).fetchall() == duckdb.sql(query.format(whole)).fetchall()  # none twice
    assert check_log(plans[kind], log).ok
    assert {p.name for p in log.glob("rank-*.parquet")} == {
        "rank-00000-worker-00-from-000000000.parquet",
        f"rank-00000-worker-00-from-{state['step']:09d}.parquet",
    }
