"""``Pipeline.to_torch_dataset()``: the pipeline as a ``torch.utils.data.IterableDataset``.

With ``DataLoader(ds, batch_size=None, num_workers=N)`` worker ``w`` yields this rank's microbatches
``w, w + N, w + 2N, …`` and the DataLoader, which fetches from its workers in turn, hands them out in the
pipeline's order: ``num_workers`` never changes the data. For an exact plan a worker builds only its own
microbatches; for an estimated plan each worker packs the rank's lanes (packing is sequential) and keeps
every N-th microbatch, so workers parallelize batch assembly and reading, not tokenization.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.executor.batch import Batch

#: Makes the runner of one DataLoader worker, given ``(worker_id, num_workers)``: ``Pipeline._make_runner``.
RunnerFactory = Callable[[tuple[int, int]], Iterable[Batch]]


class PipelineDataset(IterableDataset):
    """Yields ``batch.to_training(**training)`` for this rank's microbatches (see the module docstring)."""

    def __init__(self, make_runner: RunnerFactory, training: dict[str, Any]) -> None:
        super().__init__()
        self.make_runner = make_runner
        self.training = training

    def __iter__(self) -> Iterator[dict[str, torch.Tensor | int]]:
        info = get_worker_info()
        worker = (info.id, info.num_workers) if info is not None else (0, 1)
        runner = self.make_runner(worker)
        for batch in runner:
            yield batch.to_training(**self.training)
