"""The heavy planning steps on a two-node Ray cluster (``ray_cluster``) give the local path's bytes.

Footer scans (local disk and S3 by range GETs), a partitioned sidecar join's partitions, the count pass, the
computed cost pass and a whole plan with ``engine="ray"`` are compared with the same steps run locally, byte for
byte; a worker killed mid-step (``ZEPHON_RAY_FAILPOINT``) has its task retried and changes nothing; a path a node cannot see is
refused in one line naming the node.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl_dataset, write_parquet_dataset
from test_computed_costs import COSTS, costs_of, functions, wds  # noqa: F401  (fixtures: cost functions, tars)
from test_computed_costs import source as costs_source

from zephon.errors import ConfigError, DatasetError
from zephon.io import Dataset
from zephon.plan.records import ShardRef
from zephon.planner.build import PlanOptions, write_plan
from zephon.planner.counts.lengths import token_counts
from zephon.planner.prepare import shard_refs
from zephon.planner.ray_scan import scan_on_ray
from zephon.planner.selection.evaluate import select_rows
from zephon.records import computed_cost
from zephon.specs import PackSpec, TokenizeSpec
from zephon.storage.local import SourceFile
from zephon.storage.scan import scan_shard
from zephon.work import MixtureSpec, StaticMixtureWorkSource

pytest.importorskip("ray")

ROWS = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/: 6 Parquet shards of ``ROWS`` rows (int64 id, text, score 0-5); side/: a sidecar of quality and a
    cluster for most ids plus ids no document has; code/: 3 JSONL shards."""
    root = tmp_path_factory.mktemp("ray-corpus")
    (root / "web").mkdir()
    rng = np.random.default_rng(5)
    for s in range(6):
        ids = pa.array([s * ROWS + r for r in range(ROWS)], type=pa.int64())
        text = [f"web {s}-{r} " + "word " * (1 + (r * 7) % 11) for r in range(ROWS)]
        table = pa.table({"id": ids, "text": text, "score": rng.integers(0, 6, ROWS).astype(np.int8)})
        pq.write_table(table, root / "web" / f"{s:02d}.parquet", row_group_size=16)
    keys = [k for k in rng.permutation(6 * ROWS).tolist() if k % 7 != 3] + [90_000, 90_001]
    side = pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "quality": rng.random(len(keys)),
            "cluster": [f"c{k // 4}" for k in keys],
        }
    )
    (root / "side").mkdir()
    pq.write_table(side, root / "side" / "scores.parquet")
    write_jsonl_dataset(root, "code", [25, 31, 19])
    return root


def _source(corpus: Path, **selection) -> StaticMixtureWorkSource:
    web = Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="id", **selection)
    code = Dataset.from_path("code", corpus / "code")
    return StaticMixtureWorkSource(
        datasets=[web, code], mixture=MixtureSpec({"web": 0.6, "code": 0.4}), seed=9, epochs=2, exact_tokens=True
    )


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_plan_on_ray_is_the_local_plan_byte_for_byte_even_when_a_worker_dies(
    ray_cluster, corpus, tokenizer_dir, tmp_path, monkeypatch
) -> None:
    """Scan, a join in 3 partitions and the count pass as Ray tasks; the first task's worker is killed."""
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "3")
    source = _source(corpus, where="quality > 0.2 AND score >= 1", dedup_on="cluster")
    tokenize, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=65)
    local = write_plan(source, tmp_path / "local", PlanOptions(tokenize=tokenize, pack=pack, workers=1))
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "ray-cache"))  # counted again, on the cluster
    ray_cluster.failpoint.touch()
    on_ray = write_plan(source, tmp_path / "ray", PlanOptions(tokenize=tokenize, pack=pack, engine="ray"))
    assert not ray_cluster.failpoint.exists()  # a task's worker was killed, and its task run again
    assert _tree(on_ray) == _tree(local) and len(_tree(local)) == 3
    counted = sorted(p.name for p in (tmp_path / "ray-cache" / "token-counts").iterdir())
    assert len(counted) == 9 and ray_cluster.nodes == 2


