"""Sample costs planned offline (issue #28 item 3): ``cost=`` evaluated by DuckDB at plan time, cost mixtures and
budgets, ``pack_samples`` rows in the plan, and packed record runs that follow them at any dp size and after
resume; ``zephon show``/``audit`` on cost plans; bad costs as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from support.doc_blocks import run_block

from zephon import Pipeline
from zephon.cli import cli
from zephon.errors import ConfigError, DatasetError
from zephon.io import Dataset
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

PATCHES = "text_tokens + ceil(width / 14.0) * ceil(height / 14.0)"
#: img's costs under PATCHES: 10 + 2·1, 3 + 2·2, 5 + 1·1, 7 + 1·2, 2 + 3·1, 9 + 1·1.
IMG_COSTS = [12, 7, 6, 9, 5, 10]
#: txt's costs under PATCHES (14 × 14 pixels: one patch).
TXT_COSTS = [2, 3, 4, 5]
IN_ORDER = ShuffleSpec(enabled=False)


def write(folder: Path, columns: dict[str, list]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), folder / "part-0.parquet", row_group_size=4)
    return folder


def write_data(root: Path) -> Path:
    write(
        root / "img",
        {
            "id": [f"img-{i}" for i in range(6)],
            "text_tokens": [10, 3, 5, 7, 2, 9],
            "width": [28, 20, 14, 14, 40, 1],
            "height": [14, 20, 14, 28, 14, 1],
        },
    )
    write(
        root / "txt",
        {"id": [f"txt-{i}" for i in range(4)], "text_tokens": [1, 2, 3, 4], "width": [14] * 4, "height": [14] * 4},
    )
    return root


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_data(tmp_path)


@pytest.fixture(scope="module")
def mixed_packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two datasets mixed by cost and packed into rows of at most 16, planned once for the module."""
    root = write_data(tmp_path_factory.mktemp("mixed"))
    return mixed(root).plan(root / "plan", sample_pack=_pack(16))


def source(data: Path, cost: str = PATCHES, **options) -> StaticMixtureWorkSource:
    options.setdefault("shuffle", IN_ORDER)
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("img", data / "img", cost=cost)],
        mixture=MixtureSpec({"img": 1.0}),
        seed=5,
        **options,
    )


def mixed(data: Path, **options) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("img", data / "img", cost=PATCHES),
            Dataset.from_path("txt", data / "txt", cost=PATCHES),
        ],
        mixture=MixtureSpec({"img": 1.0, "txt": 1.0}),
        seed=5,
        shuffle=IN_ORDER,
        mixture_unit="cost",
        **options,
    )


def column(plan: Path, name: str, file: str = "samples.parquet") -> list:
    return pq.read_table(plan / file).column(name).to_pylist()


def bins_rows(plan: Path) -> list[list[int]]:
    bins = pq.read_table(plan / "bins.parquet").to_pydict()
    rows: list[list[int]] = []
    for seq, pos in zip(bins["sequence"], bins["position"], strict=True):
        if seq == len(rows):
            rows.append([])
        rows[seq].append(pos)
    return rows


def test_costs_are_the_expression_per_sample_and_non_integers_are_rounded_up(data: Path, tmp_path: Path):
    plan = source(data).plan(tmp_path / "p")
    assert column(plan, "tokens") == IMG_COSTS
    manifest = json.loads((plan / "plan.json").read_text())
    assert manifest["totals"]["tokens"] == sum(IMG_COSTS) and manifest["totals"]["tokens_are"] == "cost"
    assert manifest["config"]["datasets"][0]["cost"] == PATCHES
    # 28/3 = 9.33 → 10, 20/3 = 6.67 → 7, 14/3 = 4.67 → 5, 40/3 = 13.3 → 14, 1/3 → 1
    assert column(source(data, "width / 3").plan(tmp_path / "q"), "tokens") == [10, 7, 5, 5, 14, 1]


