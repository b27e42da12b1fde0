"""The loaders and plain datasets made from one pipeline: a state loaded into the pipeline reaches them, and the
pipeline's ``state_dict()`` refuses a position it cannot see.

Why: ``pipeline.dataloader()`` and ``pipeline.to_torch_dataset()`` take the pipeline's loaded state when they are
made. A framework that builds its loader first and restores its checkpoint into the pipeline afterwards
(Accelerate's ``prepare`` then ``load_state`` over ``DataCheckpoint(pipeline)``, a DCP load after the loader was
built) loaded a state nobody took: the loader started at step 0, and ``state_dict()`` went on returning the loaded
state while training moved on — every later checkpoint named a position the model never trained at. And a plain
DataLoader's workers iterate copies of the pipeline in their own processes, so the pipeline never saw where they
stood: its ``state_dict()`` said step 0, and a resume trained the data again from the start.

Algorithm: ``Followers`` keeps weak references to the loaders and datasets made from the pipeline.

* ``load(state)`` (``Pipeline.load_state_dict``, after the state is validated): every loader takes the state as
  if it had been loaded into the loader (``PipelineLoader.adopt``: its next iteration starts there, and an
  iteration under way ends at its next batch, as ``loader.load_state_dict`` does); being the pipeline's loaded
  state, its first iteration also clears the pipeline's, so it is applied once. A dataset not iterated yet takes
  it as its first epoch's. A dataset that has iterated refuses in one line: its DataLoader's workers (persistent
  ones included) hold the state they were started with, and would not follow.
* ``seen()`` records how often the datasets have been iterated in DataLoader workers (counted in memory shared
  with them, and kept after a dataset is dropped: a DataLoader made inline for one epoch), at every iteration the
  pipeline can see (its own, a loader's, a dataset's in this process) and every load; ``check_visible()``
  (``Pipeline.state_dict``) refuses in one line once a dataset has been iterated in workers since.

Invariant: ``Pipeline.state_dict()`` returns where the next iteration starts (a loaded state) or where the latest
iteration it can see stands — never a state that a loader or dataset made before the load bypassed, and never the
start of the plan while workers it cannot see have moved on.

Example: ``loader = pipe.dataloader(num_workers=2)``, then ``DataCheckpoint(pipe).load_state_dict(saved)``: the
loader's first batch is the saved state's next microbatch, and ``pipe.state_dict()`` follows the loader from then
on. ``DataLoader(pipe.to_torch_dataset(), num_workers=2)`` iterated, then ``pipe.state_dict()``: refused, naming
``pipeline.dataloader()``, whose state follows its workers.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from zephon.errors import ConfigError


class Loader(Protocol):
    def adopt(self, state: dict[str, Any]) -> None: ...


class Counter(Protocol):
    value: int


class Dataset(Protocol):
    #: Iterations started, in this process or a DataLoader worker (``zephon.torch_data``).
    @property
    def iterations(self) -> int: ...

    #: Iterations started in DataLoader workers, in memory shared with them.
    in_workers: Counter
    state: dict[str, Any] | None


class Followers:
    """The loaders and datasets made from one pipeline (see the module docstring)."""

    def __init__(self) -> None:
        self.loaders: weakref.WeakSet[Any] = weakref.WeakSet()
        self.datasets: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Every dataset's worker iterations, kept past the dataset (its DataLoader dropped after an epoch).
        self._counters: list[Counter] = []
        self._seen = 0  # the datasets' worker iterations at the latest iteration or load the pipeline saw

    def add_dataset(self, dataset: Dataset) -> None:
        self.datasets.add(dataset)
        self._counters.append(dataset.in_workers)

    def load(self, state: dict[str, Any]) -> None:
        """Hand a state just loaded into the pipeline to what was made from it (refused: a dataset that iterated)."""
        datasets: list[Dataset] = list(self.datasets)
        if any(dataset.iterations for dataset in datasets):
            raise ConfigError(
                "pipeline.load_state_dict() must come before the to_torch_dataset() made from this pipeline "
                "iterates, got one that has iterated (its DataLoader's workers keep the state they started with) — "
                "load the state first, then make to_torch_dataset() and its DataLoader"
            )
        for dataset in datasets:
            dataset.state = state
        for loader in list(self.loaders):
            loader.adopt(state)
        self.seen()

    def seen(self) -> None:
        """The pipeline sees where its data stands now (an iteration of its own or a loader's began, a load)."""
        self._seen = self._worker_iterations()

    def check_visible(self) -> None:
        """Refuse ``state_dict()`` when a dataset was iterated in DataLoader workers since the pipeline last saw."""
        if self._worker_iterations() > self._seen:
            raise ConfigError(
                "pipeline.state_dict() must follow an iteration it can see, got a to_torch_dataset() iterated by "
                "DataLoader workers, whose positions stay in their processes (and run ahead of training) — "
                "checkpoint pipeline.dataloader() or zephon.integrations.torchdata.stateful_loader(), whose state "
                "follows what was handed out (docs/training.md)"
            )

    def _worker_iterations(self) -> int:
        return sum(counter.value for counter in self._counters)
