"""A damaged plan bundle is one line from every command that opens it: missing, truncated, foreign or edited
files are refused when the bundle is opened (``zephon.plan.bundle.open_bundle``), by ``zephon sql``, ``show``,
``audit``, ``diff`` and ``Pipeline.from_plan`` alike, with a line that names the file (and plan.json's keys).

Each case damages a copy of a real plan; the expected line is the whole of stderr, and stdout is empty.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import write_jsonl_dataset, write_parquet_dataset
from support.synthetic_plans import write_synthetic_plan

from zephon import Pipeline
from zephon.cli import cli
from zephon.errors import PlanFormatError
from zephon.executor.plan_reader import PlanBundle
from zephon.io import Dataset
from zephon.plan.bundle import open_bundle
from zephon.plan.footer import read_footer
from zephon.plan.integrity import config_digest, row_group_digest
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

DAMAGED = "the file is truncated or damaged; restore it or re-plan"
INCOMPLETE = "the bundle is incomplete; restore the file or re-plan"
FIX = "restore the bundle as the planner wrote it, or re-plan (a plan is changed by re-planning, not by editing it)"


def _source(root: Path, *, seed: int = 7, **kw: Any) -> StaticMixtureWorkSource:
    web = root / "web" if (root / "web").is_dir() else write_parquet_dataset(root, "web", [13, 9, 11])
    books = root / "books" if (root / "books").is_dir() else write_jsonl_dataset(root, "books", [7, 12])
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web)), Dataset.from_path("books", str(books))],
        mixture=MixtureSpec({"web": 0.6, "books": 0.4}),
        seed=seed,
        **kw,
    )


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> dict[str, Path]:
    """``samples``: a sample-mixture plan; ``other``: the same with another seed; ``best_fit``: an exact plan."""
    root = tmp_path_factory.mktemp("bundles")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEPHON_CACHE_DIR", str(root / "cache"))
        tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
        exact = {"token_estimation": TokenEstimation(primer="measure"), "exact_tokens": True}
        return {
            "samples": _source(root, num_documents=60).plan(root / "samples"),
            "other": _source(root, seed=8, num_documents=60).plan(root / "other"),
            "best_fit": _source(root, **exact).plan(
                root / "best_fit", tokenize=tok, pack=PackSpec(max_length=33, algorithm="best_fit")
            ),
        }


# ------------------------------------------------------------------------------------------------ damage
def _truncate(name: str) -> Callable[[Path, dict[str, Path]], str]:
    def damage(plan: Path, _plans: dict[str, Path]) -> str:
        file = plan / name
        data = file.read_bytes()
        file.write_bytes(data[: len(data) // 2])
        return (
            f"{file} must be a complete Parquet file, got a file that does not end with the Parquet magic bytes PAR1 "
            f"(truncated or not Parquet) — {DAMAGED}"
        )

    return damage


def _remove(name: str) -> Callable[[Path, dict[str, Path]], str]:
    def damage(plan: Path, _plans: dict[str, Path]) -> str:
        (plan / name).unlink()
        return f"plan bundle file {plan / name} must exist, got nothing there — {INCOMPLETE}"

    return damage


def _empty_samples(plan: Path, _plans: dict[str, Path]) -> str:
    (plan / "samples.parquet").write_bytes(b"")
    return (
        f"{plan / 'samples.parquet'} must be a complete Parquet file, got a file of 0 bytes, shorter than a Parquet "
        f"header and footer (empty or truncated) — {DAMAGED}"
    )


def _directory_for_shards(plan: Path, _plans: dict[str, Path]) -> str:
    (plan / "shards.parquet").unlink()
    (plan / "shards.parquet").mkdir()
    return f"plan bundle file {plan / 'shards.parquet'} must exist, got a directory — {INCOMPLETE}"


def _garbage_footer(plan: Path, _plans: dict[str, Path]) -> str:
    # Ends like Parquet (a footer length and PAR1), but the footer is not Thrift.
    (plan / "samples.parquet").write_bytes(b"PAR1" + b"\x07" * 64 + (64).to_bytes(4, "little") + b"PAR1")
    return f"{plan / 'samples.parquet'} must be a complete Parquet file, got "


def _record(file: Path) -> dict[str, Any]:
    return json.loads((file.parent / "plan.json").read_text(encoding="utf-8"))["integrity"]["files"][file.name]


def _changed(file: Path, was: dict[str, Any]) -> str:
    """The line for ``file`` changed from its record ``was``: the first of size, footer, edge row groups to differ."""
    now = read_footer(file)
    if now.size != was["bytes"]:
        want, got = f"{was['bytes']} bytes", f"{now.size} bytes"
    elif now.fingerprint != was["fingerprint"]:
        want, got = f"footer {was['fingerprint']}", f"footer {now.fingerprint}"
    else:
        want, got = f"first and last row groups {was['row_groups']}", row_group_digest(file, now.metadata())
    return f"{file} must be the file the plan was written with ({want}), got {got} — it changed since planning; {FIX}"


def _foreign_samples(plan: Path, plans: dict[str, Path]) -> str:
    # Another file under the same footer: the first data bytes of another seed's samples in place of this plan's,
    # size and footer kept (since row and tokens are BYTE_STREAM_SPLIT, two seeds' small plans no longer
    # share a whole footer by chance): the edge row groups tell them apart.
    file = plan / "samples.parquet"
    was = _record(file)
    data, other = bytearray(file.read_bytes()), (plans["other"] / "samples.parquet").read_bytes()
    ours = pq.ParquetFile(file).metadata.row_group(0).column(3)  # the "row" column's chunk
    at, theirs = ours.data_page_offset, pq.ParquetFile(plans["other"] / "samples.parquet").metadata.row_group(0)
    there = theirs.column(3).data_page_offset
    size = min(ours.total_compressed_size, theirs.column(3).total_compressed_size)
    j = next(i for i in range(size) if data[at + i] != other[there + i])  # past the page header they share
    data[at + j : at + j + 8] = other[there + j : there + j + 8]
    file.write_bytes(bytes(data))
    assert read_footer(file).fingerprint == was["fingerprint"]
    return _changed(file, was)


def _rewritten_samples(plan: Path, _plans: dict[str, Path]) -> str:
    # The same rows, written again (another compression): a changed file, though every value is the same.
    file = plan / "samples.parquet"
    was = _record(file)
    pq.write_table(pq.read_table(file), file, compression="gzip")
    return _changed(file, was)


def _foreign_bins(plan: Path, _plans: dict[str, Path]) -> str:
    # bins.parquet with one piece moved: same rows, same columns, another file.
    file = plan / "bins.parquet"
    was = _record(file)
    table = pq.read_table(file)
    length = table.column("length").to_pylist()
    length[0], length[-1] = length[0] - 1, length[-1] + 1
    pq.write_table(table.set_column(4, "length", pa.array(length, pa.int32())), file)
    return _changed(file, was)


def _other_columns(plan: Path, _plans: dict[str, Path]) -> str:
    pq.write_table(pa.table({"text": ["a", "b"], "score": [1.0, 2.0]}), plan / "samples.parquet")
    return (
        f"{plan / 'samples.parquet'} must have the column 'position' (int64), got a file with columns [text, score] "
        "— it is not a file of this plan format; restore the bundle's own file or re-plan"
    )


def _edit_json(change: Callable[[dict[str, Any]], None], keys: str) -> Callable[[Path, dict[str, Path]], str]:
    def damage(plan: Path, _plans: dict[str, Path]) -> str:
        data = json.loads((plan / "plan.json").read_text(encoding="utf-8"))
        change(data)
        (plan / "plan.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
        return f"{plan / 'plan.json'} must be as the planner wrote it, got edited keys ({keys}) since planning — {FIX}"

    return damage


def _seed(data: dict[str, Any]) -> None:
    data["seed"] = 8


def _weight(data: dict[str, Any]) -> None:
    data["datasets"][0]["weight"] = 0.9
    data["mixture"]["weights"]["web"] = 0.9


def _added(data: dict[str, Any]) -> None:
    data["notes"] = "mine"


def _old_plan_edited(plan: Path, _plans: dict[str, Path]) -> str:
    # A plan written before the integrity record (no key) whose config was edited: config_hash still catches it.
    data = json.loads((plan / "plan.json").read_text(encoding="utf-8"))
    del data["integrity"]
    data["config"]["seed"] = 8
    (plan / "plan.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    got = config_digest(data["config"])
    return (
        f"{plan / 'plan.json'} config must hash to its config_hash {data['config_hash'][:12]}, got {got[:12]} — the "
        f"config or config_hash was edited since planning; {FIX}"
    )


def _truncated_json(plan: Path, _plans: dict[str, Path]) -> str:
    text = (plan / "plan.json").read_text(encoding="utf-8")
    (plan / "plan.json").write_text(text[:40], encoding="utf-8")
    return f"{plan / 'plan.json'} must be valid JSON, got "


#: case → (plan, damage returning the expected line, whether the line is only a prefix).
CASES: dict[str, tuple[str, Callable[[Path, dict[str, Path]], str], bool]] = {
    "truncated samples": ("samples", _truncate("samples.parquet"), False),
    "truncated shards": ("samples", _truncate("shards.parquet"), False),
    "truncated bins": ("best_fit", _truncate("bins.parquet"), False),
    "empty samples": ("samples", _empty_samples, False),
    "garbage footer": ("samples", _garbage_footer, True),
    "missing samples": ("samples", _remove("samples.parquet"), False),
    "missing shards": ("samples", _remove("shards.parquet"), False),
    "missing bins": ("best_fit", _remove("bins.parquet"), False),
    "directory for shards": ("samples", _directory_for_shards, False),
    "another plan's samples": ("samples", _foreign_samples, False),
    "samples rewritten": ("samples", _rewritten_samples, False),
    "bins changed": ("best_fit", _foreign_bins, False),
    "samples with other columns": ("samples", _other_columns, False),
    "edited seed": ("samples", _edit_json(_seed, "changed 'seed'"), False),
    "edited weight": ("samples", _edit_json(_weight, "changed 'datasets', 'mixture'"), False),
    "added key": ("samples", _edit_json(_added, "added 'notes'"), False),
    "old plan, edited config": ("samples", _old_plan_edited, False),
    "truncated plan.json": ("samples", _truncated_json, True),
}


@pytest.fixture(params=sorted(CASES))
def damaged(request: pytest.FixtureRequest, plans: dict[str, Path], tmp_path: Path) -> tuple[Path, str, bool, str]:
    """A damaged copy of a plan: (bundle, expected line, prefix only, kind of plan)."""
    kind, damage, prefix = CASES[request.param]
    plan = tmp_path / "damaged"
    shutil.copytree(plans[kind], plan)
    return plan, damage(plan, plans), prefix, kind


def _commands(plan: Path, good: Path, kind: str) -> dict[str, list[str]]:
    batch = ["-b", "4"] if kind == "samples" else ["-b", "2"]
    return {
        "sql": ["sql", str(plan), "SELECT count(*) FROM samples"],
        "show": ["show", str(plan), "-s", "0", "--no-text", *batch],
        "audit": ["audit", str(plan), "-t", "100", *batch],
        "diff A": ["diff", str(plan), str(good)],
        "diff B": ["diff", str(good), str(plan)],
    }


def _one_line(text: str, expected: str, prefix: bool) -> None:
    assert text.endswith("\n") and text.count("\n") == 1, text
    line = text.removesuffix("\n")
    assert line.startswith(expected) if prefix else line == expected, line
    assert "Traceback" not in line


def test_every_command_prints_one_line_for_a_damaged_bundle(damaged, plans) -> None:
    plan, expected, prefix, kind = damaged
    for name, args in _commands(plan, plans[kind], kind).items():
        result = CliRunner().invoke(cli, args, prog_name="zephon")
        assert result.exit_code == 1, (name, result.output, result.exception)
        assert result.stdout == "", name
        _one_line(result.stderr, "zephon: error: " + expected, prefix)


def test_pipeline_from_plan_raises_one_plan_format_error(damaged) -> None:
    plan, expected, prefix, _kind = damaged
    with pytest.raises(PlanFormatError) as refused:
        Pipeline.from_plan(plan)
    _one_line(str(refused.value) + "\n", expected, prefix)


def test_a_plan_path_that_is_not_a_plan_directory_says_what_is_there(tmp_path, monkeypatch, plans) -> None:
    """A file, nothing, or an empty directory each named as such; None, "" and a number are not paths ("" was the
    working directory, whose plan.json was then read)."""
    shutil.copy(plans["samples"] / "plan.json", tmp_path / "plan.json")  # a plan.json "" would have found
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    fix = " — pass a directory written by `zephon plan` or work_source.plan(DIR)"
    cases = {
        tmp_path / "notes.txt": f"must contain plan.json, got a file at {tmp_path / 'notes.txt'}",
        tmp_path / "nope": f"must contain plan.json, got nothing at {tmp_path / 'nope'}",
        tmp_path / "empty": f"must contain plan.json, got none at {tmp_path / 'empty' / 'plan.json'}",
        None: "must be a path, got None",
        "": "must be a path, got ''",
        3: "must be a path, got 3",
    }
    for path, expected in cases.items():
        with pytest.raises(PlanFormatError) as refused:
            Pipeline.from_plan(path)  # type: ignore[arg-type]
        assert str(refused.value) == f"plan directory {expected}{fix}", path


def test_a_bundle_damaged_after_from_plan_is_refused_when_iterated(plans, tmp_path, tokenizer_dir) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plans["samples"], plan)
    pipe = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=65).batch(microbatch_size=2)
    )
    assert len(list(pipe)) > 0
    expected = _edit_json(_seed, "changed 'seed'")(plan, plans)
    with pytest.raises(PlanFormatError) as refused:
        list(pipe)
    assert str(refused.value) == expected


# ------------------------------------------------------------------------------------------------ what opens
def _good(plan: Path, kind: str) -> None:
    for name, args in _commands(plan, plan, kind).items():
        result = CliRunner().invoke(cli, args, prog_name="zephon")
        assert result.exit_code == 0, (name, result.output)
    PlanBundle(plan)


def test_a_plan_written_before_the_integrity_record_still_opens(plans, tmp_path) -> None:
    plan = tmp_path / "old"
    shutil.copytree(plans["best_fit"], plan)
    data = json.loads((plan / "plan.json").read_text(encoding="utf-8"))
    del data["integrity"]
    (plan / "plan.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    assert not open_bundle(plan).sealed
    _good(plan, "best_fit")


def test_reformatting_plan_json_or_recording_a_batch_size_is_not_an_edit(plans, tmp_path) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plans["samples"], plan)
    data = json.loads((plan / "plan.json").read_text(encoding="utf-8"))
    data["batch"] = {"global_batch_size": 4}  # an inspection default (docs/cli.md), not part of the plan
    reordered = dict(reversed(list(data.items())))
    (plan / "plan.json").write_text(json.dumps(reordered, separators=(",", ":")), encoding="utf-8")
    assert open_bundle(plan).sealed
    _good(plan, "samples")
    result = CliRunner().invoke(cli, ["show", str(plan), "-s", "0", "--no-text"])  # -b from plan.json
    assert result.exit_code == 0, result.output


def test_every_file_the_planner_writes_is_recorded(plans) -> None:
    for kind, plan in plans.items():
        bundle = open_bundle(plan)
        record = json.loads((plan / "plan.json").read_text(encoding="utf-8"))["integrity"]
        names = {p.name for p in plan.iterdir() if p.suffix == ".parquet"}
        assert set(record["files"]) == names, kind
        for name in names:
            footer = read_footer(plan / name)
            digest = row_group_digest(plan / name, footer.metadata())
            assert record["files"][name] == {
                "bytes": footer.size,
                "fingerprint": footer.fingerprint,
                "row_groups": digest,
            }
        assert bundle.sealed and bundle.manifest.config_hash == config_digest(bundle.manifest.config)


# ------------------------------------------------------------------------------------------------ the limit
def test_a_damaged_page_of_a_middle_row_group_is_one_line_when_it_is_read(tmp_path) -> None:
    """Not caught when the bundle is opened (docs/plan-format.md says so: only the footer and the first and last
    row groups are read), but never a traceback: the commands that decode the page fail with one line."""
    plan = write_synthetic_plan(tmp_path, 200_000)  # 4 row groups
    file = plan / "samples.parquet"
    chunk = pq.read_metadata(file).row_group(1).column(3)  # `row` of the second row group
    data = bytearray(file.read_bytes())
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    file.write_bytes(bytes(data))
    assert open_bundle(plan).sealed  # opens: the footer and the edge row groups are as written
    sql = CliRunner().invoke(cli, ["sql", str(plan), "SELECT sum(row) FROM samples"])
    assert (sql.exit_code, sql.stdout) == (1, "")
    _one_line(sql.stderr, "zephon: error: Invalid Input Error: reading the stream registered as 'samples' failed", True)
    diff = CliRunner().invoke(cli, ["diff", str(plan), str(plan)])
    assert (diff.exit_code, diff.stdout) == (1, "")
    _one_line(diff.stderr, f"zephon: error: {file} must be readable Parquet, got Corrupt snappy compressed data", True)
    assert diff.stderr.endswith(f" — {DAMAGED}\n")
