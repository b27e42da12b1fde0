"""`zephon count` and CONFIG files for token mixtures and exact plans."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from zephon.cli import cli
from zephon.config_file import load_plan_config
from zephon.demo import write_demo_dataset


@pytest.fixture
def config(tmp_path, tokenizer_dir) -> Path:
    write_demo_dataset(tmp_path / "data")
    cfg = tmp_path / "exact.yaml"
    cfg.write_text(
        "seed: 3\n"
        "datasets:\n"
        "  - {name: code, path: data/demo/code-*.parquet}\n"
        "  - {name: short, path: data/demo/short-*.parquet}\n"
        "mixture: {code: 0.6, short: 0.4}\n"
        "token_estimation: {primer: measure}\n"
        "exact_tokens: true\n"
        f"tokenizer: {{id: {tokenizer_dir}, field: text}}\n"
        "packing: {max_length: 257, algorithm: best_fit, oversize: drop}\n"
    )
    return cfg


def independent_counts(tmp_path: Path, tokenizer_dir: str) -> dict[str, int]:
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    out = {}
    for kind in ("code", "short"):
        texts = [
            t
            for f in sorted((tmp_path / "data" / "demo").glob(f"{kind}-*.parquet"))
            for t in pq.read_table(f).column("text").to_pylist()
        ]
        out[kind] = sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))
    return out


def test_count_counts_exactly_then_reuses_the_cache(config, tmp_path, tokenizer_dir) -> None:
    runner = CliRunner()
    first = runner.invoke(cli, ["count", str(config), "--workers", "2", "--no-progress"])
    assert first.exit_code == 0, first.output
    c = independent_counts(tmp_path, tokenizer_dir)
    assert first.output == (
        f"counted 3 shards (0 cached): {c['code'] + c['short']} tokens\n"
        f"  code   documents 600  tokens {c['code']}\n"
        f"  short  documents 2000  tokens {c['short']}\n"
    )
    again = runner.invoke(cli, ["count", str(config)])
    assert again.output.splitlines()[0] == f"counted 0 shards (3 cached): {c['code'] + c['short']} tokens"


def test_count_under_max_tokens_says_how_many_documents_reach_the_limit(config, tmp_path, tokenizer_dir) -> None:
    """The counts are after the cut: the documents at the limit were cut (or are exactly that long) — said, so the
    tokens are not taken for the corpus's."""
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    cut = tmp_path / "cut.yaml"
    cut.write_text(config.read_text().replace("field: text}", "field: text, max_tokens: 64}"))
    result = CliRunner().invoke(cli, ["count", str(cut), "--no-progress"])
    assert result.exit_code == 0, result.output
    for kind, line in zip(("code", "short"), result.output.splitlines()[1:], strict=True):
        texts = [t for f in sorted((tmp_path / "data" / "demo").glob(f"{kind}-*.parquet"))
                 for t in pq.read_table(f).column("text").to_pylist()]  # fmt: skip
        sizes = [min(len(e.ids) + 1, 64) for e in tok.encode_batch(texts, add_special_tokens=False)]
        assert line.endswith(f"tokens {sum(sizes)}  at max_tokens {sizes.count(64)}"), line
    plain = CliRunner().invoke(cli, ["count", str(config), "--no-progress"])
    assert "at max_tokens" not in plain.output


def test_count_without_a_tokenizer_is_one_line_exit_1(tmp_path) -> None:
    write_demo_dataset(tmp_path / "data")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 1\ndatasets: [{name: a, path: data/demo/short-*.parquet}]\nmixture: {a: 1}\n")
    result = CliRunner().invoke(cli, ["count", str(cfg)])
    assert result.exit_code == 1
    assert result.output.startswith("zephon: error: ") and "`tokenizer` must be set" in result.output
    assert result.output.count("\n") == 1


def test_plan_from_config_writes_an_exact_best_fit_plan(config, tmp_path) -> None:
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    m = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert m["kind"] == "exact" and m["packing"]["algorithm"] == "best_fit" and m["packing"]["oversize"] == "drop"
    assert m["mixture"]["unit"] == "tokens"
    lines = result.output.splitlines()
    assert lines[1].startswith("  code   weight 0.600") and "(exact, share 0.6" in lines[1]
    sql = CliRunner().invoke(cli, ["sql", str(tmp_path / "plan"), "SELECT count(DISTINCT sequence) AS n FROM bins"])
    assert sql.output.splitlines()[2].strip() == str(m["packing"]["sequences"])


def test_config_packing_and_tokenizer_sections_are_validated(config, tmp_path) -> None:
    loaded = load_plan_config(config)
    assert loaded.pack is not None and loaded.pack.max_length == 257 and loaded.tokenize is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text(config.read_text().replace("oversize: drop", "oversize: chop"))
    with pytest.raises(Exception, match='bad.yaml: `packing.oversize` must be "split" or "drop", got string \'chop\''):
        load_plan_config(bad)


def test_count_on_ray_caches_arrays_identical_to_the_local_pool(ray_cluster, config, tmp_path, monkeypatch) -> None:
    import numpy as np

    runner = CliRunner()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "ray-cache"))
    ray_run = runner.invoke(cli, ["count", str(config), "--engine", "ray", "--workers", "2", "--no-progress"])
    assert ray_run.exit_code == 0, ray_run.output
    ray_arrays = {p.name: np.load(p) for p in (tmp_path / "ray-cache" / "token-counts").glob("*.npy")}
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "local-cache"))
    local_run = runner.invoke(cli, ["count", str(config), "--workers", "2", "--no-progress"])
    local_arrays = {p.name: np.load(p) for p in (tmp_path / "local-cache" / "token-counts").glob("*.npy")}
    assert ray_run.output == local_run.output and ray_run.output.startswith("counted 3 shards (0 cached)")
    assert sorted(ray_arrays) == sorted(local_arrays) and len(ray_arrays) == 3
    assert all(
        np.array_equal(ray_arrays[k], local_arrays[k]) and ray_arrays[k].dtype == local_arrays[k].dtype
        for k in ray_arrays
    )
