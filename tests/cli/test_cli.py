"""Tests for the ``zephon`` CLI (``zephon.cli``) and the SQL views it serves (``zephon.inspection.sql``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner, Result

from zephon.cli import cli
from zephon.cli.output import format_table
from zephon.cli.sql_command import param_value
from zephon.config_file import load_work_source
from zephon.demo import demo_dataset_paths
from zephon.errors import PlanFormatError
from zephon.inspection.sql import connect, run_sql

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

YAML_CONFIG = """\
seed: 7
datasets:
  - name: prose
    path: demo/prose-*.parquet
  - name: code
    path: demo/code-*.parquet
  - name: short
    path: demo/short-*.parquet
mixture: {prose: 0.5, code: 0.3, short: 0.2}
num_documents: 1000
shuffle: {enabled: true, window_shards: 2}
"""

TOML_CONFIG = """\
seed = 7
num_documents = 1000
mixture = { prose = 0.5, code = 0.3, short = 0.2 }
shuffle = { enabled = true, window_shards = 2 }

[[datasets]]
name = "prose"
path = "demo/prose-*.parquet"

[[datasets]]
name = "code"
path = "demo/code-*.parquet"

[[datasets]]
name = "short"
path = "demo/short-*.parquet"
"""

DATASET_LINES = (
    "  prose  weight 0.500  documents 500  passes 0.42\n"
    "  code   weight 0.300  documents 300  passes 0.50\n"
    "  short  weight 0.200  documents 200  passes 0.10\n"
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo dataset under ``demo/`` with ``mix.yaml`` and ``mix.toml`` beside it (relative paths)."""
    root = tmp_path_factory.mktemp("project")
    demo_dataset_paths(root=root)
    (root / "mix.yaml").write_text(YAML_CONFIG, encoding="utf-8")
    (root / "mix.toml").write_text(TOML_CONFIG, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def plan_dir(project: Path) -> Path:
    out = project / "plan-yaml"
    result = _invoke("plan", str(project / "mix.yaml"), "-o", str(out))
    assert result.exit_code == 0, result.output
    return out


def _invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, prog_name="zephon")


def _config_hash(plan: Path) -> str:
    return json.loads((plan / "plan.json").read_text(encoding="utf-8"))["config_hash"]


def _zephon_script() -> str:
    script = Path(sys.executable).parent / "zephon"
    found = str(script) if script.is_file() else shutil.which("zephon")
    assert found, "the `zephon` console script must be installed (pip install -e '.[dev]')"
    return found


# ----------------------------------------------------------------------------------------------------
# zephon plan
# ----------------------------------------------------------------------------------------------------


def test_plan_prints_summary_and_aligned_dataset_lines(plan_dir: Path) -> None:
    result = _invoke("plan", str(plan_dir.parent / "mix.yaml"), "-o", str(plan_dir), "--overwrite")
    assert result.exit_code == 0, result.output
    config = _config_hash(plan_dir)[:12]
    assert re.fullmatch(r"[0-9a-f]{12}", config)
    assert result.stdout == (
        f"planned 1000 documents from 3 datasets (7 shards) → {plan_dir}  config {config}\n" + DATASET_LINES
    )
    assert result.stderr == ""


