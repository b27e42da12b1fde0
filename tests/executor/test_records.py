"""Record pipelines: a Pipeline without .tokenize() yields collated records that follow the plan position by
position — mixtures, phases, selections, elastic dp, resume, provenance and audits as for text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError
from zephon.executor.records.collate import default_collate
from zephon.inspection.log_check import check_log
from zephon.io import Dataset
from zephon.work import MixtureSpec, Phase, StaticMixtureWorkSource


def write_dataset(root: Path, name: str, shards: int = 2, rows: int = 6) -> Path:
    """Shards of records ``{id, label, jpg, size}``: id ``name-shard-row``, label ``10·shard + row``."""
    folder = root / name
    folder.mkdir(parents=True)
    for s in range(shards):
        table = pa.table(
            {
                "id": [f"{name}-{s}-{r}" for r in range(rows)],
                "label": [10 * s + r for r in range(rows)],
                "jpg": [bytes([s, r]) * 4 for r in range(rows)],
                "size": [[r, r + 1] for r in range(rows)],
            }
        )
        pq.write_table(table, folder / f"part-{s}.parquet", row_group_size=4)
    return folder


def planned_ids(plan_dir: Path) -> list[str]:
    """The record id at every plan position, read from the bundle itself (samples.parquet → shards.parquet)."""
    samples = pq.read_table(plan_dir / "samples.parquet").to_pydict()
    shards = pq.read_table(plan_dir / "shards.parquet").to_pydict()
    by_id = {
        sid: (ds, Path(uri).stem.split("-")[1])
        for sid, ds, uri in zip(shards["shard_id"], shards["dataset"], shards["uri"], strict=True)
    }
    return [f"{by_id[s][0]}-{by_id[s][1]}-{r}" for s, r in zip(samples["shard_id"], samples["row"], strict=True)]


@pytest.fixture
def two(tmp_path: Path) -> Path:
    """A plan of two datasets mixed 2:1 by samples, 18 positions."""
    a, b = write_dataset(tmp_path, "a"), write_dataset(tmp_path, "b")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("a", str(a)), Dataset.from_path("b", str(b))],
        mixture=MixtureSpec({"a": 2.0, "b": 1.0}),
        seed=11,
        num_documents=18,
    )
    return source.plan(tmp_path / "plan")


def records(plan: Path, *, rank: int = 0, size: int = 1, b: int = 2, g: int = 4, **batch) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .batch(microbatch_size=b, global_batch_size=g, **batch)
        .options(dp_rank=rank, dp_size=size)
    )


def ids_by_step(pipelines: list[Pipeline]) -> dict[int, list[str]]:
    """Every record id handed out, per step, in plan-position order across the ranks."""
    out: dict[int, list[tuple[int, str]]] = {}
    for pipe in pipelines:
        for batch in pipe:
            out.setdefault(batch.step, []).extend(zip(batch.positions.tolist(), batch.data.get("id", []), strict=True))
    return {step: [i for _, i in sorted(pairs)] for step, pairs in out.items()}


def test_default_collate_stacks_numbers_and_equal_arrays_and_keeps_bytes_strings_and_ragged_as_lists():
    got = default_collate(
        [
            {
                "id": "x",
                "n": 3,
                "w": 0.5,
                "ok": True,
                "jpg": b"ab",
                "img": np.zeros((2, 2), np.uint8),
                "tok": np.arange(3),
                "meta": {"bytes": b"1", "path": "p1"},
            },
            {
                "id": "y",
                "n": 5,
                "w": 1,
                "ok": False,
                "jpg": b"cd",
                "img": np.ones((2, 2), np.uint8),
                "tok": np.arange(4),
                "meta": {"bytes": b"2", "path": "p2"},
            },
        ]
    )
    assert got["id"] == ["x", "y"] and got["jpg"] == [b"ab", b"cd"]
    assert got["n"].dtype == torch.int64 and got["n"].tolist() == [3, 5]
    assert got["w"].dtype == torch.float32 and got["w"].tolist() == [0.5, 1.0]
    assert got["ok"].tolist() == [True, False]
    assert got["img"].shape == (2, 2, 2) and got["img"].dtype == torch.uint8 and got["img"][1].sum() == 4
    assert [t.tolist() for t in got["tok"]] == [[0, 1, 2], [0, 1, 2, 3]]  # ragged: a list
    assert got["meta"] == {"bytes": [b"1", b"2"], "path": ["p1", "p2"]}


def test_a_record_pipeline_yields_the_plans_records_position_by_position(two: Path):
    pipe = records(two)
    assert pipe.num_steps() == 5  # 18 positions, 4 per step: the last step holds 2
    batches = list(pipe)
    want = planned_ids(two)
    assert [i for batch in batches for i in batch.data.get("id", [])] == want
    assert [batch.positions.tolist() for batch in batches][:3] == [[0, 1], [2, 3], [4, 5]]
    assert [len(batch) for batch in batches][-2:] == [2, 0]  # positions 18, 19 are past the end
    first = batches[0].data
    assert first["label"].dtype == torch.int64 and isinstance(first["jpg"], list) and isinstance(first["size"], list)
    ids = [i for batch in batches for i in batch.data.get("id", [])]
    assert sum(i.startswith("a-") for i in ids) == 12 and sum(i.startswith("b-") for i in ids) == 6  # 2:1
    assert pipe.stats().documents == {"a": 12, "b": 6}
    assert list(records(two, drop_last=True))[-1].step == 3  # drop_last: whole steps only


def test_records_are_split_by_rows_of_the_global_batch_so_dp_1_2_4_hand_out_the_same_steps(two: Path):
    one = ids_by_step([records(two, b=4)])
    for size, b in ((2, 2), (4, 1)):
        assert ids_by_step([records(two, rank=r, size=size, b=b) for r in range(size)]) == one
    rank1 = [batch.positions.tolist() for batch in records(two, rank=1, size=2, b=1)]
    assert rank1[:4] == [[1], [3], [5], [7]]  # rows r, r + D, … of each step


def test_a_state_resumes_exactly_and_at_another_dp_size_at_a_step_boundary(two: Path):
    full = [i for batch in records(two) for i in batch.data.get("id", [])]
    pipe = records(two)
    it = iter(pipe)
    head = [i for _ in range(4) for i in next(it).data["id"]]  # 2 steps of 2 microbatches
    state = pipe.state_dict()
    assert (state["step"], state["microbatch"], state["algorithm"]) == (2, 0, "records")
    again = records(two)
    again.load_state_dict(state)
    assert head + [i for batch in again for i in batch.data.get("id", [])] == full
    ranks = []
    for r in range(4):
        p = records(two, rank=r, size=4, b=1)
        p.load_state_dict(state)
        ranks.append(p)
    rest = ids_by_step(ranks)
    assert [i for step in sorted(rest) for i in rest[step]] == full[8:]


def test_a_mid_step_state_must_resume_at_the_same_dp_size_and_a_text_state_is_refused(two: Path, tokenizer_dir):
    pipe = records(two)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    with pytest.raises(
        ConfigError, match="mid-step .* same dp_size 1 and microbatch size 2, got dp_size 2, microbatch size 2 — "
    ):
        records(two, size=2).load_state_dict(state)
    text = Pipeline.from_plan(two).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=16)
    text = text.batch(microbatch_size=2, global_batch_size=4)
    with pytest.raises(ConfigError, match="algorithm 'records' .this pipeline: 'wrap'"):
        text.load_state_dict(records(two).state_dict())


def test_phases_and_selections_are_followed_as_planned(tmp_path: Path):
    a, b = write_dataset(tmp_path, "a"), write_dataset(tmp_path, "b")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("a", str(a), where="label % 2 = 0"), Dataset.from_path("b", str(b))],
        mixture=MixtureSpec({"a": 3.0, "b": 1.0}),
        phases=[Phase(start=4, unit="documents", mixture=MixtureSpec({"b": 1.0}))],
        seed=3,
        num_documents=10,
    )
    plan = source.plan(tmp_path / "plan")
    ids = [i for batch in records(plan) for i in batch.data.get("id", [])]
    assert ids == planned_ids(plan)
    assert [i[0] for i in ids[:4]] == ["a", "a", "b", "a"] or sum(i[0] == "a" for i in ids[:4]) == 3  # 3:1
    assert all(int(i.rsplit("-", 1)[1]) % 2 == 0 for i in ids if i.startswith("a-"))  # the selection
    assert all(i.startswith("b-") for i in ids[4:])  # the phase


def test_operators_transform_and_drop_records_and_drops_are_counted(two: Path):
    def odd_dropped(record: dict) -> dict | None:
        return None if record["label"] % 2 else {**record, "pixels": np.full((2, 3), record["label"], np.uint8)}

    pipe = records(two).map_transform(odd_dropped)
    batches = list(pipe)
    want = [i for i in planned_ids(two) if int(i.rsplit("-", 1)[1]) % 2 == 0]
    assert [i for batch in batches for i in batch.data.get("id", [])] == want
    full = next(batch for batch in batches if len(batch) == 2)
    assert full.data["pixels"].shape == (2, 2, 3) and full.data["pixels"].dtype == torch.uint8
    assert any(len(batch) == 0 for batch in batches[:-1]) or any(len(batch) == 1 for batch in batches)
    assert pipe.stats().skipped == {"dropped": 18 - len(want)}


def test_a_collate_that_changes_structure_is_one_line_naming_the_path(two: Path):
    def ragged(record: dict) -> dict:
        return {**record, "vec": np.zeros(1 + record["label"] % 3)}

    with pytest.raises(DatasetError, match=r"^collated batch must keep the structure of the first batch, got vec: "):
        list(records(two).map_transform(ragged))
    flip = records(two, b=1, collate=lambda rs: {"x": 1} if rs[0]["label"] % 2 else [rs[0]["id"]])
    with pytest.raises(DatasetError, match="got the batch: .* make the collate return one structure"):
        list(flip)


def test_a_collate_pickle_cannot_send_to_a_spawned_worker_is_one_line(two: Path):
    from torch.utils.data import DataLoader

    dataset = records(two, b=1, collate=lambda rs: [r["id"] for r in rs]).to_torch_dataset()
    loader = DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(
        ConfigError,
        match=r"^collate test_records\.test_a_collate_pickle_cannot_send_to_a_spawned_worker_is_one_line\.<locals>\."
        r"<lambda> must be picklable to reach another process .* or multiprocessing_context='fork'$",
    ):
        next(iter(loader))


def test_loader_options_of_a_record_pipeline_are_refused_when_the_loader_is_made(two: Path):
    """A record batch's to_training takes no option: a text option (or a DataLoader's own argument) is refused as
    the loader is made, naming what a record pipeline does take — not at the first batch, in a worker."""
    pipe = records(two)
    with pytest.raises(
        ConfigError,
        match=r"^to_torch_dataset\(\) options must be none for a record pipeline, got "
        r"return_labels=True — shape the batch in map_transform or \.batch\(collate=fn\)$",
    ):
        pipe.to_torch_dataset(return_labels=True)
    with pytest.raises(
        ConfigError,
        match=r"^dataloader\(\) options must be DataLoader settings it passes on "
        r"\(num_workers, .*\) for a record pipeline, got batch_size=8 — the microbatch is \.batch",
    ):
        pipe.dataloader(num_workers=1, batch_size=8)


def test_seeded_transforms_draw_the_same_numbers_after_resume_and_at_any_dp_size(two: Path):
    def crop(record: dict, rng: np.random.Generator) -> dict:
        return {**record, "crop": int(rng.integers(0, 1000))}

    def by_position(pipes: list[Pipeline]) -> dict[int, int]:
        return {
            p: c
            for pipe in pipes
            for batch in pipe
            for p, c in zip(batch.positions.tolist(), batch.data["crop"].tolist() if len(batch) else [], strict=True)
        }

    one = by_position([records(two).map_transform(crop, seeded=True)])
    assert sorted(one) == list(range(18)) and len(set(one.values())) > 10  # random, not constant
    assert by_position([records(two, rank=r, size=4, b=1).map_transform(crop, seeded=True) for r in range(4)]) == one
    pipe = records(two).map_transform(crop, seeded=True)
    it = iter(pipe)
    next(it), next(it), next(it)
    resumed = records(two).map_transform(crop, seeded=True)
    resumed.load_state_dict(pipe.state_dict())
    assert by_position([resumed]) == {p: c for p, c in one.items() if p >= 6}
    with pytest.raises(ConfigError, match="seeded=True. must run in a record pipeline"):
        records(two).map_transform(crop, seeded=True).tokenize(tokenizer_id="x").pack_flat(max_length=8).executor_spec()


def test_the_provenance_log_of_a_record_run_passes_zephon_audit(two: Path, tmp_path: Path):
    from zephon.cli import cli

    log = tmp_path / "log"
    for r in range(2):
        pipe = records(two, rank=r, size=2, b=1).map_transform(lambda x: None if x["label"] == 3 else x)
        list(pipe.options(provenance_dir=str(log)))
    check = check_log(two, log)
    dropped = sum(i.endswith("-0-3") for i in planned_ids(two))  # label 3: row 3 of shard 0
    assert check.ok, check.mismatches
    assert (check.unit, check.pieces, check.skipped) == ("records", 18 - dropped, {"dropped": dropped})
    result = CliRunner().invoke(cli, ["audit", str(two), "--log", str(log)])
    assert result.exit_code == 0, result.output
    assert "ok: the log matches the plan" in result.output and "records" in result.output


def test_record_batches_through_a_dataloader_with_workers_keep_the_order(two: Path):
    from torch.utils.data import DataLoader

    want = [i for batch in records(two) for i in batch.data.get("id", [])]
    ds = records(two).to_torch_dataset()
    got = [i for data in DataLoader(ds, batch_size=None, num_workers=2) for i in data.get("id", [])]
    assert got == want


def test_a_hugging_face_image_column_arrives_as_its_bytes_and_path(tmp_path: Path):
    folder = tmp_path / "img"
    folder.mkdir()
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    column = pa.array([{"bytes": bytes([i]) * 3, "path": f"{i}.jpg"} for i in range(4)], type=image)
    pq.write_table(pa.table({"image": column, "label": list(range(4))}), folder / "part-0.parquet")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("img", str(folder))], mixture=MixtureSpec({"img": 1.0}), seed=1
    )
    plan = source.plan(tmp_path / "plan")
    batch = next(iter(Pipeline.from_plan(plan).batch(microbatch_size=4)))
    rows = pq.read_table(plan / "samples.parquet").column("row").to_pylist()
    assert batch.data["image"] == {"bytes": [bytes([r]) * 3 for r in rows], "path": [f"{r}.jpg" for r in rows]}
    assert batch.data["label"].tolist() == rows


def test_after_an_error_the_state_is_the_last_batchs_and_the_next_iteration_resumes_there(two: Path):
    """A record batch counted as handed out before its records were read and collated: an operator's error left
    ``state_dict()`` one microbatch ahead, and a retry from it skipped that microbatch."""
    def boom(record: dict) -> dict:
        if record["id"] == "a-1-4":
            raise ValueError("bad record")
        return record

    want = [list(batch.data.get("id", [])) for batch in records(two)]
    pipe = records(two).map_transform(boom)
    got, last = [], None
    with pytest.raises(DatasetError, match="bad record"):
        for batch in pipe:
            got.append(list(batch.data.get("id", [])))
            last = pipe.state_dict()
    assert got and got == want[: len(got)] and pipe.state_dict() == last
    with pytest.raises(DatasetError, match="bad record"):
        for batch in pipe:  # resumed: the same record fails again, nothing handed out twice
            pytest.fail(f"a batch before the failing one came again: {list(batch.data['id'])}")
