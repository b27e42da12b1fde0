"""`zephon tokenize`: CONFIG and path inputs, the printed summary, one-line errors with exit status 1."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon.cli import cli
from zephon.cli.output import CommandError
from zephon.cli.tokenize_command import _name_of
from zephon.demo import write_demo_dataset
from zephon.executor.token_stores import open_token_store


@pytest.fixture
def project(tmp_path, tokenizer_dir, monkeypatch) -> Path:
    write_demo_dataset(tmp_path)
    (tmp_path / "c.yaml").write_text(
        "seed: 1\n"
        "datasets:\n"
        "  - {name: code, path: demo/code-*.parquet}\n"
        "mixture: {code: 1}\n"
        f"tokenizer: {{id: {tokenizer_dir}, special_tokens: none}}\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args: str):
    return CliRunner().invoke(cli, ["tokenize", *args, "--no-progress"])


def test_paths_and_names_give_one_folder_per_dataset(project, tokenizer_dir) -> None:
    result = run("demo/short-*.parquet", "code=demo/code-00001.parquet", "--tokenizer", tokenizer_dir, "-o", "out")
    assert result.exit_code == 0, result.output
    assert result.output == (
        "tokenized 2 shards (0 kept) → out: 2300 documents, 107337 tokens, uint16\n"
        "  short  stores 1  documents 2000  tokens 30731  → out/short\n"
        "  code   stores 1  documents 300  tokens 76606  → out/code\n"
    )
    assert open_token_store("out/code").num_tokens == 76606 == 162524 - 85918  # zephon count: code, code-00000
    again = run("demo/short-*.parquet", "code=demo/code-00001.parquet", "--tokenizer", tokenizer_dir, "-o", "out")
    assert again.output.splitlines()[0] == "tokenized 0 shards (2 kept) → out: 2300 documents, 107337 tokens, uint16"


def test_a_config_s_datasets_and_tokenizer_section_apply(project, tokenizer_dir) -> None:
    result = run("c.yaml", "-o", "out", "--workers", "2")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "tokenized 2 shards (0 kept) → out: 600 documents, 161924 tokens, uint16"
    # special_tokens: none — the count pass's 162524 tokens less the 600 EOS
    assert open_token_store("out/code").read(0, 1).to_lists()[0][-1] != 0


def test_documents_cut_by_max_tokens_are_counted_on_the_dataset_s_line(project, tokenizer_dir) -> None:
    (project / "cut.yaml").write_text(
        (project / "c.yaml").read_text().replace("special_tokens: none}", "special_tokens: none, max_tokens: 64}")
    )
    result = run("cut.yaml", "-o", "out", "--workers", "1")
    assert result.exit_code == 0, result.output
    line = result.output.splitlines()[1]
    store = open_token_store("out/code")
    counts = store.token_counts()
    cut = int(line.split("(")[1].split(" tokens cut")[0])
    assert line.startswith(f"  code  stores 2  documents 600  tokens {int(counts.sum())}  truncated ")
    assert run("c.yaml", "-o", "whole", "--workers", "1").exit_code == 0
    whole = open_token_store("whole/code").token_counts()
    assert f"truncated {int((whole > 64).sum())} ({int((whole - 64).clip(0).sum())} tokens cut by max_tokens)" in line
    assert int(counts.sum()) + cut == int(whole.sum()) == 161924


def test_the_text_field_is_an_option(project, tokenizer_dir) -> None:
    pq.write_table(pa.table({"body": ["one two", "three"]}), project / "notes.parquet")
    missing = run("notes.parquet", "--tokenizer", tokenizer_dir, "-o", "out")
    assert missing.exit_code == 1 and missing.output.count("\n") == 1 and "'text'" in missing.output
    result = run("notes.parquet", "--tokenizer", tokenizer_dir, "--field", "body", "-o", "out")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].startswith("  notes  stores 1  documents 2  tokens ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo/short-00000.parquet", "-o", "out"], "--tokenizer must name a tokenizer, got none"),
        (["demo/nope-*.parquet", "--tokenizer", "x", "-o", "out"], "dataset 'nope'"),
        (
            ["demo/short-*.parquet", "short=demo/short-00000.parquet", "--tokenizer", "TOK", "-o", "out"],
            "dataset names must be distinct (each gets OUT_DIR/NAME), got 'short' twice",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_status_1(project, tokenizer_dir, args, message) -> None:
    args = [tokenizer_dir if a == "TOK" else a for a in args]
    result = run(*args)
    assert result.exit_code == 1
    assert result.output.startswith("zephon: error: ") and message in result.output, result.output
    assert result.output.count("\n") == 1
    assert not (project / "out").exists()


def test_a_bad_document_fails_in_one_line_and_a_rerun_after_the_fix_writes_the_rest(project, tokenizer_dir) -> None:
    data = project / "data"
    data.mkdir()
    pq.write_table(pa.table({"text": ["a", "b"]}), data / "part-0.parquet")
    pq.write_table(pa.table({"text": ["c", None]}), data / "part-1.parquet")
    failed = run("data", "--tokenizer", tokenizer_dir, "-o", "out", "--workers", "1")
    assert failed.exit_code == 1 and failed.output.count("\n") == 1
    assert "part-1.parquet row 1" in failed.output
    assert sorted(p.name for p in (project / "out" / "data").iterdir()) == [
        "part-0.bin",
        "part-0.idx",
        "part-0.zephon.json",
    ]
    pq.write_table(pa.table({"text": ["c", "d"]}), data / "part-1.parquet")
    fixed = run("data", "--tokenizer", tokenizer_dir, "-o", "out")
    assert fixed.exit_code == 0 and fixed.output.startswith("tokenized 1 shard (1 kept) → out: 4 documents")


def test_a_dataset_is_named_after_its_path() -> None:
    assert [
        _name_of(p)
        for p in (
            "data/web",
            "data/web/",
            "demo/prose-*.parquet",
            "demo/*.parquet",
            "x/short-00000.jsonl.zst",
            "hf://datasets/org/fineweb@main",
            "s3://bucket/corpus/",
        )
    ] == ["web", "web", "prose", "demo", "short-00000", "fineweb", "corpus"]
    with pytest.raises(CommandError, match=r"must give a dataset name, got '' — pass NAME=\*\.parquet"):
        _name_of("*.parquet")
