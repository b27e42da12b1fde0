"""Train a tiny language model on 2 processes, checkpoint, resume on 1 process: identical losses.

    python examples/train_tiny.py [--workdir DIR] [--steps 6] [--checkpoint-at 3]

1. Plans the embedded demo corpus once (an estimated plan with 8 packing lanes).
2. Uninterrupted reference: one process runs all steps. It plays both data-parallel ranks of a 2-rank job
   (``Pipeline.options(dp_rank=r, dp_size=2)``) and averages their gradients, exactly as an all-reduce does.
3. Two processes (``torch.distributed``, gloo) run the first ``--checkpoint-at`` steps with a real
   all-reduce, then checkpoint: model, optimizer and ``pipeline.state_dict()`` (which gathers both ranks'
   packing-lane cursors, so rank 0's file alone can resume the job).
4. One process loads the checkpoint and runs the remaining steps.
5. The losses of 3 + 4 must equal those of 2, bit for bit; the script prints them and exits 1 otherwise.

Bitwise equality needs the same microbatches in the same roles, which the resumed process keeps by playing
the two ranks; the global batches themselves are the same for any data-parallel size (docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zephon import Pipeline
from zephon.demo import demo_dataset_paths, demo_tokenizer_path
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

VOCAB, WIDTH, MAX_LENGTH, MICRO, RANKS = 4096, 32, 129, 2, 2


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Linear(WIDTH, VOCAB))


def make_pipeline(plan: str, rank: int | None = None) -> Pipeline:
    p = Pipeline.from_plan(plan).tokenize(tokenizer_id=demo_tokenizer_path()).pack_flat(max_length=MAX_LENGTH)
    if rank is not None:
        p = p.options(dp_rank=rank, dp_size=RANKS)
    return p.batch(microbatch_size=MICRO, global_batch_size=MICRO * RANKS)


def microbatch_grads(model: torch.nn.Module, batch) -> tuple[float, list[torch.Tensor]]:
    t = batch.to_training(return_labels=True)
    model.zero_grad(set_to_none=True)
    logits = model(t["input_ids"])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), t["labels"].reshape(-1), ignore_index=-100)
    loss.backward()
    return loss.item(), [p.grad.detach().clone() for p in model.parameters()]


def apply(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grads: list[torch.Tensor]) -> None:
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g
    optimizer.step()


def single_process(plan: str, steps: range, checkpoint: str | None) -> list[float]:
    """Play both ranks in one process: per step, average the two ranks' gradients and losses."""
    torch.set_num_threads(1)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    pipelines = [make_pipeline(plan, rank) for rank in range(RANKS)]
    if checkpoint is not None:
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        for p in pipelines:
            p.load_state_dict(saved["pipeline"])
    iterators = [iter(p) for p in pipelines]
    losses = []
    for _ in steps:
        results = [microbatch_grads(model, next(it)) for it in iterators]
        summed = [a + b for a, b in zip(results[0][1], results[1][1], strict=True)]  # what all_reduce(SUM) gives
        apply(model, optimizer, [g / RANKS for g in summed])
        losses.append((results[0][0] + results[1][0]) / RANKS)
    return losses


def distributed_worker(rank: int, plan: str, steps: int, workdir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=RANKS)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    pipeline = make_pipeline(plan)  # rank and size come from torch.distributed
    it = iter(pipeline)
    losses = []
    for _ in range(steps):
        loss, grads = microbatch_grads(model, next(it))
        for g in grads:
            dist.all_reduce(g)  # SUM
        apply(model, optimizer, [g / RANKS for g in grads])
        total = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(total.item() / RANKS)
    state = pipeline.state_dict()  # a collective: gathers both ranks' lane cursors
    if rank == 0:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "pipeline": state},
            f"{workdir}/checkpoint.pt",
        )
        Path(f"{workdir}/distributed_losses.json").write_text(json.dumps(losses))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--checkpoint-at", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="zephon-train-tiny-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(workdir / "cache"))

    paths = demo_dataset_paths(workdir / "data")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(name, path) for name, path in paths.items()],
        mixture=MixtureSpec({"prose": 0.5, "code": 0.3, "short": 0.2}),
        seed=0,
    )
    plan = str(source.plan(workdir / "plan", overwrite=True))

    reference = single_process(plan, range(args.steps), None)
    mp.spawn(distributed_worker, args=(plan, args.checkpoint_at, str(workdir)), nprocs=RANKS, join=True)
    before = json.loads((workdir / "distributed_losses.json").read_text())
    after = single_process(plan, range(args.checkpoint_at, args.steps), str(workdir / "checkpoint.pt"))
    resumed = before + after
    print(json.dumps({"uninterrupted": reference, "two_processes_then_resumed": resumed}))
    if resumed != reference:
        print("losses differ", file=sys.stderr)
        return 1
    print(f"losses identical over {args.steps} steps (checkpoint after step {args.checkpoint_at})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
