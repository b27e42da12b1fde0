"""DataLoader workers: the same batches for every worker count, start method, persistence and pinning, exact
resumes, and — through ``Pipeline.dataloader`` — every document tokenized by one worker only."""

from __future__ import annotations

import os
import threading
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zephon import Pipeline
from zephon.errors import ConfigError
from zephon.executor.geometry import Geometry
from zephon.executor.worker_share import check_loader_workers, disjoint, loader_pieces, worker_lanes, worker_share
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation
from zephon.worker_slots import MAX_GROUP

MAX_LENGTH = 129
GLOBAL = 8
#: Every output ``to_training`` can give: the joined pieces must match each of them.
TRAINING: dict[str, bool] = {
    "return_position_ids": True,
    "return_cu_seqlens": True,
    "return_attention_mask": True,
    "return_num_valid_tokens": True,
    "return_loss_mask": True,
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """An estimated plan (one lane per row of the global batch) and an exact plan over a slice of the demo corpus.

    With ``ZEPHON_TEST_PLANS_DIR`` set, the demo data and both plans are written there and reused by later sessions:
    how this module runs on a machine without the planner's libraries (an accelerator's, for the pinned checks) —
    write them on a machine with the planner, copy the directory to the same path there."""
    from zephon.demo import write_demo_dataset

    given = os.environ.get("ZEPHON_TEST_PLANS_DIR")
    root = Path(given) if given else tmp_path_factory.mktemp("workers")
    if given and all((root / kind / "plan.json").is_file() for kind in ("estimated", "exact")):
        return {kind: root / kind for kind in ("estimated", "exact")}
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    write_demo_dataset(root / "data")
    datasets = [
        Dataset.from_path("code", str(root / "data" / "demo" / "code-*.parquet")),
        Dataset.from_path("short", str(root / "data" / "demo" / "short-*.parquet")),
    ]
    out = {}
    for kind, exact in (("estimated", False), ("exact", True)):
        src = StaticMixtureWorkSource(
            datasets=datasets,
            mixture=MixtureSpec({"code": 0.7, "short": 0.3}),
            seed=11,
            token_estimation=TokenEstimation(calibration_samples=64),
            exact_tokens=exact,
            num_tokens=80_000,  # several 4096-unit deals per lane: every lane holds documents
        )
        tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
        out[kind] = src.plan(root / kind, tokenize=tok, pack=PackSpec(max_length=MAX_LENGTH))
    return out


def pipeline(plan: Path, tokenizer_dir: str, micro: int) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=micro, global_batch_size=GLOBAL)
    )


Tensors = dict[str, Any]