def test_the_count_pass_on_ray_saves_the_local_arrays_even_when_a_worker_dies(
    ray_cluster, corpus, tokenizer_dir, tmp_path, monkeypatch
) -> None:
    from zephon.executor.encode.encoders import make_encoder

    refs = [r for group in shard_refs(_source(corpus)) for r in group]
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    arrays = {}
    for engine in ("local", "ray"):
        monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / engine))
        if engine == "ray":
            ray_cluster.failpoint.touch()
        _, report = token_counts(refs, spec, make_encoder(spec), workers=1, engine=engine)
        assert report.counted == 9
        arrays[engine] = {p.name: p.read_bytes() for p in sorted((tmp_path / engine / "token-counts").iterdir())}
    assert not ray_cluster.failpoint.exists()
    assert arrays["ray"] == arrays["local"] and len(arrays["local"]) == 9


def test_every_join_partition_on_ray_selects_what_the_local_join_selects(ray_cluster, corpus) -> None:
    ds = _source(corpus, where="quality > 0.5", order_by="quality DESC", order_window=4).datasets[0]
    assert ds.selection is not None
    refs = shard_refs(StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=9))[0]
    local = select_rows(ds.selection, refs, seed=9, dataset_index=0, partitions=1)
    ray_cluster.failpoint.touch()
    on_ray = select_rows(ds.selection, refs, seed=9, dataset_index=0, partitions=5, engine="ray")
    assert not ray_cluster.failpoint.exists()
    assert on_ray.shard.tobytes() == local.shard.tobytes() and on_ray.row.tobytes() == local.row.tobytes()
    assert on_ray.report == local.report and local.report.metadata_without_document == 2


def test_a_duplicate_sidecar_key_is_one_line_with_its_count_on_ray_too(ray_cluster, corpus, tmp_path) -> None:
    side = pq.read_table(corpus / "side" / "scores.parquet")
    pq.write_table(pa.concat_tables([side, side.slice(10, 1), side.slice(10, 1)]), tmp_path / "dup.parquet")
    key = side.column("id")[10].as_py()
    ds = Dataset.from_path("web", corpus / "web", metadata=tmp_path / "dup.parquet", key="id", where="quality > 0")
    assert ds.selection is not None
    refs = shard_refs(StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"web": 1.0}), seed=9))[0]
    with pytest.raises(
        DatasetError,
        match=rf"^dataset .web.: sidecar key .id. must be unique, got 3 rows for {key} \(1 key on more than one row, 3 rows in all\) in ",
    ):
        select_rows(ds.selection, refs, seed=9, dataset_index=0, partitions=4, engine="ray")


def test_footer_scans_on_ray_are_the_local_scans_in_batches(ray_cluster, tmp_path) -> None:
    web = write_parquet_dataset(tmp_path, "web", [5, 9, 3, 7, 11, 2, 4], row_group_size=3)
    code = write_jsonl_dataset(tmp_path, "code", [6, 8, 1], compression="zst")
    datasets = [Dataset.from_path("web", web), Dataset.from_path("code", code)]
    expected = [[scan_shard(ds.name, f) for f in ds.files] for ds in datasets]
    got = scan_on_ray([(ds.name, ds.files) for ds in datasets], batch=2)  # 4 + 2 tasks
    assert got == expected and [len(g) for g in got] == [7, 3]


def test_object_store_footers_are_scanned_by_the_tasks_with_the_drivers_settings(ray_cluster, s3, tmp_path) -> None:
    web = write_parquet_dataset(tmp_path, "web", [5, 9, 3, 7, 11], row_group_size=4)
    s3.upload_dir(web, "web/")
    ds = Dataset.from_path("web", s3.url("web/"))
    on_ray = scan_on_ray([(ds.name, ds.files)], batch=2)[0]  # the nodes have no AWS variables of their own
    local = [scan_shard(ds.name, f) for f in ds.files]
    assert on_ray == local and [i.rows for i in local] == [5, 9, 3, 7, 11]
    assert all(i.fingerprint.startswith("etag:") for i in on_ray)


def test_a_path_a_node_cannot_see_is_refused_naming_the_node(ray_cluster, tmp_path, tokenizer_dir) -> None:
    gone = str(tmp_path / "only-on-the-driver.parquet")
    with pytest.raises(DatasetError, match=r"^dataset 'web': shard .*only-on-the-driver\.parquet must be visible "
                       r"to every Ray node at the same path, got missing on node .* — put the datasets on storage"):  # fmt: skip
        scan_on_ray([("web", [SourceFile(uri=gone, format="parquet", size=10)])])
    ref = ShardRef(uri=gone, format="parquet", rows=3, bytes=10, row_groups=1, fingerprint="x", shard_id=0,
                   dataset_id=0, dataset="web")  # fmt: skip
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    from zephon.executor.encode.encoders import make_encoder

    with pytest.raises(DatasetError, match=r"must be visible to every Ray node at the same path"):
        token_counts([ref], spec, make_encoder(spec), engine="ray")


