"""Helpers the integration tests share: a small estimated plan's pipeline, and the data-parallel ranks a DCP
test starts with ``torch.multiprocessing.spawn`` (a module of its own, importable in a spawned process)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

MAX_LENGTH = 33
GLOBAL = 8


def make_plan(root: Path, tokenizer_dir: str, *, documents: int = 240, seed: int = 5) -> Path:
    """An estimated plan (one lane per row of the global batch) over a slice of the demo corpus."""
    from zephon.demo import write_demo_dataset
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    write_demo_dataset(root / "data")
    datasets = [
        Dataset.from_path(name, str(root / "data" / "demo" / f"{name}-*.parquet")) for name in ("code", "short")
    ]
    source = StaticMixtureWorkSource(
        datasets=datasets, mixture=MixtureSpec({"code": 0.6, "short": 0.4}), seed=seed, num_documents=documents
    )
    return source.plan(root / f"plan-{seed}")


def make_pipeline(plan: Path, tokenizer_dir: str, *, rank: int | None = None, size: int = 1):
    """Microbatches of ``GLOBAL / size`` rows (no accumulation); ``rank`` None: the identity of torch.distributed."""
    from zephon import Pipeline

    pipe = Pipeline.from_plan(plan)
    if rank is not None:
        pipe = pipe.options(dp_rank=rank, dp_size=size)
    world = size
    return (
        pipe.tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=GLOBAL // world, global_batch_size=GLOBAL)
    )


def global_rows(batches) -> dict[int, dict[int, bytes]]:
    """step → sequence id → the row's token bytes (up to its length), from ``Batch`` objects."""
    steps: dict[int, dict[int, bytes]] = {}
    for batch in batches:
        for i, j in enumerate(batch.sequences.tolist()):
            steps.setdefault(batch.step, {})[j] = batch.tokens[i, : batch.lengths[i]].tobytes()
    return steps


def uninterrupted_rows(plan: Path, tokenizer_dir: str) -> list[list[bytes]]:
    """Each global step's rows (``input_ids`` bytes + ``labels`` bytes) of an uninterrupted one-process run: what
    the ranks of a multi-process run must share out, step by step."""
    steps: list[list[bytes]] = []
    for tensors in make_pipeline(plan, tokenizer_dir).dataloader():
        ids, labels = tensors["input_ids"], tensors["labels"]
        steps.append([ids[i].numpy().tobytes() + labels[i].numpy().tobytes() for i in range(GLOBAL)])
    return steps


def dcp_rank(rank: int, world: int, mode: str, plan: str, tokenizer_dir: str, root: str, save_step: int) -> None:
    """One data-parallel rank under gloo: ``save`` runs ``save_step`` steps and saves the data state with DCP;
    ``load`` loads it at this world size and writes every row it yields after that to ``root/out-W/rank-R``."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["ZEPHON_READ_AHEAD"] = "off"
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from zephon.integrations.dcp import DataCheckpoint

    dist.init_process_group("gloo", init_method=f"file://{root}/pg-{mode}-{world}", rank=rank, world_size=world)
    try:
        pipeline = make_pipeline(Path(plan), tokenizer_dir, size=world)  # the rank from torch.distributed
        data = DataCheckpoint(pipeline)
        checkpoint = f"{root}/checkpoint"
        if mode == "save":
            for batch in pipeline:
                if batch.step == save_step - 1:
                    break  # A = 1: this microbatch ends step save_step - 1
            dcp.save({"data": data}, checkpoint_id=checkpoint)
        else:
            dcp.load({"data": data}, checkpoint_id=checkpoint)
            rows = global_rows(pipeline)
            out = Path(root) / f"out-{world}"
            out.mkdir(exist_ok=True)
            (out / f"rank-{rank}.pkl").write_bytes(pickle.dumps(rows))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port free on this machine now (for a process group's MASTER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_as_torchrun(fn, world: int, *args) -> None:
    """``fn(rank, world, *args)`` in ``world`` forked processes whose environment is what ``torchrun`` sets (RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), so a framework sees processes launched for it and spawns none;
    an exception in any rank fails the caller (torch.multiprocessing re-raises it)."""
    import torch.multiprocessing as mp

    mp.start_processes(_torchrun_rank, args=(fn, world, free_port(), args), nprocs=world, start_method="fork")


def _torchrun_rank(rank: int, fn, world: int, port: int, args: tuple) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RAYON_NUM_THREADS="1",
        ZEPHON_READ_AHEAD="off",
    )  # fmt: skip
    fn(rank, world, *args)