def test_plan_from_yaml_and_toml_are_byte_identical_via_the_console_script(project: Path, plan_dir: Path) -> None:
    out = project / "plan-toml"
    proc = subprocess.run(
        [_zephon_script(), "plan", "mix.toml", "-o", "plan-toml"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        f"planned 1000 documents from 3 datasets (7 shards) → plan-toml  config {_config_hash(out)[:12]}\n"
        + DATASET_LINES
    )
    for name in ("samples.parquet", "shards.parquet", "plan.json"):
        assert (out / name).read_bytes() == (plan_dir / name).read_bytes(), name


def test_plan_refuses_a_non_empty_output_without_overwrite(project: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    out.mkdir()
    (out / "keep.txt").write_text("x", encoding="utf-8")
    refused = _invoke("plan", str(project / "mix.yaml"), "-o", str(out))
    assert refused.exit_code == 1
    assert refused.stdout == ""
    assert refused.stderr == (
        f"zephon: error: plan output directory must be new or empty, got existing {out} — choose another path "
        "or pass overwrite=True (--overwrite)\n"
    )
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]

    # --overwrite replaces plan bundles only: the user's keep.txt is not ours to delete (#14).
    refused = _invoke("plan", str(project / "mix.yaml"), "-o", str(out), "--overwrite")
    assert refused.exit_code == 1
    assert "overwrite replaces only a plan bundle, got" in refused.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]

    (out / "keep.txt").unlink()
    assert _invoke("plan", str(project / "mix.yaml"), "-o", str(out)).exit_code == 0
    replaced = _invoke("plan", str(project / "mix.yaml"), "-o", str(out), "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "samples.parquet", "shards.parquet"]


def test_plan_with_a_missing_config_is_a_usage_error(tmp_path: Path) -> None:
    result = _invoke("plan", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "Error: Invalid value for 'CONFIG': File" in result.stderr
    assert "does not exist" in result.stderr
    assert not (tmp_path / "out").exists()


def test_plan_without_output_is_a_usage_error(project: Path) -> None:
    result = _invoke("plan", str(project / "mix.yaml"))
    assert result.exit_code == 2
    assert "Missing option '-o' / '--output'" in result.stderr


def test_plan_with_an_unknown_config_key_prints_one_line_and_exits_1(project: Path, tmp_path: Path) -> None:
    config = project / "typo.yaml"
    config.write_text(YAML_CONFIG.replace("shuffle:", "shufle:"), encoding="utf-8")
    result = _invoke("plan", str(config), "-o", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"zephon: error: {config}: top-level keys must be among seed, datasets, mixture, num_documents, epochs, "
        "on_exhaustion, shuffle, token_estimation, num_tokens, exact_tokens, tokenizer, packing, lanes, phases, mixture_unit, num_cost, "
        "pack_samples, got unknown "
        "`shufle` "
        "(did you mean `shuffle`?) — "
        "fix the spelling or remove it\n"
    )


def test_plan_errors_from_the_console_script_are_one_line_without_traceback(project: Path) -> None:
    config = project / "bad-seed.yaml"
    config.write_text(YAML_CONFIG.replace("seed: 7", "seed: '7'"), encoding="utf-8")
    proc = subprocess.run(
        [_zephon_script(), "plan", str(config), "-o", str(project / "never")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        f"zephon: error: {config}: `seed` must be an integer ≥ 0, got string '7' — write e.g. `seed: 42`\n"
    )


# ----------------------------------------------------------------------------------------------------
# zephon sql
# ----------------------------------------------------------------------------------------------------


def test_sql_table_of_datasets(plan_dir: Path) -> None:
    result = _invoke("sql", str(plan_dir), "SELECT name, planned_documents FROM datasets ORDER BY dataset_id")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "name   planned_documents\n"
        "-----  -----------------\n"
        "prose                500\n"
        "code                 300\n"
        "short                200\n"
    )


def test_sql_csv_counts_samples_per_dataset_via_a_join(plan_dir: Path) -> None:
    query = (
        "SELECT d.name, count(*) AS n, max(s.epoch) AS last_epoch "
        "FROM samples s JOIN datasets d USING (dataset_id) GROUP BY d.name ORDER BY d.name"
    )
    result = _invoke("sql", str(plan_dir), query, "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.stdout == "name,n,last_epoch\ncode,300,0\nprose,500,0\nshort,200,0\n"


def test_sql_json_is_an_array_with_one_object_per_line(plan_dir: Path) -> None:
    result = _invoke("sql", str(plan_dir), "SELECT name, rows, weight FROM datasets ORDER BY dataset_id", "-f", "json")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        '[{"name": "prose", "rows": 1200, "weight": 0.5},\n'
        ' {"name": "code", "rows": 600, "weight": 0.3},\n'
        ' {"name": "short", "rows": 2000, "weight": 0.2}]\n'
    )
    assert json.loads(result.stdout)[1] == {"name": "code", "rows": 600, "weight": 0.3}
    empty = _invoke("sql", str(plan_dir), "SELECT * FROM datasets WHERE false", "-f", "json")
    assert empty.stdout == "[]\n"


def test_sql_binds_params_by_name(plan_dir: Path) -> None:
    result = _invoke(
        "sql", str(plan_dir), "SELECT position FROM samples WHERE position < $n ORDER BY 1", "--param", "n=3"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "position\n--------\n       0\n       1\n       2\n"

    query = "SELECT planned_documents AS docs FROM datasets WHERE name = $name"
    assert _invoke("sql", str(plan_dir), query, "-p", "name=code", "-f", "csv").stdout == "docs\n300\n"
    injected = _invoke("sql", str(plan_dir), query, "-p", "name=code' OR '1'='1", "-f", "csv")
    assert (injected.exit_code, injected.stdout) == (0, "docs\n")

    typed = _invoke(
        "sql",
        str(plan_dir),
        "SELECT typeof($a) AS a, typeof($b) AS b, typeof($c) AS c",
        "-p",
        "a=3",
        "-p",
        "b=0.25",
        "-p",
        "c=x",
        "-f",
        "csv",
    )
    assert typed.stdout == "a,b,c\nINTEGER,DOUBLE,VARCHAR\n"


def test_sql_reads_the_query_from_stdin(plan_dir: Path) -> None:
    result = _invoke("sql", str(plan_dir), "-", "-f", "csv", input="SELECT count(*) AS n FROM shards\n")
    assert (result.exit_code, result.stdout) == (0, "n\n7\n")


def test_sql_stdin_via_the_console_script(plan_dir: Path) -> None:
    proc = subprocess.run(
        [_zephon_script(), "sql", str(plan_dir), "-", "--param", "n=2"],
        input="SELECT dataset, count(*) AS shards FROM shards WHERE rows > $n GROUP BY dataset ORDER BY dataset",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "dataset  shards\n-------  ------\ncode          2\nprose         4\nshort         1\n"


def test_sql_error_prints_one_line_and_exits_1(plan_dir: Path) -> None:
    result = _invoke("sql", str(plan_dir), "SELEC 1")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith('zephon: error: Parser Error: syntax error at or near "SELEC"')
    assert result.stderr.count("\n") == 1

    missing = _invoke("sql", str(plan_dir), "SELECT * FROM nope")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("zephon: error: Catalog Error: Table with name nope does not exist!")
    assert missing.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["SELECT 1", "--param", "n"], "must be NAME=VALUE with NAME a SQL identifier, got 'n'"),
        (["SELECT 1", "--param", "n=1", "--param", "n=2"], "each NAME must be given once, got 'n' twice"),
        (["  "], "Invalid value for 'QUERY': must be a SQL statement, got an empty query"),
        (["SELECT 1", "--format", "xml"], "Invalid value for '-f' / '--format'"),
    ],
)
def test_sql_usage_errors_exit_2(plan_dir: Path, args: list[str], message: str) -> None:
    result = _invoke("sql", str(plan_dir), *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_sql_on_a_directory_without_plan_json_exits_1(tmp_path: Path) -> None:
    result = _invoke("sql", str(tmp_path), "SELECT 1")
    assert result.exit_code == 1
    assert result.stderr == (
        f"zephon: error: plan directory must contain plan.json, got none at {tmp_path / 'plan.json'} — "
        "pass a directory written by `zephon plan` or work_source.plan(DIR)\n"
    )
    assert _invoke("sql", str(tmp_path / "nope"), "SELECT 1").exit_code == 2


def test_format_table_right_aligns_numbers_and_shows_null() -> None:
    text = format_table(["s", "n", "z"], [("a", 12, None), ("bbb", 3.5, None), ("x\ny", None, None)])
    assert text == "s        n  z\n----  ----  ----\na       12  NULL\nbbb    3.5  NULL\nx\\ny  NULL  NULL\n"


@pytest.mark.parametrize(
    ("text", "value"),
    [("3", 3), ("-2", -2), ("0.25", 0.25), ("1e3", 1000.0), ("abc", "abc"), ("nan", "nan"), ("inf", "inf"), ("", "")],
)
def test_param_values_are_int_then_float_then_string(text: str, value: object) -> None:
    parsed = param_value(text)
    assert (parsed, type(parsed)) == (value, type(value))


# ----------------------------------------------------------------------------------------------------
# zephon.inspection.sql library functions
# ----------------------------------------------------------------------------------------------------


def test_run_sql_returns_columns_and_rows_matching_the_parquet_files(plan_dir: Path) -> None:
    columns, rows = run_sql(
        plan_dir, "SELECT * FROM samples WHERE position BETWEEN $a AND $b ORDER BY 1", {"a": 10, "b": 14}
    )
    assert columns == ["position", "dataset_id", "shard_id", "row", "epoch", "tokens", "token_offset", "deal"]
    table = pq.read_table(plan_dir / "samples.parquet").slice(10, 5)
    assert rows == [tuple(r.values()) for r in table.to_pylist()]
    shard_rows = pq.read_table(plan_dir / "shards.parquet").to_pylist()
    assert run_sql(plan_dir, "SELECT * FROM shards ORDER BY shard_id").rows == [tuple(r.values()) for r in shard_rows]
    assert run_sql(plan_dir, "CREATE TEMP TABLE t AS SELECT 1 AS k").columns == ["Count"]


def test_connection_cannot_touch_the_file_system(plan_dir: Path, tmp_path: Path) -> None:
    con = connect(plan_dir)
    try:
        for statement in (
            f"COPY samples TO '{tmp_path / 'out.csv'}'",
            f"COPY samples TO '{plan_dir / 'samples.parquet'}' (FORMAT parquet)",
            f"SELECT * FROM read_parquet('{plan_dir / 'samples.parquet'}')",
            f"ATTACH '{tmp_path / 'db.duckdb'}'",
        ):
            with pytest.raises(duckdb.PermissionException):
                con.execute(statement)
        with pytest.raises(duckdb.Error, match="configuration has been locked"):
            con.execute("SET enable_external_access = true")
        assert con.execute("SELECT count(*) FROM samples").fetchone() == (1000,)
    finally:
        con.close()
    assert list(tmp_path.iterdir()) == []
    assert run_sql(plan_dir, "SELECT count(*) FROM samples").rows == [(1000,)]


def test_connect_refuses_a_bundle_without_its_samples_file(plan_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(plan_dir / "plan.json", broken / "plan.json")
    with pytest.raises(PlanFormatError, match=r"plan bundle file .*samples\.parquet must exist"):
        connect(broken)


# ----------------------------------------------------------------------------------------------------
# Help, version and docs
# ----------------------------------------------------------------------------------------------------


def test_every_command_has_help_and_is_documented() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    assert set(cli.commands) == {"plan", "count", "tokenize", "sql", "show", "audit", "diff", "cache", "engines"}
    check = cli.commands["engines"].commands["check"]  # type: ignore[attr-defined]
    assert _invoke("engines", "check", "--help").exit_code == 0 and check.help
    assert "zephon engines check" in docs
    for param in check.params:
        if isinstance(param, click.Option):
            assert all(f"`{flag}" in docs for flag in param.opts), ("check", param.opts)
    for sub in ("ls", "du", "prune"):
        sub_command = cli.commands["cache"].commands[sub]  # type: ignore[attr-defined]
        assert _invoke("cache", sub, "--help").exit_code == 0 and sub_command.help
        assert f"zephon cache {sub}" in docs
        for param in sub_command.params:
            if isinstance(param, click.Option):
                assert all(f"`{flag}" in docs for flag in param.opts), (sub, param.opts)
    for name, command in cli.commands.items():
        result = _invoke(name, "--help")
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith(f"Usage: zephon {name} ")
        assert command.help
        assert f"## `zephon {name}`" in docs, f"docs/cli.md must have a section for `zephon {name}`"
        for param in command.params:
            if isinstance(param, click.Option):
                for flag in param.opts:
                    assert f"`{flag}" in docs, f"docs/cli.md must mention {flag} of `zephon {name}`"
    top = _invoke("--help")
    assert top.exit_code == 0
    assert all(name in top.stdout for name in cli.commands)


def test_version() -> None:
    result = _invoke("--version")
    assert result.exit_code == 0
    assert re.fullmatch(r"zephon \d+\.\d+\.\d+\S*\n", result.stdout)


def test_console_script_version_matches_click_version() -> None:
    proc = subprocess.run([_zephon_script(), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (0, _invoke("--version").stdout)


def test_config_examples_in_the_docs_load(project: Path, tmp_path: Path) -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for kind in ("prose", "code"):
        (tmp_path / "data" / kind).mkdir(parents=True)
        for shard in sorted((project / "demo").glob(f"{kind}-*.parquet")):
            shutil.copy(shard, tmp_path / "data" / kind / shard.name)
    yaml_text = re.search(r"```yaml\n(.*?)```", docs, re.S).group(1)  # type: ignore[union-attr]
    toml_text = re.search(r"```toml\n(.*?)```", docs, re.S).group(1)  # type: ignore[union-attr]
    assert set(yaml.safe_load(yaml_text)) == {
        "seed",
        "datasets",
        "mixture",
        "num_documents",
        "on_exhaustion",
        "shuffle",
    }
    (tmp_path / "example.yaml").write_text(yaml_text, encoding="utf-8")
    (tmp_path / "example.toml").write_text(toml_text, encoding="utf-8")
    from_yaml = load_work_source(tmp_path / "example.yaml")
    assert from_yaml == load_work_source(tmp_path / "example.toml")
    assert [len(ds.files) for ds in from_yaml.datasets] == [4, 2]
    assert from_yaml.datasets[1].path == os.path.join(tmp_path, "data", "code")