def test_one_engine_option_for_every_step() -> None:
    with pytest.raises(ConfigError, match=r'^engine must be "local" or "ray", got \'spark\' — pick one$'):
        PlanOptions(engine="spark")


def test_zephon_plan_engine_ray_prints_and_writes_what_the_local_engine_does(
    ray_cluster, corpus, tmp_path, monkeypatch
) -> None:
    from click.testing import CliRunner

    from zephon.cli import cli

    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "2")
    config = tmp_path / "plan.yaml"
    config.write_text(
        f"seed: 4\ndatasets:\n  - {{name: web, path: {corpus / 'web'}, metadata: {corpus / 'side'}, key: id, "
        f'where: "quality > 0.4"}}\n  - {{name: code, path: {corpus / "code"}}}\nmixture: {{web: 2, code: 1}}\n'
    )
    runs = {}
    for engine in ("local", "ray"):
        result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / engine), "--engine", engine])
        assert result.exit_code == 0, result.output
        runs[engine] = result.output.replace(str(tmp_path / engine), "PLAN")
    assert runs["ray"] == runs["local"] and _tree(tmp_path / "ray") == _tree(tmp_path / "local")


def test_a_hub_dataset_plans_on_ray_as_here_with_the_drivers_endpoint(
    ray_cluster, corpus, hub_server, tokenizer_dir, tmp_path, monkeypatch
) -> None:
    """The nodes were started before ``HF_ENDPOINT`` pointed at the test's Hub: the tasks read the Hub the driver
    reads (its endpoint and token travel with them, as a bucket's settings do)."""
    shards = {f"data/train-{p.stem}.parquet": p.read_bytes() for p in sorted((corpus / "web").iterdir())}
    hub_server.add_dataset("org/web", shards, lfs=list(shards))
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", "hf://org/web/train")], mixture=MixtureSpec({"web": 1.0}), seed=3,
        exact_tokens=True,
    )  # fmt: skip
    tokenize, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=65)
    local = write_plan(source, tmp_path / "local", PlanOptions(tokenize=tokenize, pack=pack, workers=1))
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "ray-cache"))  # scanned and counted again, on the cluster
    on_ray = write_plan(source, tmp_path / "ray", PlanOptions(tokenize=tokenize, pack=pack, engine="ray"))
    assert _tree(on_ray) == _tree(local)
    assert len(list((tmp_path / "ray-cache" / "token-counts").iterdir())) == 6


