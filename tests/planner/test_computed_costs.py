"""Costs computed by a planning pass (issue #28 item 3): ``cost=computed_cost("mod:fn")`` calls a function on each
sample as a record pipeline reads it, caches the arrays per shard and function, gives the same plan cached or
computed, on 1 or 2 workers and from S3 or the Hub; remote tar shards take sidecar-keyed costs; bad functions and
values are one line naming dataset, shard, row and key."""

from __future__ import annotations

import importlib
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image
from support.doc_blocks import run_block

from zephon.cli import cli
from zephon.errors import ConfigError, DatasetError
from zephon.io import Dataset
from zephon.records import computed_cost
from zephon.storage.objects.reads import REQUESTS
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

FUNCTIONS = """
import io, math
from PIL import Image

def patches(sample):
    width, height = Image.open(io.BytesIO(sample["jpg"])).size
    return math.ceil(width / 14) * math.ceil(height / 14) + len(sample["txt"]) / 4

def width_only(sample):
    return Image.open(io.BytesIO(sample["jpg"])).size[0] / 14

def mds_cost(sample):
    return sample["label"] + len(sample["caption"]) + Image.open(io.BytesIO(sample["image"])).size[0]

def row_cost(row):
    return row["width"] / 3

def raises(sample):
    if sample["__key__"] == "1002":
        raise ValueError("no image here")
    return 1

def text(sample):
    return "many"

def nan(sample):
    return float("nan")

def negative(sample):
    return -2 if sample["__key__"] == "2001" else 1

def huge(sample):
    return 2**31

def flag(sample):
    return True

NOT_CALLABLE = 3
"""
#: patches() of shard s, sample i: ceil(w/14)·ceil(h/14) + 11/4 (captions "caption s-i" are 11 bytes), rounded up.
COSTS = [4, 7, 6, 5, 5, 9, 4, 7, 6, 5, 5, 9]  # shards 0, 1, 2


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (width % 255, height % 255, 7)).save(out, "JPEG")
    return out.getvalue()


def tar_shard(shard: int, samples: int = 4) -> bytes:
    """Sample i: a JPEG of 14·(1 + (i + shard) % 3) × 14·(1 + i % 2) pixels and an 11-byte caption."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(samples):
            members = (
                ("jpg", jpeg(14 * (1 + (i + shard) % 3), 14 * (1 + i % 2))),
                ("txt", f"caption {shard}-{i}".encode()),
            )
            for ext, payload in members:
                info = tarfile.TarInfo(f"{shard}{i:03d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


@pytest.fixture(scope="module")
def functions(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A module of cost functions on an import path of this process (its workers get the same path)."""
    folder = tmp_path_factory.mktemp("costfns")
    (folder / "zephon_test_costs.py").write_text(FUNCTIONS)
    sys.path.insert(0, str(folder))
    yield "zephon_test_costs"
    sys.path.remove(str(folder))
    sys.modules.pop("zephon_test_costs", None)


@pytest.fixture(scope="module")
def wds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wds")
    for s in range(3):
        (folder / f"{s:02d}.tar").write_bytes(tar_shard(s))
    return folder


def source(path: str | Path, cost: object, **options) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", path, cost=cost, **options)],
        mixture=MixtureSpec({"pairs": 1.0}),
        seed=4,
        shuffle=ShuffleSpec(enabled=False),
    )


def costs_of(plan: Path) -> list[int]:
    return pq.read_table(plan / "samples.parquet").column("tokens").to_pylist()


def cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "computed-costs").glob("*.npy"))


def test_a_computed_cost_is_the_functions_value_on_each_tar_sample_rounded_up(functions, wds, tmp_path):
    plan = source(wds, computed_cost(f"{functions}:patches")).plan(tmp_path / "plan", workers=1)
    assert costs_of(plan) == COSTS
    manifest = json.loads((plan / "plan.json").read_text())
    cost = manifest["config"]["datasets"][0]["cost"]
    assert cost["function"] == f"{functions}:patches" and len(cost["source"]) == 64
    assert manifest["totals"]["tokens_are"] == "cost"


def test_plans_are_byte_identical_computed_on_1_or_2_workers_or_cached(functions, wds, tmp_path, monkeypatch):
    made = {}
    for name, workers in (("one", 1), ("two", 2), ("cached", 2)):
        if name != "cached":
            monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / f"cache-{name}"))
        made[name] = source(wds, computed_cost(f"{functions}:patches")).plan(tmp_path / name, workers=workers)
    assert costs_of(made["one"]) == COSTS
    for name in ("two", "cached"):
        for file in ("samples.parquet", "shards.parquet"):
            assert (made[name] / file).read_bytes() == (made["one"] / file).read_bytes(), (name, file)
    one, two = cache_entries(tmp_path / "cache-one"), cache_entries(tmp_path / "cache-two")
    assert len(one) == 3 and one == two
    for entry in one:
        assert (tmp_path / "cache-one" / "computed-costs" / entry).read_bytes() == (
            tmp_path / "cache-two" / "computed-costs" / entry
        ).read_bytes()


