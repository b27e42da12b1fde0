"""s3:// datasets in CONFIG files and the CLI: exact plans counted from the bucket by worker processes and by
Ray tasks give the plan the local copy gives; bad object-store input is one line and exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from zephon.cli import cli
from zephon.demo import write_demo_dataset


def exact_config(path: Path, datasets: dict[str, str], tokenizer_dir: str) -> Path:
    lines = "".join(f'  - {{name: {name}, path: "{where}"}}\n' for name, where in datasets.items())
    path.write_text(
        "seed: 3\n"
        f"datasets:\n{lines}"
        "mixture: {code: 0.6, short: 0.4}\n"
        "token_estimation: {primer: measure}\n"
        "exact_tokens: true\n"
        f"tokenizer: {{id: {tokenizer_dir}, field: text}}\n"
        "packing: {max_length: 257, algorithm: best_fit, oversize: drop}\n"
    )
    return path


@pytest.fixture
def demo(s3, tmp_path) -> Path:
    root = tmp_path / "data"
    write_demo_dataset(root)
    s3.upload_dir(root / "demo", "demo/")
    return root / "demo"


def test_an_exact_plan_from_config_over_s3_equals_the_local_one(s3, demo, tmp_path, tokenizer_dir) -> None:
    local = exact_config(
        tmp_path / "local.yaml", {"code": f"{demo}/code-*.parquet", "short": f"{demo}/short-*.parquet"}, tokenizer_dir
    )
    remote = exact_config(
        tmp_path / "s3.yaml",
        {"code": s3.url("demo/code-*.parquet"), "short": s3.url("demo/short-*.parquet")},
        tokenizer_dir,
    )
    runner = CliRunner()
    a = runner.invoke(cli, ["plan", str(local), "-o", str(tmp_path / "a"), "--workers", "2"])
    b = runner.invoke(cli, ["plan", str(remote), "-o", str(tmp_path / "b"), "--workers", "2"])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    for name in ("samples.parquet", "bins.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    manifest = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert manifest["datasets"][0]["path"] == s3.url("demo/code-*.parquet")


def test_the_count_pass_on_ray_reads_the_bucket(ray_cluster, s3, demo, tmp_path, tokenizer_dir, monkeypatch) -> None:
    """The cluster's nodes have no AWS variables: the driver's settings travel with the tasks."""
    remote = exact_config(
        tmp_path / "s3.yaml",
        {"code": s3.url("demo/code-*.parquet"), "short": s3.url("demo/short-*.parquet")},
        tokenizer_dir,
    )
    runner = CliRunner()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "ray-cache"))
    ray_run = runner.invoke(cli, ["count", str(remote), "--engine", "ray", "--workers", "2", "--no-progress"])
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "local-cache"))
    local_run = runner.invoke(cli, ["count", str(remote), "--workers", "2", "--no-progress"])
    assert ray_run.exit_code == 0, ray_run.output
    assert ray_run.output == local_run.output and ray_run.output.startswith("counted 3 shards (0 cached)")
    ray_arrays = sorted(p.name for p in (tmp_path / "ray-cache" / "token-counts").glob("*.npy"))
    local_arrays = sorted(p.name for p in (tmp_path / "local-cache" / "token-counts").glob("*.npy"))
    assert ray_arrays == local_arrays and len(ray_arrays) == 3


def test_a_missing_bucket_in_config_is_one_line_and_exit_1(s3, tmp_path, tokenizer_dir) -> None:
    cfg = exact_config(
        tmp_path / "c.yaml", {"code": "s3://no-such-bucket/code/", "short": s3.url("short/")}, tokenizer_dir
    )
    result = CliRunner().invoke(cli, ["plan", str(cfg), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "bucket s3://no-such-bucket must exist, got HTTP 404 NoSuchBucket" in result.output
    assert not (tmp_path / "out").exists()
