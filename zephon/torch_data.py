"""``Pipeline.to_torch_dataset()``: the pipeline as a plain ``torch.utils.data.IterableDataset`` of whole microbatches.

An item is one microbatch's ``batch.to_training(**training)`` dict — never a fragment — so the documented
``DataLoader(ds, batch_size=None, num_workers=N)`` hands out exactly what iterating the pipeline does.
Worker ``w`` yields the microbatches ``w, w + N, w + 2N, …`` of the iteration (counted from where it starts,
a resumed state included) and the DataLoader, which fetches from its workers in turn, restores the
pipeline's order (``zephon.executor.worker_share`` with ``c = 1``). An exact plan's worker builds only its own
microbatches. An estimated plan's worker packs only the lanes of its own microbatches: when ``N`` divides the
gradient accumulation ``A`` those are disjoint (no document tokenized twice); otherwise — ``A = 1`` included —
every worker meets every lane and tokenizes it too, so workers speed up batch assembly but repeat the
tokenizing. ``Pipeline.dataloader(num_workers=N)`` (``zephon.torch_loader``) never repeats work: its workers
yield pieces of microbatches that it joins again.

A state loaded into the pipeline before ``to_torch_dataset()`` is the dataset's: its first epoch starts there,
later epochs at the plan's start (as iterating the pipeline again does). The workers of a DataLoader epoch are
forked (or spawned) anew from the main process each epoch, where the dataset never iterates, so iterations are
counted in shared memory, one counter per worker id (each written by its worker alone: no lock, which would tie
the counters to one multiprocessing context): a worker whose id has iterated before is in a later epoch.
Example: 2 workers, two epochs → worker 0 and 1 count 0 (from the state), then 1 and 1 (from the start).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.executor.batch import Batch
from zephon.executor.cores import share_cores
from zephon.training_options import check_training_options

#: Worker ids counted apart (a DataLoader of more workers counts ids modulo this).
WORKER_SLOTS = 1024

#: Makes the runner of one DataLoader worker, given the state it starts at and ``(worker_id, num_workers)``:
#: ``Pipeline._dataset_runner``.
RunnerFactory = Callable[[dict[str, Any] | None, tuple[int, int]], Iterable[Batch]]


class PipelineDataset(IterableDataset):
    """Yields ``batch.to_training(**training)`` for this rank's microbatches (see the module docstring)."""

    def __init__(
        self,
        make_runner: RunnerFactory,
        training: dict[str, Any],
        *,
        records: bool = False,
        state: dict[str, Any] | None = None,
    ) -> None:
        check_training_options(training, what="to_torch_dataset()", records=records)
        super().__init__()
        self.make_runner = make_runner
        self.training = training
        self.state = state
        self._iterations = multiprocessing.RawArray("q", WORKER_SLOTS)  # per worker id: its iterations started
        #: Iterations started in DataLoader workers, whose positions the pipeline cannot see (``zephon.followers``).
        self.in_workers = multiprocessing.RawValue("q", 0)

    @property
    def iterations(self) -> int:
        """Iterations started, here or in DataLoader workers (``zephon.followers``)."""
        return sum(self._iterations)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor | int]]:
        info = get_worker_info()
        worker = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            share_cores(info.num_workers)  # zephon.executor.cores: each worker's pools sized to its share
        slot = worker[0] % WORKER_SLOTS
        first_epoch = self._iterations[slot] == 0
        self._iterations[slot] += 1
        if info is not None:
            self.in_workers.value += 1  # unlocked: two workers' increments may count once, never zero times
        runner = self.make_runner(self.state if first_epoch else None, worker)
        for batch in runner:
            yield batch.to_training(**self.training)