def test_a_cost_from_a_sidecar_joins_on_the_key_and_a_where_leaves_rows_out(data: Path, tmp_path: Path):
    write(tmp_path / "side", {"id": ["img-0", "img-1", "img-2", "img-4"], "patches": [4, 0, 9, 1]})
    ds = Dataset.from_path(
        "img", data / "img", metadata=tmp_path / "side", key="id", where="text_tokens < 9", cost="text_tokens + patches"
    )
    # img-3 (7 tokens) has no sidecar row: NULL — but img-5 (9 tokens) and img-0 (10) are not selected.
    with pytest.raises(
        DatasetError, match=r"got NULL \(None\) at shard .*part-0.parquet row 3 \(key 'img-3'\) and 0 more"
    ):
        StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"img": 1}), seed=1, shuffle=IN_ORDER).plan(
            tmp_path / "bad"
        )
    ok = Dataset.from_path(
        "img", data / "img", metadata=tmp_path / "side", key="id", where="patches IS NOT NULL AND text_tokens < 9",
        cost="text_tokens + patches",
    )  # fmt: skip
    plan = StaticMixtureWorkSource(datasets=[ok], mixture=MixtureSpec({"img": 1}), seed=1, shuffle=IN_ORDER).plan(
        tmp_path / "ok"
    )
    assert column(plan, "row") == [1, 2, 4] and column(plan, "tokens") == [3, 14, 3]


@pytest.mark.parametrize(
    ("cost", "error", "message"),
    [
        ("text_tokens +", ConfigError, r"cost='text_tokens \+' must be a number-valued DuckDB expression .*Parser"),
        ("pixels * 2", ConfigError, r"over the dataset's columns \(id, text_tokens, width, height\).*pixels"),
        ("id", ConfigError, r"cost='id' must be a number-valued DuckDB expression.*Conversion"),
        (
            "text_tokens - 5",
            DatasetError,
            r"got negative \(-2.0\) at shard .*part-0.parquet row 1 and 1 more — make it",
        ),
        ("CASE WHEN width > 20 THEN NULL ELSE 1 END", DatasetError, r"got NULL \(None\) at shard .* row 0 and 1 more"),
    ],
)
def test_a_bad_cost_is_one_line_naming_the_dataset_shard_and_row(data: Path, tmp_path: Path, cost, error, message):
    with pytest.raises(error, match=message) as info:
        source(data, cost).plan(tmp_path / "p")
    assert "\n" not in str(info.value) and str(info.value).startswith("dataset 'img': cost=")


def test_costs_are_all_or_none_and_a_cost_mixture_needs_them_everywhere(data: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match=r"needs a cost= on every dataset, got none on \['txt'\]"):
        StaticMixtureWorkSource(
            datasets=[Dataset.from_path("img", data / "img", cost="1"), Dataset.from_path("txt", data / "txt")],
            mixture=MixtureSpec({"img": 1, "txt": 1}), seed=1, mixture_unit="cost",
        )  # fmt: skip
    plain = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("img", data / "img", cost="1"), Dataset.from_path("txt", data / "txt")],
        mixture=MixtureSpec({"img": 1, "txt": 1}), seed=1,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"got it on \['img'\] but not on \['txt'\]"):
        plain.plan(tmp_path / "p")
    with pytest.raises(ConfigError, match=r"num_cost=10 needs a cost mixture"):
        source(data, num_cost=10)
    bare = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("img", data / "img")], mixture=MixtureSpec({"img": 1}), seed=1
    )
    with pytest.raises(ConfigError, match=r"pack_samples must plan datasets with a cost=, got none"):
        bare.plan(tmp_path / "q", sample_pack=_pack(8))
    with pytest.raises(ConfigError, match=r"pack_samples must go with a record pipeline"):
        Pipeline(bare).tokenize(tokenizer_id="gpt2").pack_samples(max_cost=8).batch(microbatch_size=1).executor_spec()