def test_zephon_count_computes_ahead_and_plan_reuses_the_cache(functions, wds, tmp_path, _isolated_cache):
    config = tmp_path / "pairs.yaml"
    config.write_text(
        f"datasets:\n  - {{name: pairs, path: {wds}, cost: {{function: '{functions}:patches'}}}}\n"
        "mixture: {pairs: 1.0}\nseed: 4\nshuffle: {enabled: false}\n"
    )
    runner = CliRunner()
    first = runner.invoke(cli, ["count", str(config), "--workers", "1"])
    assert first.exit_code == 0, first.output
    assert first.output.splitlines() == [
        "computed costs of 3 shards (0 cached)",
        f"  pairs  samples 12  cost {sum(COSTS)}",
    ]
    again = runner.invoke(cli, ["count", str(config)])
    assert again.output.splitlines()[0] == "computed costs of 0 shards (3 cached)"
    stamps = {p: p.stat().st_mtime_ns for p in (_isolated_cache / "computed-costs").iterdir()}
    planned = runner.invoke(cli, ["plan", str(config), "-o", str(tmp_path / "plan")])
    assert planned.exit_code == 0, planned.output
    assert costs_of(tmp_path / "plan") == COSTS
    assert {p: p.stat().st_mtime_ns for p in (_isolated_cache / "computed-costs").iterdir()} == stamps  # reused


def test_an_edited_function_is_computed_again_and_changes_the_config_hash(wds, tmp_path, monkeypatch, _isolated_cache):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "zephon_edited_cost.py"
    module.write_text("def cost(sample):\n    return 1\n")
    first = source(wds, computed_cost("zephon_edited_cost:cost")).plan(tmp_path / "first", workers=1)
    module.write_text("def cost(sample):\n    return 1 + len(sample['txt'])\n")
    sys.modules.pop("zephon_edited_cost", None)
    importlib.invalidate_caches()
    second = source(wds, computed_cost("zephon_edited_cost:cost")).plan(tmp_path / "second", workers=1)
    sys.modules.pop("zephon_edited_cost", None)
    assert costs_of(first) == [1] * 12 and costs_of(second) == [12] * 12
    hashes = [json.loads((p / "plan.json").read_text())["config_hash"] for p in (first, second)]
    assert hashes[0] != hashes[1] and len(cache_entries(_isolated_cache)) == 6


def test_an_expression_adds_the_computed_column_to_sidecar_columns(functions, wds, tmp_path):
    keys = [f"{s}{i:03d}" for s in range(3) for i in range(4)]
    pq.write_table(pa.table({"__key__": keys, "text_tokens": list(range(12))}), tmp_path / "sizes.parquet")
    cost = computed_cost(f"{functions}:width_only", expression="computed * 10 + text_tokens")
    plan = source(wds, cost, metadata=tmp_path / "sizes.parquet", key="__key__").plan(tmp_path / "plan", workers=1)
    widths = [1 + (i + s) % 3 for s in range(3) for i in range(4)]
    assert costs_of(plan) == [w * 10 + t for w, t in zip(widths, range(12), strict=True)]


def test_a_parquet_rows_or_jsonl_objects_columns_reach_the_function(functions, tmp_path):
    (tmp_path / "rows").mkdir()
    pq.write_table(pa.table({"width": [28, 20, 3], "caption": ["a", "b", "c"]}), tmp_path / "rows" / "0.parquet")
    plan = source(tmp_path / "rows", computed_cost(f"{functions}:row_cost")).plan(tmp_path / "plan", workers=1)
    assert costs_of(plan) == [10, 7, 1]
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "0.jsonl").write_text('{"width": 9, "caption": "x"}\n{"width": 31}\n')
    plan = source(tmp_path / "lines", computed_cost(f"{functions}:row_cost")).plan(tmp_path / "jsonl", workers=1)
    assert costs_of(plan) == [3, 11]


def test_an_mds_samples_decoded_values_reach_the_function(functions, tmp_path):
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "records_mds"
    expected = json.loads((fixtures / "expected.json").read_text())
    plan = source(fixtures / "pairs", computed_cost(f"{functions}:mds_cost")).plan(tmp_path / "plan", workers=1)
    assert costs_of(plan) == [e["label"] + len(e["caption"]) + 8 for e in expected]  # 8 × 8 JPEGs