def test_computed_costs_on_ray_give_the_local_plan_and_cache(
    ray_cluster,
    functions,  # noqa: F811  (the fixture imported above)
    wds,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The computed cost pass as Ray tasks (one per tar shard, the function imported on the nodes by path)."""
    fn = computed_cost(f"{functions}:patches")
    local = costs_source(wds, fn).plan(tmp_path / "local", workers=1)
    local_cache = sorted((Path(os.environ["ZEPHON_CACHE_DIR"]) / "computed-costs").iterdir())
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "ray-cache"))
    on_ray = write_plan(costs_source(wds, fn), tmp_path / "ray", PlanOptions(engine="ray"))
    assert _tree(on_ray) == _tree(local) and costs_of(on_ray) == COSTS
    ray_cache = sorted((tmp_path / "ray-cache" / "computed-costs").iterdir())
    assert [p.name for p in ray_cache] == [p.name for p in local_cache] and len(ray_cache) == 3
    assert [p.read_bytes() for p in ray_cache] == [p.read_bytes() for p in local_cache]


def _kill_in_every_step(monkeypatch, failpoint: Path) -> list[str]:
    """Make every Ray step of the planner lose the worker of its first task: the failpoint file is created as each
    step submits its tasks (``run_tasks``); the steps that ran are listed, by module."""
    import zephon.planner.counts.ray_costs as costs
    import zephon.planner.counts.ray_pass as counts
    import zephon.planner.ray_scan as scan
    import zephon.planner.selection.ray_join as join

    steps: list[str] = []
    for module in (scan, join, counts, costs):
        real, name = module.run_tasks, module.__name__.rsplit(".", 1)[1]

        def submit(*args, _real=real, _name=name, **kwargs):
            steps.append(_name)
            failpoint.touch()
            out = _real(*args, **kwargs)
            assert not failpoint.exists()  # a worker of this step was killed, and its task run again
            return out

        monkeypatch.setattr(module, "run_tasks", submit)
    return steps


KINDS = {  # plan kind: (work source options, plan options, the Ray steps it runs)
    "samples": ({"num_documents": 500}, {}, ["ray_scan", "ray_join"]),
    "tokens": ({"num_tokens": 6000, "token_estimation": True}, {}, ["ray_scan", "ray_join"]),
    "exact": (
        {"num_tokens": 6000, "token_estimation": True, "exact_tokens": True},
        {"pack": 65},
        ["ray_scan", "ray_join", "ray_pass"],
    ),
}


def _kind_source(corpus: Path, options: dict) -> StaticMixtureWorkSource:
    from zephon.work import TokenEstimation

    options = dict(options)
    if options.pop("token_estimation", False):
        options["token_estimation"] = TokenEstimation(calibration_samples=32, calibration_shards_max=2)
    web = Dataset.from_path("web", corpus / "web", metadata=corpus / "side", key="id", where="quality > 0.3")
    code = Dataset.from_path("code", corpus / "code")
    return StaticMixtureWorkSource(
        datasets=[web, code], mixture=MixtureSpec({"web": 0.6, "code": 0.4}), seed=9, **options
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_plan_kind_on_ray_is_the_local_plan_when_each_step_loses_a_worker(
    ray_cluster, corpus, tokenizer_dir, tmp_path, monkeypatch, kind
) -> None:
    """Samples, token and exact plans with a sidecar selection: the scan, the join's partitions and the count pass
    each lose a worker mid-step on the two-node cluster; the bundle is the local bundle, byte for byte."""
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "2")
    options, plan, steps = KINDS[kind]
    tokenize = TokenizeSpec(tokenizer_id=tokenizer_dir)
    pack = PackSpec(max_length=plan["pack"]) if "pack" in plan else None
    source = _kind_source(corpus, options)
    local = write_plan(source, tmp_path / "local", PlanOptions(tokenize=tokenize, pack=pack, workers=1))
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "ray-cache"))  # counted again, on the cluster
    ran = _kill_in_every_step(monkeypatch, ray_cluster.failpoint)
    on_ray = write_plan(source, tmp_path / "ray", PlanOptions(tokenize=tokenize, pack=pack, engine="ray"))
    assert ran == steps and _tree(on_ray) == _tree(local)


def test_a_continuation_and_a_cost_mixture_on_ray_are_the_local_plans_when_a_worker_dies(
    ray_cluster,
    corpus,
    functions,  # noqa: F811
    wds,  # noqa: F811
    tokenizer_dir,
    tmp_path,
    monkeypatch,
) -> None:
    """A continuation of an exact plan (its new segment counted on Ray) and a computed cost mixture (its cost pass
    on Ray), each step losing a worker."""
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "2")
    tokenize, pack = TokenizeSpec(tokenizer_id=tokenizer_dir), PackSpec(max_length=65)
    exact = KINDS["exact"][0]
    parent = _kind_source(corpus, {**exact, "num_tokens": 3000}).plan(
        tmp_path / "parent", tokenize=tokenize, pack=pack, workers=1
    )
    child = _kind_source(corpus, exact)
    fn = computed_cost(f"{functions}:patches")
    plans = {}
    for engine in ("local", "ray"):
        monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / f"{engine}-cache"))
        ran = _kill_in_every_step(monkeypatch, ray_cluster.failpoint) if engine == "ray" else []
        options = {"engine": engine} if engine == "ray" else {"workers": 1}
        plans[engine] = (
            child.plan(
                tmp_path / f"child-{engine}",
                tokenize=tokenize,
                pack=pack,
                continue_from=parent,
                at_step=2,
                global_batch=4,
                **options,
            ),
            costs_source(wds, fn).plan(tmp_path / f"costs-{engine}", **options),
        )
        if engine == "ray":
            assert ran == ["ray_scan", "ray_join", "ray_pass", "ray_scan", "ray_costs"]
    assert [_tree(p) for p in plans["ray"]] == [_tree(p) for p in plans["local"]]
    assert costs_of(plans["ray"][1]) == COSTS