def test_a_cost_mixture_interleaves_by_cost_shares_in_every_prefix(data: Path, tmp_path: Path):
    plan = mixed(data).plan(tmp_path / "p")
    # Finish times C/w: img 24 38 50 68 78 98; txt (repeating its pass) 4 10 18 28 | 32 38 46 56 | 60 66 74 84 | 88 94
    assert column(plan, "dataset_id") == [1, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 1, 1, 1, 0]
    assert column(plan, "tokens") == [2, 3, 4, 12, 5, 2, 7, 3, 4, 6, 5, 2, 3, 9, 4, 5, 5, 2, 3, 10]
    manifest = json.loads((plan / "plan.json").read_text())
    assert manifest["mixture"]["unit"] == "cost"
    assert [d["planned_tokens"] for d in manifest["datasets"]] == [49, 47]  # txt: 3 passes (14 each) + 2 + 3


def test_a_num_cost_budget_plans_samples_until_their_costs_reach_it(data: Path, tmp_path: Path):
    # on_exhaustion="stop" caps the readers at one pass (an open-ended budget buffers many passes of tiny datasets)
    plan = mixed(data, num_cost=20, on_exhaustion="stop").plan(tmp_path / "p")
    assert column(plan, "tokens") == [2, 3, 4, 12]  # 9 < 20 ≤ 21: the sample that reaches the budget ends it
    assert json.loads((plan / "plan.json").read_text())["budget"]["num_cost"] == 20


def test_pack_samples_plans_best_fit_rows_that_never_exceed_max_cost(data: Path, tmp_path: Path):
    plan = source(data).plan(tmp_path / "p", sample_pack=_pack(16))
    # 12 opens row 0 (room 4); 7 opens row 1 (9); 6 → row 1 (3); 9 opens row 2 (7); 5 → row 2 (2); 10 opens row 3
    assert bins_rows(plan) == [[0], [1, 2], [3, 4], [5]]
    packing = json.loads((plan / "plan.json").read_text())["sample_packing"]
    assert packing == {
        "algorithm": "best_fit", "max_cost": 16, "oversize": "refuse", "rows": 4,
        "fill_fraction": 49 / 64, "dropped_samples": 0, "dropped_cost": 0,
    }  # fmt: skip


def test_zero_cost_samples_are_packed_too(data: Path, tmp_path: Path):
    plan = source(data, "greatest(text_tokens - 3, 0)").plan(tmp_path / "p", sample_pack=_pack(8))
    # costs 7 0 2 4 0 6: the zero-cost samples join the open row with the least room
    assert column(plan, "tokens") == [7, 0, 2, 4, 0, 6]
    assert bins_rows(plan) == [[0, 1, 4], [2, 3], [5]]


def test_a_sample_over_max_cost_is_refused_or_dropped_and_counted(data: Path, tmp_path: Path):
    with pytest.raises(
        DatasetError, match=r"must cost at most max_cost=9 .*got 12 at shard .*part-0.parquet row 0 and 1 more"
    ):
        source(data).plan(tmp_path / "p", sample_pack=_pack(9))
    plan = source(data).plan(tmp_path / "q", sample_pack=_pack(9, oversize="drop"))
    assert bins_rows(plan) == [[1], [2], [3], [4]]
    packing = json.loads((plan / "plan.json").read_text())["sample_packing"]
    assert (packing["dropped_samples"], packing["dropped_cost"]) == (2, 22)