def test_an_mds_dataset_on_s3_and_compressed_gets_the_local_costs(functions, tmp_path, s3):
    """A remote MDS shard is read whole by the pass (one GET), a compressed one decompressed: the same costs."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "records_mds"
    fn = computed_cost(f"{functions}:mds_cost")
    local = costs_of(source(fixtures / "pairs", fn).plan(tmp_path / "local", workers=1))
    s3.upload_dir(fixtures / "pairs", "mds/")
    assert costs_of(source(s3.url("mds/"), fn).plan(tmp_path / "s3", workers=1)) == local
    zstd = costs_of(source(fixtures / "compressed" / "zstd", fn).plan(tmp_path / "zstd", workers=1))
    assert zstd == local and len(local) > 0


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("raises", r"got ValueError: no image here at shard \S+01\.tar row 2 \(key '1002'\)"),
        ("text", r"got str 'many' at shard \S+00\.tar row 0 \(key '0000'\)"),
        ("flag", r"got bool True at shard \S+00\.tar row 0"),
        ("nan", r"got not a finite number \(nan\) at shard \S+00\.tar row 0"),
        ("negative", r"got negative \(-2\) at shard \S+02\.tar row 1 \(key '2001'\)"),
        ("huge", r"got above 2147483647 \(2147483648\) at shard \S+00\.tar row 0"),
    ],
)
def test_a_function_that_fails_or_returns_a_bad_cost_is_one_line(functions, wds, tmp_path, name, match):
    with pytest.raises(DatasetError, match=rf"^dataset 'pairs': cost function {functions}:{name} must [^\n]*{match}"):
        source(wds, computed_cost(f"{functions}:{name}")).plan(tmp_path / "plan", workers=1)


def test_a_worker_processes_refusal_arrives_as_its_one_line(functions, wds, tmp_path):
    with pytest.raises(DatasetError, match=r"^dataset 'pairs': [^\n]*got negative \(-2\)[^\n]*key '2001'[^\n]*$"):
        source(wds, computed_cost(f"{functions}:negative")).plan(tmp_path / "plan", workers=2)


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("zephon_no_such_module:fn", r"must be importable, got ModuleNotFoundError: No module named"),
        ("{m}:absent", r"must be importable, got AttributeError"),
        ("{m}:NOT_CALLABLE", r"must be callable, got int"),
    ],
)
def test_a_function_that_is_not_importable_or_callable_is_one_line(functions, wds, tmp_path, path, match):
    path = path.format(m=functions)
    with pytest.raises(ConfigError, match=rf"^dataset 'pairs': cost function '{path}' {match}[^\n]*$"):
        source(wds, computed_cost(path)).plan(tmp_path / "plan", workers=1)


def test_a_path_that_is_not_module_colon_name_is_refused_when_written():
    with pytest.raises(ConfigError, match=r"must be an import path 'module.path:name', got 'costs\.patches'"):
        computed_cost("costs.patches")


def test_costs_on_s3_tar_shards_plan_as_the_local_copy(functions, wds, tmp_path, s3):
    s3.upload_dir(wds, "wds/")
    keys = [f"{s}{i:03d}" for s in range(3) for i in range(4)]
    pq.write_table(pa.table({"__key__": keys, "n": [k * 3 for k in range(12)]}), tmp_path / "sizes.parquet")
    sidecar = {"metadata": tmp_path / "sizes.parquet", "key": "__key__"}
    local = source(wds, "n + 1", **sidecar).plan(tmp_path / "local-side", workers=1)
    REQUESTS.clear()
    remote = source(s3.url("wds/"), "n + 1", **sidecar).plan(tmp_path / "s3-side", workers=1)
    assert costs_of(remote) == [k * 3 + 1 for k in range(12)]
    assert (remote / "samples.parquet").read_bytes() == (local / "samples.parquet").read_bytes()
    # the keys come from the index the scan kept by pin: 1 header window per shard, no payload read
    assert (REQUESTS["list"], REQUESTS["tar_headers"], REQUESTS["whole"], REQUESTS["tar_members"]) == (1, 3, 0, 0)
    fn = computed_cost(f"{functions}:patches")
    local = source(wds, fn).plan(tmp_path / "local-fn", workers=1)
    REQUESTS.clear()
    remote = source(s3.url("wds/"), fn).plan(tmp_path / "s3-fn", workers=1)
    assert (remote / "samples.parquet").read_bytes() == (local / "samples.parquet").read_bytes()
    assert costs_of(remote) == COSTS
    # the pass reads each shard whole, once: 1 GET per shard, not 1 per sample; the headers by pin, cached
    assert (REQUESTS["tar_headers"], REQUESTS["whole"], REQUESTS["tar_members"]) == (0, 3, 0)
    REQUESTS.clear()
    source(s3.url("wds/"), fn).plan(tmp_path / "s3-again", workers=1)
    assert (REQUESTS["tar_headers"], REQUESTS["whole"]) == (0, 0)  # costs cached by the objects' pins


def test_costs_on_hub_tar_shards_plan_as_the_local_copy(functions, wds, tmp_path, hub_server):
    hub_server.add_dataset("org/pairs", {f"train/{p.name}": p.read_bytes() for p in sorted(wds.iterdir())})
    fn = computed_cost(f"{functions}:patches", expression="computed + length(__key__)")
    local = source(wds, fn).plan(tmp_path / "local", workers=1)
    hub_server.clear_requests()
    remote = source("hf://org/pairs/train", fn).plan(tmp_path / "hub", workers=1)
    assert (remote / "samples.parquet").read_bytes() == (local / "samples.parquet").read_bytes()
    assert costs_of(remote) == [c + 4 for c in COSTS]
    ranged = [r.path.rsplit("/", 1)[1] for r in hub_server.requests if "/resolve/" in r.path and r.range is not None]
    # per shard: the scan's header window (64 KiB: the whole of these small shards), then the pass's one read of
    # the whole shard; `__key__` for the expression comes from the index the scan kept (no request)
    assert sorted(ranged) == ["00.tar", "00.tar", "01.tar", "01.tar", "02.tar", "02.tar"]


def test_the_records_page_s_computed_cost_example_prints_what_it_shows(monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the example adds its folder
    try:
        shown = run_block("records.md", "### Computed costs: a function of each sample", shown_prefix="# [")
    finally:
        sys.modules.pop("vlm_costs", None)
    assert capsys.readouterr().out.splitlines() == shown == ["[4, 11, 1]"]


def test_a_computed_cost_packs_samples_and_zephon_show_lists_them(functions, wds, tmp_path):
    from zephon import Pipeline

    pipe = Pipeline(source(wds, computed_cost(f"{functions}:patches"))).pack_samples(max_cost=12)
    rows = [[int(p) for p in row] for batch in pipe.batch(microbatch_size=2) for row in batch.rows()]
    # best fit (the open row with the least room that holds it) of 4 7 6 5 5 9 4 7 6 5 5 9 into rows of 12
    assert rows == [[0, 1], [2, 3], [4, 6], [5], [7, 9], [8, 10], [11], []]  # the last microbatch's 2nd: past the end
    assert [sum(COSTS[p] for p in row) for row in rows] == [11, 11, 9, 9, 12, 11, 9, 0]
    plan = source(wds, computed_cost(f"{functions}:patches")).plan(tmp_path / "plan", workers=1, sample_pack=_pack(12))
    shown = CliRunner().invoke(cli, ["show", str(plan), "--step", "0", "--batch-size", "2"])
    assert shown.exit_code == 0 and "samples packed by cost, at most 12 per row" in shown.output, shown.output


def _pack(max_cost: int):
    from zephon.specs import SamplePackSpec

    return SamplePackSpec(max_cost=max_cost)


def test_a_config_cost_mapping_with_an_unknown_key_is_one_line(tmp_path, wds):
    from zephon.config_file import load_plan_config

    config = tmp_path / "bad.yaml"
    config.write_text(f"datasets:\n  - {{name: p, path: {wds}, cost: {{function: 'm:f', expresion: 'computed'}}}}\n"
                      "mixture: {p: 1.0}\nseed: 1\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"`datasets\[0\]\.cost` keys must be among function, expression, got "
                                          r"unknown `expresion` \(did you mean `expression`\?\)"):  # fmt: skip
        load_plan_config(config)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, (3, "")),
        (2.1, (3, "")),
        (np.float32(1.5), (2, "")),
        (np.int64(7), (7, "")),
        (-0.0, (0, "")),
        (2**31 - 1, (2**31 - 1, "")),
        (-0.5, (None, "negative (-0.5)")),
        (10**400, (None, f"above 2147483647 ({'1' + '0' * 39})")),
        (float("inf"), (None, "not a finite number (inf)")),
        (None, (None, "NoneType None")),
    ],
)
def test_a_functions_value_is_rounded_up_or_refused_by_the_expressions_rules(value, expected):
    from zephon.planner.counts.cost_worker import _checked

    assert _checked(value) == expected


def test_a_computed_cost_on_each_clouds_tars_plans_as_the_local_copy(functions, wds, tmp_path, bucket):
    bucket.upload_dir(wds, "wds/")
    fn = computed_cost(f"{functions}:patches")
    local = source(wds, fn).plan(tmp_path / "local", workers=1)
    remote = source(bucket.url("wds/"), fn).plan(tmp_path / "remote", workers=2)  # read whole by worker processes
    assert (remote / "samples.parquet").read_bytes() == (local / "samples.parquet").read_bytes()
