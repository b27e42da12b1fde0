"""``zephon plan`` prints a plan's warnings (budget not met, heavy repetition) as ``zephon: warning:`` lines on
stderr after the summary, and still exits 0 (plan.json ``warnings``; docs/plans.md)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from conftest import write_parquet_dataset

from zephon.cli import cli


def _config(root: Path, body: str) -> Path:
    write_parquet_dataset(root, "a", [2])
    write_parquet_dataset(root, "b", [3])
    config = root / "mix.yaml"
    config.write_text(
        "seed: 0\ndatasets:\n  - {name: a, path: a}\n  - {name: b, path: b}\nmixture: {a: 0.5, b: 0.5}\n" + body,
        encoding="utf-8",
    )
    return config


def _plan(config: Path, out: Path):
    return CliRunner().invoke(cli, ["plan", str(config), "-o", str(out)], prog_name="zephon")


def test_a_budget_not_met_is_a_warning_line_after_the_summary_and_exit_0(tmp_path) -> None:
    config = _config(tmp_path, "num_documents: 100000\non_exhaustion: stop\n")
    result = _plan(config, tmp_path / "plan")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("planned 4 documents from 2 datasets (2 shards)")
    assert result.stderr == (
        "zephon: warning: budget not met: num_documents 100000 asked, 4 planned — on_exhaustion stop ended the plan "
        "before dataset 'a' (2 documents) would start pass 2; add data, lower num_documents, or set on_exhaustion "
        "to new_epoch to repeat datasets\n"
    )
    recorded = json.loads((tmp_path / "plan" / "plan.json").read_text(encoding="utf-8"))["warnings"]
    assert [w["kind"] for w in recorded] == ["budget_not_met"]


def test_heavy_repetition_prints_one_line_per_dataset(tmp_path) -> None:
    config = _config(tmp_path, "num_documents: 7016\n")
    result = _plan(config, tmp_path / "plan")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "zephon: warning: heavy repetition: dataset 'a' is planned for 1754.00 passes (3508 documents of 2), more "
        "than 4 × its epochs budget 1 — add data to it, lower its weight, or set on_exhaustion to stop",
        "zephon: warning: heavy repetition: dataset 'b' is planned for 1169.33 passes (3508 documents of 3), more "
        "than 4 × its epochs budget 1 — add data to it, lower its weight, or set on_exhaustion to stop",
    ]
    assert "Warning" not in result.stdout  # no Python warning text anywhere


def test_a_plan_without_shortfalls_prints_nothing_on_stderr(tmp_path) -> None:
    result = _plan(_config(tmp_path, "num_documents: 5\n"), tmp_path / "plan")
    assert result.exit_code == 0 and result.stderr == ""