def test_the_same_config_writes_byte_identical_plans(data: Path, tmp_path: Path):
    a = mixed(data).plan(tmp_path / "a", sample_pack=_pack(16))
    b = mixed(data).plan(tmp_path / "b", sample_pack=_pack(16))
    for name in ("samples.parquet", "bins.parquet", "shards.parquet", "plan.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def packed(plan: Path, *, rank: int = 0, size: int = 1, b: int = 1, g: int = 2, collate=None) -> Pipeline:
    pipe = Pipeline.from_plan(plan).batch(microbatch_size=b, global_batch_size=g, collate=collate)
    return pipe.options(dp_rank=rank, dp_size=size)


def steps_of(pipes: list[Pipeline]) -> dict[int, dict[int, list[str]]]:
    """Per step: each plan row's record ids, gathered from every rank."""
    out: dict[int, dict[int, list[str]]] = {}
    for pipe in pipes:
        for batch in pipe:
            for i, row in enumerate(batch.row.tolist()):
                out.setdefault(batch.step, {}).setdefault(int(batch.sequences[row]), []).append(batch.data["id"][i])
    return out


def test_a_packed_run_yields_each_microbatchs_rows_with_their_members(mixed_packed: Path):
    plan = mixed_packed
    rows = bins_rows(plan)
    # costs 2 3 4 12 5 2 7 3 4 6 5 2 3 9 4 5 5 2 3 10: 2, 3, 4 open row 0 (room 7); 12 opens row 1 (4); 5 and 2
    # fill row 0; 7 opens row 2 (9); 3 → row 1 (1); 4 → row 2 (5); 6 opens row 3; 5 closes row 2; …
    assert rows == [[0, 1, 2, 4, 5], [3, 7], [6, 8, 10], [9, 11, 12, 14], [13, 15, 17], [16, 18], [19]]
    pipe = packed(plan, b=2, g=2)
    assert pipe.num_steps() == 4
    batches = list(pipe)
    assert [b.sequences.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [[r.tolist() for r in b.rows()] for b in batches] == [rows[0:2], rows[2:4], rows[4:6], [rows[6], []]]
    assert batches[0].row.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert batches[0].data["id"] == ["txt-0", "txt-1", "txt-2", "txt-3", "txt-0", "img-0", "txt-1"]
    grouped = list(packed(plan, b=2, g=2, collate=lambda rows: [[r["id"] for r in row] for row in rows]))
    assert grouped[3].data == [["img-5"]]  # a user collate receives the rows that exist


def test_packed_global_batches_are_the_same_at_dp_1_2_and_after_resume(mixed_packed: Path):
    plan = mixed_packed
    one = steps_of([packed(plan, b=2, g=2)])
    two = steps_of([packed(plan, rank=r, size=2, b=1, g=2) for r in range(2)])
    assert one == two and sorted(one) == [0, 1, 2, 3]
    first = packed(plan, b=2, g=2)
    it = iter(first)
    next(it)
    state = first.state_dict()
    assert state["step"] == 1
    resumed = packed(plan, rank=1, size=2, b=1, g=2)
    resumed.load_state_dict(state)
    other = packed(plan, rank=0, size=2, b=1, g=2)
    other.load_state_dict(state)
    assert steps_of([other, resumed]) == {s: one[s] for s in (1, 2, 3)}


def test_zephon_show_lists_a_steps_rows_and_audit_reports_cost_shares(mixed_packed: Path):
    plan = mixed_packed
    shown = CliRunner().invoke(cli, ["show", str(plan), "--step", "1", "--batch-size", "2", "--format", "json"])
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.output)
    assert view["sequences_are"] == "samples packed by cost, at most 16 per row" and view["tokens"] == 31
    members = [(d["sequence"], d["position"], d["tokens"]) for d in view["documents"]]
    assert members == [(2, 6, 7), (2, 8, 4), (2, 10, 5), (3, 9, 6), (3, 11, 2), (3, 12, 3), (3, 14, 4)]
    audit = CliRunner().invoke(cli, ["audit", str(plan), "--batch-size", "2", "--window", "2", "--format", "json"])
    report = json.loads(audit.output)
    assert report["by"] == "cost" and report["target"] == "weights"
    assert [d["overall_share"] for d in report["datasets"]] == pytest.approx([49 / 96, 47 / 96])  # costs 49 and 47


def test_a_config_file_plans_costs_and_packing_like_the_python_api(data: Path, tmp_path: Path):
    config = tmp_path / "records.yaml"
    config.write_text(
        "seed: 5\n"
        "datasets:\n"
        f'  - {{name: img, path: {data / "img"}, cost: "{PATCHES}"}}\n'
        f'  - {{name: txt, path: {data / "txt"}, cost: "{PATCHES}"}}\n'
        "mixture: {img: 1, txt: 1}\n"
        "mixture_unit: cost\n"
        "shuffle: {enabled: false}\n"
        "pack_samples: {max_cost: 16}\n"
    )
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "cfg")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == [
        "  img  weight 0.500  documents  6  passes 1.00  cost 49 (share 0.510)",
        "  txt  weight 0.500  documents 14  passes 3.50  cost 47 (share 0.490)",
        "  rows 7 of max_cost 16 (best_fit), filled 0.857",
    ]
    python = mixed(data).plan(tmp_path / "py", sample_pack=_pack(16))
    for name in ("samples.parquet", "bins.parquet"):
        assert (tmp_path / "cfg" / name).read_bytes() == (python / name).read_bytes()


