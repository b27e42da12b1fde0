"""Never touch what is not ours: ``zephon plan --overwrite`` replaces a plan bundle or an empty directory, and
refuses anything else without changing a byte of it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from zephon.cli import cli
from zephon.config_file import load_work_source
from zephon.errors import ConfigError


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.fixture
def config(make_parquet, tmp_path) -> tuple[Path, Path]:
    data = make_parquet("web", [5, 7])
    file = tmp_path / "plan.yaml"
    file.write_text(f"seed: 3\ndatasets:\n  - name: web\n    path: {data}\nmixture: {{web: 1.0}}\n", encoding="utf-8")
    return file, data


def _plan(config_file: Path, out: Path, *extra: str):
    return CliRunner().invoke(cli, ["plan", str(config_file), "-o", str(out), *extra])


def test_overwrite_aimed_at_the_dataset_being_planned_changes_nothing(config) -> None:
    config_file, data = config
    before = _tree(data)
    result = _plan(config_file, data, "--overwrite")
    assert result.exit_code == 1
    assert result.output == (
        f"zephon: error: overwrite replaces only a plan bundle, got {data} with 'part-00000.parquet' in it — nothing "
        "was changed; choose another output directory (overwrite never deletes what a plan writer did not write)\n"
    )
    assert _tree(data) == before
    assert sorted(p.name for p in data.parent.iterdir()) == ["web"]  # no temporary left beside it


def test_overwrite_of_a_bundle_with_a_users_file_in_it_changes_nothing(config, tmp_path) -> None:
    config_file, _ = config
    out = tmp_path / "plan"
    assert _plan(config_file, out).exit_code == 0
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    before = _tree(out)
    result = _plan(config_file, out, "--overwrite")
    assert result.exit_code == 1
    assert "got " + str(out) + " with 'notes.txt' in it — nothing was changed" in result.output
    assert _tree(out) == before


def test_overwrite_of_a_directory_without_plan_json_is_refused(config, tmp_path) -> None:
    config_file, _ = config
    out = tmp_path / "looks-like-a-plan"
    out.mkdir()
    (out / "samples.parquet").write_bytes(b"user bytes")
    result = _plan(config_file, out, "--overwrite")
    assert result.exit_code == 1
    assert f"got {out} with no plan.json in it" in result.output
    assert (out / "samples.parquet").read_bytes() == b"user bytes"


def test_overwrite_replaces_a_plan_bundle_and_an_output_that_is_a_file_is_refused(config, tmp_path) -> None:
    config_file, _ = config
    out = tmp_path / "plan"
    assert _plan(config_file, out).exit_code == 0
    first = _tree(out)
    assert _plan(config_file, out, "--overwrite").exit_code == 0
    assert _tree(out) == first  # the same plan, written again
    file = tmp_path / "file"
    file.write_text("mine", encoding="utf-8")
    assert _plan(config_file, file, "--overwrite").exit_code == 2  # click: "Directory ... is a file."
    with pytest.raises(ConfigError, match=f"^plan output must be a directory, got a file at {file} — "):
        load_work_source(config_file).plan(file, overwrite=True)
    assert file.read_text(encoding="utf-8") == "mine"


def test_an_out_dir_that_is_no_local_directory_is_refused_and_nothing_is_made(config, tmp_path, monkeypatch) -> None:
    """An empty path was the working directory; a blank one a folder named by spaces (and a lock file beside it);
    an s3:// URL a local folder named 's3:' and an ArrowInvalid; None a TypeError; a file above the output a
    'File exists' storage error."""
    config_file, _ = config
    source = load_work_source(config_file)
    (tmp_path / "file").write_text("mine", encoding="utf-8")
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    cases = [
        ("", r"^plan out_dir must name a local directory, got '' — pass a path such as 'plans/web'$"),
        ("  ", r"^plan out_dir must name a local directory, got '  '"),
        (None, r"^plan out_dir must name a local directory, got None"),
        ("s3://bucket/plans/web", r"^plan out_dir must be a local directory, got 's3://bucket/plans/web' — a plan "
         r"bundle is written locally; copy it where the ranks read it afterwards$"),
        (tmp_path / "file" / "plan", rf"^plan output must be in a directory, got a file at {tmp_path / 'file'} — "),
    ]  # fmt: skip
    for out, message in cases:
        with pytest.raises(ConfigError, match=message):
            source.plan(out)
    assert list(work.iterdir()) == [] and (tmp_path / "file").read_text(encoding="utf-8") == "mine"


def _dropping_a_file_while_planning(monkeypatch, out: Path) -> None:
    """A user's file put into ``out`` while the plan is being written (after the samples, before the rename)."""
    from zephon.planner import build

    close = build.SamplesWriter.close

    def close_then_drop(self):
        out.mkdir(exist_ok=True)
        (out / "notes.txt").write_text("mine", encoding="utf-8")
        return close(self)

    monkeypatch.setattr(build.SamplesWriter, "close", close_then_drop)


@pytest.mark.parametrize("existing", [False, True], ids=["new output", "overwrite of a bundle"])
def test_a_file_put_into_the_output_while_planning_is_kept_and_the_plan_refused(
    config, tmp_path, monkeypatch, existing
) -> None:
    config_file, _ = config
    out = tmp_path / "plan"
    if existing:
        assert _plan(config_file, out).exit_code == 0
    before = _tree(out) if existing else {}
    _dropping_a_file_while_planning(monkeypatch, out)
    result = _plan(config_file, out, *(["--overwrite"] if existing else []))
    assert result.exit_code == 1
    assert result.output == (
        f"zephon: error: the plan bundle must replace only what a writer of it wrote, got {out} holding 'notes.txt' "
        "at the moment of replacing (put there while writing) — nothing was changed and the new one was discarded; "
        "move that out and write again, or choose another path\n"
    )
    assert _tree(out) == before | {"notes.txt": hashlib.sha256(b"mine").hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".plan.")) == [".plan.lock"]  # no temporary


def test_a_second_writer_of_the_same_output_fails_in_one_line_and_changes_nothing(config, tmp_path) -> None:
    import fcntl
    import os

    config_file, _ = config
    out = tmp_path / "plan"
    assert _plan(config_file, out).exit_code == 0
    before = _tree(out)
    lock = os.open(tmp_path / ".plan.lock", os.O_RDWR)  # another plan writing `out` holds this lock meanwhile
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = _plan(config_file, out, "--overwrite")
    finally:
        os.close(lock)
    assert result.exit_code == 1
    assert result.output == (
        f"zephon: error: the plan bundle at {out} must have one writer at a time, got another writing it now (it "
        f"holds {tmp_path / '.plan.lock'}) — wait for it to finish, or write to another path\n"
    )
    assert _tree(out) == before
    assert _plan(config_file, out, "--overwrite").exit_code == 0  # once it is done, the output is free again