def same(got: list[Tensors], want: list[Tensors]) -> bool:
    """Byte-identical: the same keys, dtypes, shapes and values, batch by batch."""

    def equal(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        return type(a) is type(b) and a == b

    return len(got) == len(want) and all(
        g.keys() == w.keys() and all(equal(g[k], w[k]) for k in w) for g, w in zip(got, want, strict=True)
    )


def reference(p: Pipeline) -> list[Tensors]:
    return [b.to_training(**TRAINING) for b in p]


# -- the partition ----------------------------------------------------------------------------------------------


def test_the_worked_example_of_the_partition() -> None:
    # G = 8, B = 4 (A = 2), L = 8: row i of index a is lane 4a + i (executor/worker_share.py's docstring).
    g = Geometry(microbatch=4, global_batch=8, dp_size=1, dp_rank=0, lanes=8)

    def lanes(owned: np.ndarray) -> list[list[int]]:
        return [np.flatnonzero(row).tolist() for row in owned]

    assert lanes(worker_lanes(g, workers=2, pieces=1)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lanes(worker_lanes(g, workers=3, pieces=1)) == [list(range(8))] * 3  # to_torch_dataset repeats work
    assert loader_pieces(2, 3) == 3 and lanes(worker_lanes(g, workers=3, pieces=3)) == [[0, 4], [1, 5], [2, 3, 6, 7]]
    assert loader_pieces(2, 4) == 2 and lanes(worker_lanes(g, workers=4, pieces=2)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    share = worker_share(g, worker=2, workers=3, pieces=3, first=0)
    assert [share.rows(m) for m in range(4)] == [(2, 4)] * 4  # piece 2 of every microbatch: rows 2-3


def test_a_rank_of_two_splits_its_lanes_among_its_workers() -> None:
    # dp_rank 1 of 2, G = 8, B = 4 (A = 1): the rank's lanes are 1, 3, 5, 7 (rows 0-3 of its microbatch).
    g = Geometry(microbatch=4, global_batch=8, dp_size=2, dp_rank=1, lanes=8)
    owned = worker_lanes(g, workers=2, pieces=loader_pieces(1, 2))
    assert [np.flatnonzero(row).tolist() for row in owned] == [[1, 3], [5, 7]] and disjoint(owned)


def test_a_resumed_iteration_relabels_workers_but_keeps_lanes_disjoint() -> None:
    g = Geometry(microbatch=2, global_batch=8, dp_size=1, dp_rank=0, lanes=8)  # A = 4
    for first in range(5):
        for workers in (2, 4):
            assert disjoint(worker_lanes(g, workers=workers, pieces=1, first=first))
    share = worker_share(g, worker=0, workers=2, pieces=1, first=3)
    assert [m for m in range(3, 9) if share.rows(m) is not None] == [3, 5, 7]  # item 0 is microbatch 3


def test_more_workers_than_lanes_is_refused_in_one_line() -> None:
    g = Geometry(microbatch=4, global_batch=4, dp_size=1, dp_rank=0, lanes=4)
    with pytest.raises(ConfigError, match=r"rank's 4 packing lanes .*got 5 — use num_workers in \[1, 2, 3, 4\]"):
        check_loader_workers(g, 5)
    g = Geometry(microbatch=2, global_batch=8, dp_size=1, dp_rank=0, lanes=8)  # A = 4: 3 pieces of 2 rows
    with pytest.raises(ConfigError, match=r"got 3 — use num_workers in \[1, 2, 4, 8\]"):
        check_loader_workers(g, 3)


def test_a_bad_read_ahead_setting_is_refused_by_the_loader_not_inside_a_worker(plans, tokenizer_dir, monkeypatch):
    """Workers read ahead (``ZEPHON_READ_AHEAD=auto`` turns the thread on in each of several workers): a bad value
    is the setting's own one line from the loader's process, not a worker's error wrapped in its traceback."""
    monkeypatch.setenv("ZEPHON_READ_AHEAD", "sometimes")
    loader = pipeline(plans["estimated"], tokenizer_dir, 8).dataloader(num_workers=2, **TRAINING)
    with pytest.raises(ConfigError, match=r'^ZEPHON_READ_AHEAD must be "auto", "on" or "off", got \'sometimes\'$'):
        next(iter(loader))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_workers": -1}, r"^num_workers must be an integer ≥ 0, got -1 — pass 0, 1, 2, …$"),
        ({"persistent_workers": True}, r"^persistent_workers must go with num_workers ≥ 1, got num_workers=0 — "),
        (
            {"num_workers": 2, "prefetch_factor": 0},
            r"^prefetch_factor must be an integer ≥ 1 \(items each worker builds ahead\), got 0 — pass 1, 2, … or "
            r"leave it unset \(torch's default, 2\)$",
        ),
        ({"prefetch_factor": 2}, r"^prefetch_factor must go with num_workers ≥ 1, got num_workers=0 — drop one"),
        ({"num_workers": 2, "timeout": -1}, r"^timeout must be a number of seconds ≥ 0, got -1 — pass 0 to wait"),
        ({"pin_memory": "false"}, r"^pin_memory must be True or False, got 'false' \(str\) — pass a boolean$"),
        ({"num_workers": 2, "persistent_workers": "no"}, r"^persistent_workers must be True or False, got 'no'"),
        (
            {"num_workers": 2, "multiprocessing_context": "nope"},
            r"^multiprocessing_context must be a start method of this platform \(.*fork.*\) or a context, got "
            r"'nope' — pass one of those$",
        ),
    ],
)
def test_bad_loader_options_are_refused_in_one_line_before_any_worker_starts(options, message) -> None:
    """(Switches: a quoted "false" is true to Python — it pinned memory or kept workers.)"""
    from zephon.loader_options import LoaderOptions

    with pytest.raises(ConfigError, match=message):
        LoaderOptions(**options)


@pytest.mark.parametrize(
    ("training", "fix"),
    [
        ({"batch_size": 8}, r"the microbatch is \.batch\(microbatch_size=\.\.\.\)"),
        ({"shuffle": True}, r"the plan fixes the order \(its seed shuffles it\)"),
        ({"collate_fn": print}, r"to_training builds the dict \(its return_\* options\); a record pipeline takes"),
        ({"drop_last": True}, r"drop the plan's last, incomplete step with \.batch\(drop_last=True\)"),
        ({"return_lables": True}, r"drop it or fix its name"),
    ],
)
def test_a_dataloader_argument_the_loader_does_not_take_is_one_line_naming_what_does(plans, tokenizer_dir, training, fix):
    """torch's DataLoader arguments, passed by habit, and misspelt to_training options are refused when the loader
    is made — not as to_training's TypeError at the first batch (in a worker: its traceback)."""
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    key, value = next(iter(training.items()))
    with pytest.raises(
        ConfigError,
        match=r"^dataloader\(\) options must be DataLoader settings it passes on \(num_workers, pin_memory, "
        r"persistent_workers, prefetch_factor, multiprocessing_context, timeout\) or to_training options "
        rf"\(return_labels, .*, ids_dtype\), got {key}={value!r} — {fix}",
    ):
        p.dataloader(num_workers=2, **training)
    with pytest.raises(ConfigError, match=rf"^to_torch_dataset\(\) options must be to_training options \(.*\), got {key}="):
        p.to_torch_dataset(**training)


def test_to_training_switches_must_be_booleans(plans, tokenizer_dir) -> None:
    """``return_labels="no"`` is true to Python: the labels came anyway, in every batch."""
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    with pytest.raises(ConfigError, match=r"^return_labels must be True or False, got 'no' \(str\) — pass a boolean$"):
        p.dataloader(return_labels="no")
    with pytest.raises(ConfigError, match=r"^return_position_ids must be True or False, got 1 \(int\)"):
        p.to_torch_dataset(return_position_ids=1)
    batch = next(iter(p))
    with pytest.raises(ConfigError, match=r"^return_cu_seqlens must be True or False, got 'false' \(str\)"):
        batch.to_training(return_cu_seqlens="false")
    with pytest.raises(ConfigError, match=r"^ignore_document_boundaries must be True or False \(or None\), got 'x'"):
        batch.to_training(ignore_document_boundaries="x")
    assert set(batch.to_training(return_labels=np.bool_(False))) == {"input_ids"}  # NumPy booleans are booleans


def test_an_ids_dtype_that_is_not_a_torch_dtype_is_one_line(plans, tokenizer_dir) -> None:
    """A string reached torch as a device name ("Invalid device string: 'int32'")."""
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    message = r"^ids_dtype must be a torch dtype, got 'int32' — pass e\.g\. torch\.int32 or torch\.int64$"
    with pytest.raises(ConfigError, match=message):
        p.dataloader(ids_dtype="int32")
    with pytest.raises(ConfigError, match=message):
        next(iter(p)).to_training(ids_dtype="int32")
    assert next(iter(p.dataloader(ids_dtype=torch.int32)))["input_ids"].dtype == torch.int32


# -- Pipeline.dataloader: the pipeline's batches, whatever the workers ------------------------------------------


@pytest.mark.parametrize("micro", [8, 4], ids=["A=1", "A=2"])
@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_dataloader_gives_the_pipelines_batches_for_0_1_2_3_workers(plans, tokenizer_dir, kind, micro) -> None:
    p = pipeline(plans[kind], tokenizer_dir, micro)
    want = reference(p)
    assert len(want) > 10
    for workers in (0, 1, 2, 3):
        loader = p.dataloader(num_workers=workers, **TRAINING)
        assert same(list(loader), want), f"{workers} workers"
        # Every piece from a worker crossed through its worker's slot ring, none pickled (zephon.worker_slots),
        # MAX_GROUP pieces to a DataLoader item (small pieces; ~100 microbatches: full groups, then each worker's
        # last one cut short at the end of the run, put in order too).
        assert loader.handover == {"slots": len(want) * loader.pieces if workers else 0, "pickled": 0}
        assert workers == 0 or loader._dataset.group == MAX_GROUP  # type: ignore[union-attr]
    pieces = p.dataloader(num_workers=3).pieces
    assert pieces == (1 if kind == "exact" else 3)  # N / gcd(N, A): 3 for A = 1 and A = 2


def test_dataloader_with_spawned_workers_gives_the_same_batches(plans, tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setattr("zephon.loader_shutdown.FEEDER_WAIT_S", 60.0)  # a loaded CI machine: waits, never cut short
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    loader = p.dataloader(num_workers=2, multiprocessing_context="spawn", return_position_ids=True)
    want = [b.to_training(return_position_ids=True) for b in p]
    before = set(threading.enumerate())
    assert same(list(loader), want)
    # Its queues' feeder threads are gone once the iteration has ended: one still freeing its semaphores as a
    # script exits makes Python print a "leaked semaphore" warning (zephon.loader_shutdown).
    assert [t.name for t in set(threading.enumerate()) - before if t.name == "QueueFeederThread"] == []
    assert loader.handover == {"slots": 2 * len(want), "pickled": 0}  # the rings crossed to a spawned process
    lone = p.dataloader(num_workers=1, multiprocessing_context="spawn", return_position_ids=True)
    assert same(list(lone), want)  # a spawned lone worker maps the loader's published row groups by path
    assert lone._published is None and lone.handover == {"slots": len(want), "pickled": 0}


def test_persistent_workers_give_the_same_batches_every_epoch(plans, tokenizer_dir) -> None:
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    want = reference(p)
    loader = p.dataloader(num_workers=2, persistent_workers=True, **TRAINING)
    assert same(list(loader), want)
    assert same(list(loader), want)  # the same worker processes, the plan from its start again
    assert loader.handover == {"slots": 2 * len(want), "pickled": 0}  # a new ring for each worker's new iteration
    lone = p.dataloader(num_workers=1, persistent_workers=True, **TRAINING)
    assert same(list(lone), want) and same(list(lone), want)  # the start-up share in the first epoch only


def test_pin_memory_gives_the_same_batches(plans, tokenizer_dir) -> None:
    """Every way a batch reaches the caller, pinned: whole microbatches pinned by the DataLoader's thread (0 and 1
    workers), joined pieces and pieces read out of shared-memory slots pinned by the loader (2 workers), again
    from persistent workers; with an accelerator also spawned workers and the copy to the device. Without one,
    torch warns that pinning is off and the batches are the same (the pinned checks run on a GPU machine)."""
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    want = reference(p)
    accelerator = torch.accelerator.is_available()
    settings: list[dict[str, Any]] = [{"num_workers": 0}, {"num_workers": 1}, {"num_workers": 2}]
    if accelerator:
        settings += [{"num_workers": 2, "multiprocessing_context": "spawn"}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no accelerator here: torch warns that pinning is off
        for setting in [*settings, {"num_workers": 2, "persistent_workers": True}]:
            loader = p.dataloader(pin_memory=True, **setting, **TRAINING)
            for _ in range(2 if setting.get("persistent_workers") else 1):
                got = list(loader)
                assert same(got, want), setting
                assert loader.handover["pickled"] == 0, setting
                if accelerator:
                    assert all(t.is_pinned() for b in got for t in b.values() if isinstance(t, torch.Tensor)), setting
    if accelerator:  # a pinned batch copied without blocking arrives whole
        device = torch.accelerator.current_accelerator()
        def move(b: Tensors, to: Any) -> Tensors:
            return {k: t.to(to, non_blocking=True) if isinstance(t, torch.Tensor) else t for k, t in b.items()}

        moved = [move(b, device) for b in got]
        torch.accelerator.synchronize()
        assert same([move(b, "cpu") for b in moved], want)


def test_without_room_in_shared_memory_the_pieces_cross_pickled_and_the_batches_are_the_same(
    plans, tokenizer_dir, monkeypatch
) -> None:
    from zephon import worker_slots

    monkeypatch.setattr(worker_slots, "shm_free", lambda: 0)  # the forked workers see it too
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    want = reference(p)
    loader = p.dataloader(num_workers=2, **TRAINING)
    assert same(list(loader), want)
    assert loader.handover == {"slots": 0, "pickled": 2 * len(want)}


# -- resuming ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_the_loaders_state_resumes_exactly_with_any_workers(plans, tokenizer_dir, kind) -> None:
    p = pipeline(plans[kind], tokenizer_dir, 4)  # A = 2
    want = reference(p)
    direct = pipeline(plans[kind], tokenizer_dir, 4)
    states = [direct.state_dict() for _ in direct]  # after each microbatch
    loader = pipeline(plans[kind], tokenizer_dir, 4).dataloader(num_workers=2, **TRAINING)
    mine = [loader.state_dict() for _ in loader]
    assert mine == states  # the same state after every microbatch (tests/executor/test_state_identity.py)
    for k in (3, 8):  # mid-step (an odd microbatch) and at a step boundary
        for workers in (1, 2, 3):
            resumed = pipeline(plans[kind], tokenizer_dir, 4).dataloader(num_workers=workers, **TRAINING)
            resumed.load_state_dict(mine[k])
            assert same(list(resumed), want[k + 1 :]), f"state after {k}, {workers} workers"
            assert same(list(resumed), want)  # the next iteration starts at the beginning


def test_a_state_loaded_mid_run_with_persistent_workers_starts_new_workers(plans, tokenizer_dir) -> None:
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    want = reference(p)
    loader = p.dataloader(num_workers=2, persistent_workers=True, **TRAINING)
    got = []
    for batch in loader:
        got.append(batch)
        if len(got) == 5:
            state = loader.state_dict()
            break
    loader.load_state_dict(state)
    assert same(got + list(loader), want)


@pytest.mark.parametrize("kind", ["estimated", "exact"])
def test_to_torch_dataset_resumes_in_order_at_any_microbatch_with_0_to_3_workers(plans, tokenizer_dir, kind) -> None:
    p = pipeline(plans[kind], tokenizer_dir, 4)
    want = reference(p)
    direct = pipeline(plans[kind], tokenizer_dir, 4)
    it = iter(direct)
    next(it)
    state = direct.state_dict()  # after microbatch 0: the resumed run's first item is microbatch 1
    for workers in (0, 1, 2, 3):
        resumed = pipeline(plans[kind], tokenizer_dir, 4)
        resumed.load_state_dict(state)
        loader = torch.utils.data.DataLoader(resumed.to_torch_dataset(**TRAINING), batch_size=None, num_workers=workers)
        assert same(list(loader), want[1:]), f"{workers} workers"


# -- no document tokenized twice --------------------------------------------------------------------------------


def tokenized_per_process(p: Pipeline, folder: Path, make_loader, monkeypatch) -> dict[int, list[int]]:
    """The plan positions each process tokenized while iterating ``make_loader(p)``: the real encode stage
    (``Tokenize._encode``, which every document of an estimated run goes through) appends ``pid position`` to
    a file before encoding. Workers are forked, so they run it too; calibration encodes elsewhere."""
    from zephon.executor.estimated import Tokenize

    folder.mkdir(parents=True)
    log = folder / "tokenized.txt"
    encode = Tokenize._encode

    def counted(self, got, *, split):
        with open(log, "a") as out:
            out.write("".join(f"{os.getpid()} {got.chunk.start + k}\n" for k in got.keep.tolist()))
        return encode(self, got, split=split)

    with monkeypatch.context() as m:
        m.setattr(Tokenize, "_encode", counted)
        for _ in make_loader(p):
            pass
    done: dict[int, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        pid, position = line.split()
        done[int(pid)].append(int(position))
    return dict(done)


@pytest.mark.parametrize("micro", [8, 4, 2], ids=["A=1", "A=2", "A=4"])
def test_each_document_is_tokenized_by_one_worker_only(plans, tokenizer_dir, tmp_path, micro, monkeypatch) -> None:
    p = pipeline(plans["estimated"], tokenizer_dir, micro)
    p.num_steps()  # the calibration, once, here (a loader does it too)
    (alone,) = tokenized_per_process(p, tmp_path / "alone", lambda q: q.dataloader(), monkeypatch).values()
    assert sorted(alone) == list(range(p._fresh().plan.num_documents))  # the whole plan, each document once
    for workers in (2, 4):
        fork = {"num_workers": workers, "multiprocessing_context": "fork"}
        done = tokenized_per_process(p, tmp_path / f"w{workers}", lambda q, o=fork: q.dataloader(**o), monkeypatch)
        assert len(done) == workers and all(done.values())  # every worker tokenized, the main process nothing
        assert sorted(k for positions in done.values() for k in positions) == sorted(alone)  # each exactly once


def test_a_plain_dataloader_repeats_tokenizing_when_workers_do_not_divide_the_accumulation(
    plans, tokenizer_dir, tmp_path, monkeypatch
) -> None:
    # What Pipeline.dataloader avoids: A = 1, the two workers of to_torch_dataset() each tokenize every document.
    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    p.num_steps()

    def plain(q: Pipeline) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(q.to_torch_dataset(), batch_size=None, num_workers=2)

    first, second = tokenized_per_process(p, tmp_path / "plain", plain, monkeypatch).values()
    assert sorted(first) == sorted(second) == list(range(p._fresh().plan.num_documents))


# -- row groups decoded once for the rank's workers ----------------------------------------------------------------


def decoded_per_process(
    p: Pipeline, folder: Path, want: list[Tensors], monkeypatch, workers: int = 2
) -> dict[int, list[tuple[int, int]]]:
    """The (shard, row group) pairs each process decoded while a loader of ``workers`` ran (the real decode,
    ``ParquetShard.row_group``, logging ``pid shard group`` first); the loader's share directory is gone after."""
    from zephon.executor.read.parquet import ParquetShard

    folder.mkdir(parents=True)
    log = folder / "decoded.txt"
    decode = ParquetShard.row_group

    def counted(self, g):
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {self.ref.shard_id} {g}\n")
        return decode(self, g)

    with monkeypatch.context() as m:
        m.setattr(ParquetShard, "row_group", counted)
        loader = p.dataloader(num_workers=workers)
        got = list(loader)
        assert same(got, want)
        share = loader._dataset.row_groups  # type: ignore[union-attr]
        del loader, got
    assert share is None or not os.path.exists(share)  # removed with its loader
    done: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for line in log.read_text().splitlines() if log.exists() else []:
        pid, shard, group = map(int, line.split())
        done[pid].append((shard, group))  # this process (os.getpid()): the calibration, before the workers start
    return dict(done)


def test_two_workers_decode_each_row_group_once_between_them(plans, tokenizer_dir, tmp_path, monkeypatch) -> None:
    p = pipeline(plans["estimated"], tokenizer_dir, 8)  # A = 1: both workers read every shard of the plan
    want = [b.to_training() for b in p]
    monkeypatch.setenv("ZEPHON_SHARE_ROW_GROUPS", "off")
    alone = decoded_per_process(p, tmp_path / "off", want, monkeypatch)
    alone.pop(os.getpid())
    assert len(alone) == 2
    each = [sorted(set(v)) for v in alone.values()]
    assert each[0] == each[1]  # without a share every worker decodes every row group
    monkeypatch.setenv("ZEPHON_SHARE_ROW_GROUPS", "on")
    shared = decoded_per_process(p, tmp_path / "on", want, monkeypatch)
    calibrated = shared.pop(os.getpid())  # num_steps() here, published for the workers before they start
    assert calibrated  # (on this small plan it decodes every row group: the workers may decode none)
    total = [k for v in shared.values() for k in v]
    assert sorted(set(total) | set(calibrated)) == each[0]  # the same row groups, read
    # each decoded once in the rank: the calibration's mapped by the workers, not decoded again (a row group
    # forgotten and needed again, or one published after a worker's first item, is rare)
    assert len(total) + len(calibrated) <= len(each[0]) + 2, (shared, calibrated)
    assert len(set(total) & set(calibrated)) <= 2, (shared, calibrated)


def test_a_lone_worker_maps_the_calibrations_row_groups_and_publishes_nothing(
    plans, tokenizer_dir, tmp_path, monkeypatch
) -> None:
    """``num_workers=1``: the row groups ``num_steps()`` decoded in the loader are published for the worker's start
    as for more workers, so it does not decode them again; it publishes none of its own (nobody would map them)."""
    from zephon.executor.read.shared_groups import SharedRowGroups

    p = pipeline(plans["estimated"], tokenizer_dir, 8)
    want = [b.to_training() for b in p]
    monkeypatch.setenv("ZEPHON_SHARE_ROW_GROUPS", "off")
    off = decoded_per_process(p, tmp_path / "off", want, monkeypatch, workers=1)
    off.pop(os.getpid())
    (worker_off,) = off.values()  # without a share the worker decodes every row group the calibration did
    monkeypatch.setenv("ZEPHON_SHARE_ROW_GROUPS", "on")
    log = tmp_path / "published.txt"
    publish = SharedRowGroups.publish

    def recorded(self, shard_id, group, fd, column):
        with open(log, "a") as out:  # a file: the forked worker's appends to a list would stay in the worker
            out.write(f"{os.getpid()}\n")
        return publish(self, shard_id, group, fd, column)

    monkeypatch.setattr(SharedRowGroups, "publish", recorded)
    on = decoded_per_process(p, tmp_path / "on", want, monkeypatch, workers=1)
    calibrated = on.pop(os.getpid())
    assert calibrated and set(calibrated) <= set(worker_off)
    worker_on = [k for v in on.values() for k in v]
    assert not set(worker_on) & set(calibrated), (worker_on, calibrated)  # mapped, not decoded again
    assert sorted(set(worker_on) | set(calibrated)) == sorted(set(worker_off))  # the same row groups, read
    publishers = set(map(int, log.read_text().split()))
    assert publishers == {os.getpid()}  # the loader published (num_steps()'s row groups); the worker nothing


def test_the_calibrations_row_groups_are_unlinked_once_every_worker_has_started(plans, tokenizer_dir) -> None:
    """The loader publishes what ``num_steps()`` decoded for its workers' first reads and unlinks it once each
    worker has handed over its first piece, so ``/dev/shm`` does not hold the first shards for the whole run."""
    p = pipeline(plans["estimated"], tokenizer_dir, 8)  # A = 1, 2 workers: 2 pieces a microbatch
    loader = p.dataloader(num_workers=2, **TRAINING)
    if loader._torch_loader()[1].row_groups is None:
        pytest.skip("no writable /dev/shm here")
    published = loader._published
    assert published is not None and published.counts["decoded"] > 0
    paths = [path for files in published.written.values() for path in files]
    assert paths and all(os.path.exists(path) for path in paths)
    got = iter(loader)
    next(got)  # the first microbatch: one piece from each worker
    next(got)  # the second asks the workers again: every worker has started
    assert loader._published is None and not any(os.path.exists(path) for path in paths)
    assert same([*list(got)], reference(p)[2:])


def test_the_feeder_threads_of_a_shut_down_iterator_are_joined_and_a_running_ones_left_alone(monkeypatch) -> None:
    """``wait_for_feeders``: a spawn-context queue's feeder thread (what frees its named semaphores) is gone once
    it returns for an iterator torch shut down; an iterator still running (persistent workers) is not waited for."""
    import multiprocessing
    from types import SimpleNamespace

    from zephon.loader_shutdown import wait_for_feeders

    monkeypatch.setattr("zephon.loader_shutdown.FEEDER_WAIT_S", 60.0)  # a loaded CI machine: waits, never cut short
    queue = multiprocessing.get_context("spawn").Queue()
    queue.put(1)  # starts the feeder thread
    running = SimpleNamespace(_shutdown=False, _index_queues=[queue], _worker_result_queue=None)
    wait_for_feeders(running)
    assert queue._thread.is_alive()  # type: ignore[attr-defined]  # (open: it waits for more, never joined)
    queue.close()
    wait_for_feeders(SimpleNamespace(_shutdown=True, _index_queues=[queue], _worker_result_queue=None))
    assert not queue._thread.is_alive()  # type: ignore[attr-defined]