def test_a_webdataset_sample_costs_what_its_sidecar_row_says_keyed_by_its_key(tmp_path: Path):
    import io
    import tarfile

    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "shard-0.tar", "w") as tar:
        for key in ("k0", "k1", "k2", "k3"):
            for ext, payload in (("jpg", key.encode() * 3), ("txt", f"caption {key}".encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    write(tmp_path / "sizes", {"__key__": ["k3", "k1", "k0", "k2"], "patches": [6, 5, 4, 3]})
    ds = Dataset.from_path("wds", tmp_path / "wds", metadata=tmp_path / "sizes", key="__key__", cost="patches + 1")
    work = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"wds": 1}), seed=1, shuffle=IN_ORDER)
    plan = work.plan(tmp_path / "p", sample_pack=_pack(10))
    assert column(plan, "tokens") == [5, 6, 4, 7]  # k0 4+1, k1 5+1, k2 3+1, k3 6+1
    assert bins_rows(plan) == [[0], [1, 2], [3]]  # 5 opens row 0 (5 left); 6 opens row 1 (4 left); 4 fills row 1
    batches = list(packed(plan, b=1, g=1))
    assert [b.data["txt"] for b in batches] == [[b"caption k0"], [b"caption k1", b"caption k2"], [b"caption k3"]]
    assert [b.data["__key__"] for b in batches] == [["k0"], ["k1", "k2"], ["k3"]]
    missing = Dataset.from_path(
        "wds", tmp_path / "wds", metadata=tmp_path / "sizes", key="__key__", cost="patches + absent"
    )
    with pytest.raises(ConfigError, match=r"dataset 'wds': cost='patches \+ absent' must be a number-valued"):
        StaticMixtureWorkSource(datasets=[missing], mixture=MixtureSpec({"wds": 1}), seed=1).plan(tmp_path / "q")


def test_the_provenance_log_of_a_packed_run_passes_zephon_audit(mixed_packed: Path, tmp_path: Path):
    log = tmp_path / "log"
    for rank in range(2):
        pipe = packed(mixed_packed, rank=rank, size=2, b=1, g=2).options(provenance_dir=str(log))
        list(pipe.map_transform(lambda r: None if r["id"] == "img-0" else r))  # one record dropped, and logged so
    result = CliRunner().invoke(cli, ["audit", str(mixed_packed), "--log", str(log), "--format", "json"])
    report = json.loads(result.output)
    assert result.exit_code == 0, result.output
    assert report["mismatches"] == [] and report["skipped"] == {"dropped": 1}
    assert report["tokens_by_dataset"] == {"img": 5, "txt": 14}  # records: 19 planned, img-0 dropped


def _pack(max_cost: int, oversize: str = "refuse"):
    from zephon.specs import SamplePackSpec

    return SamplePackSpec(max_cost=max_cost, oversize=oversize)


def test_the_records_page_s_costs_example_prints_what_it_shows(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    shown = run_block("records.md", "## Costs and packing samples")
    assert capsys.readouterr().out.splitlines() == shown


def test_pack_samples_on_a_plan_packed_otherwise_is_refused_not_ignored(data: Path, tmp_path: Path):
    plan = source(data).plan(tmp_path / "p", sample_pack=_pack(16))
    with pytest.raises(
        ConfigError, match=r"pack_samples\(max_cost=20, oversize='refuse'\) must match .*got max_cost=16"
    ):
        list(Pipeline.from_plan(plan).pack_samples(max_cost=20).batch(microbatch_size=1))
    assert len(list(Pipeline.from_plan(plan).pack_samples(max_cost=16).batch(microbatch_size=1))) == 4
