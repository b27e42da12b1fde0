"""`zephon engines check`: the report, its exit status and its one-line errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import write_parquet_dataset

from zephon.cli import cli


def need(*engines: str) -> None:
    for engine in engines:
        if importlib.util.find_spec(engine) is None:
            pytest.skip(f"{engine} is not installed")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["engines", "check", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_table_row_per_engine_and_exit_0_when_every_engine_agrees(tokenizer_dir: str, tmp_path: Path) -> None:
    need("fastokens", "gigatoken")
    data = write_parquet_dataset(tmp_path, "prose", [6, 4])
    code, out, err = run("--dataset", f"prose={data}", "--tokenizer", tokenizer_dir, "--engine", "fastokens",
                         "--engine", "gigatoken")  # fmt: skip
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("10 documents, ") and lines[0].endswith(
        f"compared with tokenizers (one thread each) for {tokenizer_dir}"
    )
    assert lines[1].split() == ["engine", "version", "status", "documents", "differing", "M", "tok/s", "tokenizers",
                                "M", "tok/s", "verdict"]  # fmt: skip
    assert [line.split()[0] for line in lines[3:]] == ["fastokens", "gigatoken"]
    assert all(line.split()[2:5] == ["agrees", "10", "0"] and line.endswith("approved") for line in lines[3:])


def test_json_and_a_config_file_with_its_tokenizer(tokenizer_dir: str, tmp_path: Path) -> None:
    need("fastokens")
    write_parquet_dataset(tmp_path, "prose", [5])
    config = tmp_path / "run.yaml"
    config.write_text(
        "seed: 1\ndatasets:\n  - {name: prose, path: prose}\nmixture: {prose: 1.0}\n"
        f"tokenizer: {{id: {tokenizer_dir}, field: text}}\n",
        encoding="utf-8",
    )
    code, out, _ = run(str(config), "--engine", "fastokens", "--format", "json", "--limit", "3")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True and data["documents"] == 3
    (fast,) = data["engines"]
    assert (fast["engine"], fast["status"], fast["documents"], fast["verdict"]) == (
        "fastokens",
        "agrees",
        3,
        "approved",
    )


def test_an_engine_that_differs_prints_its_first_document_and_exits_1(tokenizer_dir: str, tmp_path: Path) -> None:
    need("kitoken")
    (tmp_path / "web").mkdir()
    texts = ["plain words here", "print(\n'stdout')", "more words"]
    pq.write_table(pa.table({"body": texts}), tmp_path / "web" / "a.parquet")
    code, out, err = run("--dataset", f"web={tmp_path / 'web'}", "--tokenizer", tokenizer_dir, "--field", "body",
                         "--engine", "kitoken")  # fmt: skip
    assert code == 1
    assert err == "zephon: 1 engine differing from tokenizers or crashed: kitoken\n"
    assert out.splitlines()[3].split()[:5] == ["kitoken", "0.11.1", "differs", "3", "1"]
    assert out.splitlines()[3].endswith("refused")
    assert (
        f"kitoken: first difference: dataset 'web', shard {tmp_path / 'web' / 'a.parquet'}, row 1, token 6: "
        'tokenizers [83, 84, 68, 684, 2902], kitoken [329, 68, 684, 2902], text from there "stdout\')"\n'
    ) in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "web=/nope/web", "--tokenizer", "TOK"], "dataset 'web': path '/nope/web' must exist"),
        (["--dataset", "DATA", "--tokenizer", "/nope/tok"], "tokenizer_id must be an existing directory"),
        (["--dataset", "web"], "--dataset must be NAME=PATH, got 'web' — write e.g. --dataset web=data/web"),
        (["--tokenizer", "TOK"], "datasets must be given, got none — pass a CONFIG file or --dataset NAME=PATH"),
        (["/nope/run.yaml", "--tokenizer", "TOK"], "CONFIG file must exist, got nothing at '/nope/run.yaml'"),
        (["--dataset", "DATA"], "--tokenizer must name a tokenizer, got none"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(args: list[str], message: str, tokenizer_dir: str, tmp_path: Path) -> None:
    data = write_parquet_dataset(tmp_path, "prose", [2])
    args = [a.replace("TOK", tokenizer_dir).replace("DATA", f"prose={data}") for a in args]
    code, out, err = run(*args)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("zephon: error: ") and message in err


def test_the_console_script_prints_no_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "zephon"
    result = subprocess.run(
        [str(script), "engines", "check", "--dataset", "web=/nope/web", "--tokenizer", "gpt2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
