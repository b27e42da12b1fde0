"""``Pipeline.dataloader()``: a rank's batches from DataLoader workers that never repeat work.

Workers own disjoint packing lanes. The default (estimated) plan has one lane per row of the global batch,
so row ``i`` of microbatch index ``a`` always comes from the same lane of the rank. With ``N`` workers and
``A`` microbatches per step, each microbatch travels as ``c = N / gcd(N, A)`` *pieces* of consecutive rows,
piece ``p`` of index ``a`` always built by worker ``((a − a₀)·c + p) mod N`` (``zephon.executor.worker_share``).
A worker reads and tokenizes only its lanes' documents, and yields a ``WorkerPiece``; a ``torch`` DataLoader
fetches the pieces from the workers strictly in turn, and the loader joins each microbatch's ``c`` pieces, in
order, into its ``to_training`` dict (``zephon.executor.batch.join_training``: one concatenation per tensor).
With ``N | A``, ``c = 1``: workers yield whole microbatches, nothing is joined. Exact plans fix every sequence,
so their workers always yield whole microbatches, each built once.

Invariant: the dicts are those of iterating the pipeline (``batch.to_training(**training)``), byte for byte,
for every ``num_workers``, start method, ``persistent_workers`` and ``pin_memory``; a worker count that would
make two workers pack one lane is refused in one line naming the counts that work.

Worked example: G = B = 4 (A = 1), one rank, 2 workers: c = 2; worker 0 packs lanes 0-1 and yields rows 0-1 of
every microbatch, worker 1 lanes 2-3 and rows 2-3; the DataLoader hands out worker 0's piece of microbatch 0,
worker 1's, worker 0's of microbatch 1, … and the loader concatenates each pair.

Hand-over: a worker writes each piece's tensors into a slot of a shared-memory ring of its own and sends only
where they lie; the loader copies them out (into the joined or page-locked tensors it hands out) and frees the
slot (``zephon.worker_slots``): no pipe carries the ids, ~0.5 ms of the loader's CPU saved per 400 KB piece.
With 2 or more workers they also decode each Parquet row group once between them, through a directory of
``/dev/shm`` this loader makes and removes (``zephon.executor.read.shared_groups``).

State: each piece carries its worker's state after it (its lanes' cursors); ``state_dict()`` merges them into
the rank's state after the last microbatch handed out — the state ``Pipeline.state_dict()`` gives after the
same batch — so a run resumes exactly, with any ``num_workers``.

Epochs: the first iteration starts where the pipeline (or ``load_state_dict``) says, later ones at the start
of the plan, as iterating a ``Pipeline`` again does. ``load_state_dict`` starts new workers (persistent ones
too).

Without workers and without ``pin_memory`` the loader takes the pieces from its dataset itself: a ``DataLoader``
would only hand them over, at some 100 µs a microbatch (``benchmarks/bench_integrations.py``) — and its
iteration starts on the runner ``num_steps()`` calibrated, if any (``zephon.run.KeptRunner``: the pipeline's, handed
to the loader when it is made), reading the shards that calibration decoded. With workers that runner is closed
once the steps are known: each worker reads its own shards.

``pin_memory``: with ``c = 1`` the DataLoader's pinning thread pins the pieces; with ``c > 1`` the loader
concatenates straight into page-locked buffers. Without an accelerator it does nothing (torch's warning).
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from zephon.executor.batch import Batch, join_training
from zephon.executor.cores import share_cores
from zephon.executor.read.ahead import read_ahead_enabled
from zephon.executor.read.shared_groups import SharedRowGroups, make_share_directory, remove_share_directory
from zephon.executor.runner import RankRunner
from zephon.executor.state import gather_states
from zephon.executor.worker_share import check_loader_workers
from zephon.loader_options import LoaderOptions
from zephon.worker_slots import SlotPiece, SlotReader, SlotWriter, group_size

#: A ``zephon.Pipeline`` (not imported: the pipeline imports this module, and no import may cycle).
Pipeline = Any
Tensors = dict[str, torch.Tensor | int]


@dataclass(kw_only=True, slots=True)  # not frozen: one is made per microbatch, and frozen costs ~1 µs more
class WorkerPiece:
    """What a worker hands the loader: its ``to_training`` dict of microbatch (``step``, ``microbatch``), as NumPy
    ``arrays`` (``tensors()`` gives the tensors back, sharing their memory), and the worker's ``state`` after it
    (``RankRunner.state``: its own lanes' cursors).

    A worker's piece crosses through its slot ring (``slotted``, ``zephon.worker_slots``): its tensors lie in a
    slot of shared memory, ``slot`` says where, and ``arrays`` is None. Where a slot will not do (a collate's list,
    a piece larger than a slot) the piece crosses pickled, as NumPy arrays (``of``), not tensors: the DataLoader
    would move each tensor through a shared-memory file of its own (about a millisecond per tensor on a small
    machine), while an array is pickled into the queue's pipe with its bytes. A piece made in the loader's own
    process (no workers) keeps its tensors as they are (``local``, ``in_process``): nothing crosses a process. A
    record batch whose data is not a dict (a collate of one's own returning a list) crosses as it is, pickled."""

    arrays: dict[str, np.ndarray | torch.Tensor | int] | Any
    step: int
    microbatch: int
    state: dict[str, Any]
    in_process: bool = False
    slot: SlotPiece | None = None

    @classmethod
    def of(cls, tensors: Tensors, *, step: int, microbatch: int, state: dict[str, Any]) -> WorkerPiece:
        if not isinstance(tensors, dict):
            return cls(arrays=tensors, step=step, microbatch=microbatch, state=state)
        arrays = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
        return cls(arrays=arrays, step=step, microbatch=microbatch, state=state)

    @classmethod
    def local(cls, tensors: Tensors, *, step: int, microbatch: int, state: dict[str, Any]) -> WorkerPiece:
        return cls(arrays=tensors, step=step, microbatch=microbatch, state=state, in_process=True)

    @classmethod
    def slotted(cls, writer: SlotWriter) -> Any:
        """The piece maker of a worker with a slot ring: tensors written into the ring's next slot
        (``zephon.worker_slots``), or pickled as ``of`` makes them where a slot will not do."""

        def make(tensors: Tensors, *, step: int, microbatch: int, state: dict[str, Any]) -> WorkerPiece:
            slot = writer.put(tensors)
            if slot is None:
                if isinstance(tensors, dict):  # written into a slot the next piece reuses: copied out first
                    tensors = {k: v.clone() if writer.owns(v) else v for k, v in tensors.items()}
                return cls.of(tensors, step=step, microbatch=microbatch, state=state)
            return cls(arrays=None, step=step, microbatch=microbatch, state=state, slot=slot)

        return make

    def tensors(self) -> Tensors:
        assert self.slot is None, "a slot piece is read by the loader's SlotReader"
        if self.in_process or not isinstance(self.arrays, dict):
            return self.arrays  # type: ignore[no-any-return]
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in self.arrays.items()}

    def pin_memory(self) -> WorkerPiece:
        """The DataLoader's pinning thread calls this (``torch.utils.data._utils.pin_memory``): the arrays are
        copied into page-locked memory (``tensors()`` then shares it); data that is not a dict is left as it is,
        and so is a slot piece (the loader copies it out of its slot into page-locked tensors)."""
        if self.slot is not None or not isinstance(self.arrays, dict):
            return self
        pinned = {
            k: torch.from_numpy(v).pin_memory().numpy()
            if isinstance(v, np.ndarray)
            else v.pin_memory()
            if isinstance(v, torch.Tensor)
            else v
            for k, v in self.arrays.items()
        }
        return replace(self, arrays=pinned)


@dataclass(frozen=True, kw_only=True, slots=True)
class PieceGroup:
    """What a worker yields as one DataLoader item: its next ``pieces``, in order (``zephon.worker_slots``:
    grouped to spread the DataLoader's cost per item), and its index ``worker``."""

    worker: int
    pieces: tuple[WorkerPiece, ...]

    def pin_memory(self) -> PieceGroup:
        """The DataLoader's pinning thread calls this: each piece pinned (``WorkerPiece.pin_memory``)."""
        return replace(self, pieces=tuple(p.pin_memory() for p in self.pieces))


def in_order(groups: Iterator[PieceGroup], workers: int) -> Iterator[WorkerPiece]:
    """The pieces of an iteration in order, from the groups its ``workers`` yield: piece ``k`` is the next of
    worker ``k mod workers`` (``zephon.executor.worker_share``), whatever order the groups come in. It ends
    where the next piece's worker has none left: then every worker is done."""
    queues: list[deque[WorkerPiece]] = [deque() for _ in range(workers)]
    for k in itertools.count():
        queue = queues[k % workers]
        while not queue:
            group = next(groups, None)
            if group is None:
                return
            queues[group.worker].extend(group.pieces)
        yield queue.popleft()


class PieceDataset(IterableDataset):
    """Each worker's pieces (``pieces`` per microbatch); the first iteration in a process starts at ``state``,
    later ones at the start of the plan. ``pipeline`` is the loader's own copy."""

    def __init__(
        self,
        pipeline: Pipeline,
        training: dict[str, Any],
        pieces: int,
        state: dict[str, Any] | None,
        *,
        in_flight: int,
        group: int,
        share: str | None = None,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.training = training
        self.pieces = pieces
        self.state = state
        self.in_flight = in_flight  # items a worker may have in flight (the DataLoader's prefetch_factor)
        self.group = group  # pieces per item, the same for every worker (so in_order holds ≤ one item of each)
        self.row_groups = share  # the workers' directory of decoded row groups (zephon.executor.read.shared_groups)
        self._iterations = 0  # in this process (a persistent worker keeps its copy)

    def __iter__(self) -> Iterator[WorkerPiece] | Iterator[PieceGroup]:
        # Not a generator function: the start state is read when the iteration is made. Without workers the
        # DataLoader makes it inside iter(loader), and the loader then clears ``state`` for later iterations.
        info = get_worker_info()
        worker = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            share_cores(info.num_workers)  # the workers share the cores: one thread each on a core each
        self.pipeline._pending_state = self.state if self._iterations == 0 else None
        self._iterations += 1
        if info is None:  # in the loader's process: the runner num_steps() calibrated, if it is this one
            return self._pieces(self.pipeline._iteration_runner(), WorkerPiece.local)
        runner = self.pipeline._make_runner(worker, self.pieces)
        if self.row_groups is not None and isinstance(runner, RankRunner):
            runner.shared_groups = SharedRowGroups(self.row_groups)  # decoded by one worker, mapped by the rest
        writer = SlotWriter(self.in_flight, group=self.group)
        return self._groups(self._pieces(runner, WorkerPiece.slotted(writer), writer), info.id)

    def _groups(self, pieces: Iterator[WorkerPiece], worker: int) -> Iterator[PieceGroup]:
        group: list[WorkerPiece] = []
        for piece in pieces:
            group.append(piece)
            if len(group) == self.group:
                yield PieceGroup(worker=worker, pieces=tuple(group))
                group = []
        if group:
            yield PieceGroup(worker=worker, pieces=tuple(group))

    def _pieces(self, runner: Any, piece: Any, writer: SlotWriter | None = None) -> Iterator[WorkerPiece]:
        for batch in runner:
            if writer is not None and isinstance(batch, Batch):  # written straight into the piece's slot
                tensors = batch.to_training(**self.training, allocate=writer.allocator())
            else:
                tensors = batch.to_training(**self.training)
            yield piece(tensors, step=batch.step, microbatch=batch.microbatch, state=runner.state())


class Handed:
    """The rank's state after the microbatches handed out so far: the start state, with the cursors of each
    piece's lanes replaced by its worker's after it."""

    def __init__(self, start: dict[str, Any]) -> None:
        self.state = start
        self.cursors: dict[str, list[int]] = dict(start.get("lane_cursors", {}))

    def took(self, parts: list[WorkerPiece]) -> None:
        """The pieces of the microbatch just handed out."""
        if len(parts) == 1 and len(parts[0].state.get("lane_cursors", ())) == len(self.cursors):
            self.state = parts[0].state  # one piece holding every lane's cursor (no workers): the state itself
            self.cursors = self.state.get("lane_cursors", {})  # shared, so only ever replaced, never updated
            return
        cursors = dict(self.cursors)
        for part in parts:
            cursors.update(part.state.get("lane_cursors", {}))
        self.cursors = dict(sorted(cursors.items(), key=lambda kv: int(kv[0])))
        self.state = {**parts[-1].state, "lane_cursors": self.cursors}


class PipelineLoader:
    """Iterates ``to_training`` dicts of a pipeline through a ``torch`` DataLoader (see the module docstring)."""

    def __init__(self, pipeline: Pipeline, options: LoaderOptions, training: dict[str, Any]) -> None:
        self.options = options
        self.training = dict(training)
        self._pipeline = pipeline._with()  # the loader's own copy: the same plan, settings and encoder
        self._pipeline._known_steps = pipeline._known_steps
        self._pipeline._kept, pipeline._kept = pipeline._kept, None  # num_steps()'s runner: this loader's to use
        self._state: dict[str, Any] | None = pipeline._pending_state  # where the next iteration starts
        geometry = pipeline.geometry()
        #: Items per microbatch (``zephon.executor.worker_share``); refuses a count that would repeat work.
        self.pieces = check_loader_workers(geometry, options.num_workers) if options.num_workers else 1
        self._dataset: PieceDataset | None = None
        self._loader: DataLoader | None = None
        self._handed: Handed | None = None
        #: How the pieces of the last iteration crossed from the workers: through slots or pickled (a diagnostic).
        self.handover = {"slots": 0, "pickled": 0}

    def _torch_loader(self) -> tuple[DataLoader, PieceDataset]:
        if self._loader is None or self._dataset is None:
            o = self.options
            self._pipeline._pending_state = self._state
            if o.num_workers:  # once, here: the workers start from it instead of each calibrating
                read_ahead_enabled()  # a bad ZEPHON_READ_AHEAD: its one line here, not wrapped by a worker's traceback
                self._pipeline.num_steps()  # (without workers the runner calibrates on the shards it then reads)
                self._pipeline._drop_kept()  # the workers read their own shards: this process's are released
            in_flight = o.prefetch_factor if o.prefetch_factor is not None else 2  # torch's default
            share = make_share_directory() if o.num_workers > 1 else None
            if share is not None:  # removed with this loader, whatever the workers left in it
                weakref.finalize(self, remove_share_directory, share)
            self._dataset = PieceDataset(
                self._pipeline,
                self.training,
                self.pieces,
                self._state,
                in_flight=in_flight,
                group=self._group(),
                share=share,
            )
            self._loader = DataLoader(
                self._dataset,
                batch_size=None,
                num_workers=o.num_workers,
                pin_memory=o.pin_memory and self.pieces == 1,  # joined pieces are pinned when joined
                persistent_workers=o.persistent_workers,
                prefetch_factor=o.prefetch_factor,
                multiprocessing_context=o.multiprocessing_context,
                timeout=o.timeout,
            )
        return self._loader, self._dataset

    def _group(self) -> int:
        """Pieces a worker sends per DataLoader item: ``group_size`` of a piece's bytes as the settings tell them
        (rows × ``max_length`` × 8 bytes per tensor asked for), 1 for record pipelines (sizes unknown)."""
        spec = self._pipeline._spec
        if spec.pack is None or spec.batch is None:
            return 1
        rows = -(-self._pipeline.geometry().microbatch // self.pieces)
        tensors = 1 + sum(bool(v) for k, v in self.training.items() if k.startswith("return_"))
        return group_size(rows * spec.pack.max_length * 8 * tensors)

    def _start(self) -> dict[str, Any]:
        """The state the next iteration starts at."""
        self._pipeline._pending_state = self._state
        return self._pipeline._make_runner().state()

    def __iter__(self) -> Iterator[Tensors]:
        loader, dataset = self._torch_loader()
        handed = Handed(self._start())
        self._handed = handed
        # The workers start (and copy the dataset) here. Without workers or pinning the DataLoader would only
        # hand over the dataset's items, at some 100 µs each (its profiler span and fetcher): taken directly.
        o = self.options
        items = iter(loader) if o.num_workers or o.pin_memory else iter(dataset)
        if o.num_workers:
            items = in_order(items, o.num_workers)  # type: ignore[arg-type]
        self._state, dataset.state = None, None  # later iterations start at the beginning of the plan
        pin = self._pin_out()
        slots = SlotReader()  # the rings of this iteration's workers
        self.handover = counts = {"slots": 0, "pickled": 0}
        if self.pieces == 1:  # whole microbatches: nothing to gather or join (the common case, no workers)
            for item in items:
                handed.took([item])
                counts["pickled" if item.slot is None else "slots"] += not item.in_process
                yield item.tensors() if item.slot is None else slots.take(item.slot, pin_memory=pin)
            return
        for first in items:
            parts = [first, *(next(items, None) for _ in range(self.pieces - 1))]
            if any(p is None or (p.step, p.microbatch) != (first.step, first.microbatch) for p in parts):
                raise RuntimeError(
                    f"DataLoader items must come {self.pieces} per microbatch from the workers in turn, got a "
                    f"microbatch ({first.step}, {first.microbatch}) cut short — report this as a Zephon bug"
                )
            handed.took(parts)  # type: ignore[arg-type]
            for p in parts:
                counts["pickled" if p.slot is None else "slots"] += not p.in_process  # type: ignore[union-attr]
            tensors = [p.tensors() if p.slot is None else slots.views(p.slot) for p in parts]  # type: ignore[union-attr]
            joined = join_training(tensors, pin_memory=pin)  # new tensors: the slots may be written again
            for p in parts:
                if p.slot is not None:  # type: ignore[union-attr]
                    slots.release(p.slot)  # type: ignore[union-attr]
            yield joined

    def _pin_out(self) -> bool:
        """Whether the loader itself makes page-locked tensors: joined pieces and pieces read out of slots
        (the DataLoader's pinning thread pins the pickled whole pieces)."""
        if not self.options.pin_memory:
            return False
        if not torch.accelerator.is_available():
            if self.pieces == 1:
                return False  # the DataLoader (pin_memory=True) has warned already
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                "won't be used.",
                stacklevel=3,
            )
            return False
        return True

    def num_steps(self) -> int:
        """Global steps of the run (``Pipeline.num_steps``)."""
        self._pipeline._pending_state = self._state
        return self._pipeline.num_steps()

    def local_state(self) -> dict[str, Any]:
        """This rank's own state after the last microbatch handed out (before any: where the next iteration
        starts), never a collective: ``zephon.integrations`` keeps one per batch handed out and gathers the one
        training reached (a framework fetches ahead of its training step)."""
        return self._handed.state if self._handed is not None else self._start()

    def state_dict(self) -> dict[str, Any]:
        """The rank's state after the last microbatch handed out (before any: where the next iteration starts);
        under torch.distributed every rank's cursors are gathered (a collective), as ``Pipeline.state_dict``."""
        return gather_states(self.local_state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume where ``state`` was taken (validated now; new workers start)."""
        self._pipeline.load_state_dict(state)  # refuses a state of another plan, tokenizer, packing or geometry
        self._state, self._handed = state, None
        self._loader, self._dataset = None, None
