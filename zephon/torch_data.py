"""``Pipeline.to_torch_dataset()``: the pipeline as a ``torch.utils.data.IterableDataset``.

With ``DataLoader(ds, batch_size=None, num_workers=N)`` worker ``w`` yields this rank's microbatches
``w, w + N, w + 2N, …`` and the DataLoader, which fetches from its workers in turn, hands them out in the
pipeline's order: ``num_workers`` never changes the data. For an exact plan a worker builds only its own
microbatches; for an estimated plan each worker packs the rank's lanes (packing is sequential) and keeps
every N-th microbatch, so workers parallelize batch assembly and reading, not tokenization.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline


class PipelineDataset(IterableDataset):
    """Yields ``batch.to_training(**training)`` for this rank's microbatches (see the module docstring)."""

    def __init__(self, pipeline: Pipeline, training: dict[str, Any]) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.training = training

    def __iter__(self) -> Iterator[dict[str, torch.Tensor | int]]:
        info = get_worker_info()
        worker = (info.id, info.num_workers) if info is not None else (0, 1)
        runner = self.pipeline._make_runner(worker=worker)
        for batch in runner:
            yield batch.to_training(**self.training)
