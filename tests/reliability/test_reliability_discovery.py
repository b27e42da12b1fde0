"""A plan never becomes data, and a dataset folder's links are followed once: shard discovery skips a plan bundle
written inside a dataset's folder and a link that loops, naming each (docs/storage.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon import Pipeline
from zephon.cli import cli
from zephon.errors import DatasetError, ZephonWarning
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def _config(tmp_path: Path, data: Path) -> Path:
    file = tmp_path / "plan.yaml"
    file.write_text(f"seed: 3\ndatasets:\n  - name: web\n    path: {data}\nmixture: {{web: 1.0}}\n", encoding="utf-8")
    return file


def _shard_uris(plan: Path) -> list[str]:
    return pq.read_table(plan / "shards.parquet", columns=["uri"]).column("uri").to_pylist()


def test_a_plan_written_inside_its_dataset_folder_is_not_read_back_as_shards(make_parquet, tmp_path) -> None:
    data = make_parquet("web", [5, 7])
    config = _config(tmp_path, data)
    first, second = data / "plans" / "p1", data / "plans" / "p2"
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(first)])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(second)])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"zephon: warning: dataset 'web': skipped the plan bundle {first} (a Zephon plan, not data) — move plans out "
        "of dataset folders\n"
    )
    expected = [str(data / "part-00000.parquet"), str(data / "part-00001.parquet")]
    assert _shard_uris(first) == _shard_uris(second) == expected
    assert (first / "plan.json").read_bytes() == (second / "plan.json").read_bytes()  # the same plan


def test_a_pipeline_over_a_folder_holding_a_plan_bundle_plans_only_the_real_shards(
    make_parquet, tmp_path, tokenizer_dir
) -> None:
    data = make_parquet("web", [6])
    result = CliRunner().invoke(cli, ["plan", str(_config(tmp_path, data)), "-o", str(data / "old-plan")])
    assert result.exit_code == 0, result.output
    with pytest.warns(ZephonWarning, match=r"skipped the plan bundle .*old-plan \(a Zephon plan, not data\)"):
        web = Dataset.from_path("web", str(data))
    source = StaticMixtureWorkSource(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=0)
    pipe = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=16)
    assert _shard_uris(pipe.plan_dir) == [str(data / "part-00000.parquet")]
    with pytest.warns(ZephonWarning, match="skipped the plan bundle"):
        globbed = Dataset.from_path("web", str(data / "**" / "*.parquet"))
    assert [f.uri for f in globbed.files] == [str(data / "part-00000.parquet")]
    with pytest.raises(DatasetError, match=r"must be a folder of shards, got a Zephon plan bundle — point the path"):
        Dataset.from_path("web", str(data / "old-plan"))


def test_a_folder_of_links_to_shard_folders_is_a_dataset(make_parquet, tmp_path) -> None:
    real = make_parquet("web", [3, 4])
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "web").symlink_to(real, target_is_directory=True)
    dataset = Dataset.from_path("web", str(linked))
    assert [f.uri for f in dataset.files] == [
        str(linked / "web" / "part-00000.parquet"),
        str(linked / "web" / "part-00001.parquet"),
    ]


def test_a_link_to_an_ancestor_is_skipped_with_a_warning_and_does_not_loop(make_parquet, tmp_path) -> None:
    data = make_parquet("web", [3])
    (data / "loop").symlink_to(data, target_is_directory=True)
    (data / "up").symlink_to(tmp_path, target_is_directory=True)
    with pytest.warns(ZephonWarning) as caught:
        dataset = Dataset.from_path("web", str(data))
    assert [f.uri for f in dataset.files] == [str(data / "part-00000.parquet")]
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        f"dataset 'web': skipped the linked directory {data / 'loop'} → {data}: it loops to or repeats {data}, "
        "already listed — remove the link or point it elsewhere",
        f"dataset 'web': skipped the linked directory {data / 'up'} → {tmp_path}: it loops to or repeats {data}, "
        "already listed — remove the link or point it elsewhere",
    ]


def test_a_folder_holding_only_a_looping_link_says_so_instead_of_empty(tmp_path) -> None:
    folder = tmp_path / "web"
    folder.mkdir()
    os.symlink(folder, folder / "self", target_is_directory=True)
    with (
        pytest.warns(ZephonWarning),
        pytest.raises(
            DatasetError,
            match=r"must contain shard files, got no shard files, only what was skipped \(/.*/web/self\) — put",
        ),
    ):
        Dataset.from_path("web", str(folder))


def test_a_plan_bundle_under_an_object_store_prefix_is_skipped_and_named(make_parquet, tmp_path, s3) -> None:
    data = make_parquet("web", [5])
    result = CliRunner().invoke(cli, ["plan", str(_config(tmp_path, data)), "-o", str(data / "plans" / "p1")])
    assert result.exit_code == 0, result.output
    s3.upload_dir(data, "web/")
    with pytest.warns(ZephonWarning) as caught:
        dataset = Dataset.from_path("web", s3.url("web/"))
    assert [f.uri for f in dataset.files] == [s3.url("web/part-00000.parquet")]
    assert [str(w.message) for w in caught] == [
        f"dataset 'web': skipped the plan bundle {s3.url('web/plans/p1/')} (a Zephon plan, not data) — move plans "
        "out of dataset prefixes"
    ]
