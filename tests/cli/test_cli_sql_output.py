"""``zephon sql -o FILE``: never a file inside the bundle being read, and an existing file only with --overwrite."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon.cli import cli


@pytest.fixture
def plan(make_parquet, tmp_path) -> Path:
    data = make_parquet("web", [5, 7])
    config = tmp_path / "plan.yaml"
    config.write_text(f"seed: 3\ndatasets:\n  - name: web\n    path: {data}\nmixture: {{web: 1.0}}\n", encoding="utf-8")
    out = tmp_path / "plan"
    assert CliRunner().invoke(cli, ["plan", str(config), "-o", str(out)]).exit_code == 0
    return out


def _bundle(plan: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in plan.iterdir()}


@pytest.mark.parametrize(("fmt", "name"), [("parquet", "samples.parquet"), ("json", "plan.json"), ("csv", "new.csv")])
def test_sql_refuses_to_write_into_the_bundle_it_reads_even_with_overwrite(plan, fmt, name) -> None:
    before = _bundle(plan)
    target = plan / name
    result = CliRunner().invoke(cli, ["sql", str(plan), "SELECT 1 AS x", "-f", fmt, "-o", str(target), "--overwrite"])
    assert result.exit_code == 1
    assert result.output == (
        f"zephon: error: -o must name a file outside the plan bundle being read, got {target} inside {plan} — write "
        "the result elsewhere (a bundle's files are the planner's alone)\n"
    )
    assert _bundle(plan) == before


def test_sql_replaces_an_existing_file_only_with_overwrite(plan, tmp_path) -> None:
    target = tmp_path / "out.parquet"
    target.write_bytes(b"mine")
    args = ["sql", str(plan), "SELECT count(*) AS n FROM samples", "-f", "parquet", "-o", str(target)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.output == (
        f"zephon: error: -o must name a new file, got existing {target} — choose another path or pass --overwrite\n"
    )
    assert target.read_bytes() == b"mine"
    result = CliRunner().invoke(cli, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert pq.read_table(target).column("n").to_pylist() == [12]
