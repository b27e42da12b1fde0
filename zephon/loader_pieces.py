"""What a DataLoader worker hands the loader of ``Pipeline.dataloader()``, and how the loader puts it back in order.

A worker yields ``PieceGroup`` items of ``WorkerPiece``s — its part of one microbatch each, with its state and
stats after it (``zephon.torch_loader`` makes them, ``zephon.worker_slots`` moves their tensors); ``in_order``
restores the rank's order from the workers' items, and ``Handed`` keeps the rank's state and stats after the
microbatches handed out so far.

Invariant: piece ``k`` of an iteration is the next piece of worker ``k mod N`` (``zephon.executor.worker_share``),
whatever order the DataLoader delivers the items in. Example: 2 workers, groups of 2 pieces — worker 1's items
may arrive first; ``in_order`` still yields worker 0's piece 0, worker 1's piece 0, worker 0's piece 1, …
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from zephon import errors
from zephon.errors import ZephonError
from zephon.executor.provenance_log import LogHeader, ProvenanceLog
from zephon.executor.settings import RunStats
from zephon.loader_stats import HandedStats, StatsPiece
from zephon.tuple_pickling import tuple_pickled
from zephon.worker_slots import SlotPiece, SlotWriter

__all__ = ["Handed", "PieceGroup", "Tensors", "WorkerError", "WorkerPiece", "in_order"]

Tensors = dict[str, torch.Tensor | int]


@tuple_pickled
@dataclass(frozen=True, slots=True)
class WorkerError:
    """A Zephon error a DataLoader worker raised, carried to the loader as an item so that the loader raises it as
    it is — the error's own one line, where torch would raise "Caught DatasetError in DataLoader worker process
    0." with the worker's traceback in the message. ``kind``: the public class in ``zephon.errors`` it is (a
    subclass with arguments of its own, such as a collate's ``RecordError``, crosses as its public class)."""

    kind: str
    message: str

    @classmethod
    def of(cls, exc: ZephonError) -> WorkerError:
        kind = next(c.__name__ for c in type(exc).__mro__ if c.__module__ == "zephon.errors")
        return cls(kind, str(exc))

    def exception(self) -> ZephonError:
        made: ZephonError = getattr(errors, self.kind)(self.message)
        return made


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
    #: The worker that made it (0 without workers) and its counts after it (``zephon.loader_stats``).
    worker: int = 0
    stats: StatsPiece | None = None
    #: With a provenance log: the worker's log header and its rows of this piece, written by the loader when it
    #: hands the piece out (``zephon.executor.provenance_log``: a worker runs ahead of training).
    log: tuple[LogHeader, list[pa.Table]] | None = None

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


@tuple_pickled
@dataclass(frozen=True, kw_only=True, slots=True)
class PieceGroup:
    """What a worker yields as one DataLoader item: its next ``pieces``, in order (``zephon.worker_slots``:
    grouped to spread the DataLoader's cost per item), and its index ``worker``."""

    worker: int
    pieces: tuple[WorkerPiece, ...]
    #: With the worker's last item: its ``RunStats`` after its whole run (``zephon.loader_stats``).
    final: RunStats | None = None
    #: With the last item of a worker that stopped on a Zephon error: the error, raised after ``pieces`` (and only
    #: with ``final``, which every last item carries).
    error: WorkerError | None = None

    def pin_memory(self) -> PieceGroup:
        """The DataLoader's pinning thread calls this: each piece pinned (``WorkerPiece.pin_memory``)."""
        return replace(self, pieces=tuple(p.pin_memory() for p in self.pieces))


def in_order(
    groups: Iterator[PieceGroup], workers: int, finals: dict[int, RunStats] | None = None
) -> Iterator[WorkerPiece]:
    """The pieces of an iteration in order, from the groups its ``workers`` yield: piece ``k`` is the next of
    worker ``k mod workers`` (``zephon.executor.worker_share``), whatever order the groups come in. It ends
    where the next piece's worker has none left: then every worker is done. At a worker's turn after its last
    piece was taken, its ``final`` stats go into ``finals`` (so they never count pieces not handed out yet) and
    its ``error``, if any, is raised — after every piece of the iteration before it, as iterating the pipeline
    would raise it."""
    queues: list[deque[WorkerPiece | PieceGroup]] = [deque() for _ in range(workers)]
    for k in itertools.count():
        queue = queues[k % workers]
        while not queue:
            group = next(groups, None)
            if group is None:
                return
            queues[group.worker].extend(group.pieces)
            if group.final is not None:  # the worker's last item: itself, after its pieces, marks its end
                queues[group.worker].append(group)
        item = queue.popleft()
        if isinstance(item, PieceGroup):
            if finals is not None and item.final is not None:
                finals[item.worker] = item.final
            if item.error is not None:
                raise item.error.exception()
            continue  # the turn passes: every piece of the iteration was taken (the module's invariant)
        yield item


class Handed:
    """The rank's state after the microbatches handed out so far: the start state, with the cursors of each
    piece's lanes replaced by its worker's after it."""

    def __init__(self, start: dict[str, Any], log_dir: str | None = None) -> None:
        self.state = start
        self.cursors: dict[str, list[int]] = dict(start.get("lane_cursors", {}))
        self.stats = HandedStats()  # the counts of what was handed out (zephon.loader_stats)
        self._log_dir = log_dir  # provenance_dir: the workers' rows are written as their pieces are handed out
        self._log: ProvenanceLog | None = None

    def took(self, parts: list[WorkerPiece]) -> None:
        """The pieces of the microbatch just handed out."""
        for part in parts:
            self.stats.took(part.worker, part.stats)
            if part.log is not None and self._log_dir is not None:
                header, tables = part.log
                if self._log is None:  # the rank's log of what training took (the workers write none)
                    self._log = ProvenanceLog(self._log_dir, replace(header, worker=0))
                self._log.extend(tables)
        if len(parts) == 1 and len(parts[0].state.get("lane_cursors", ())) == len(self.cursors):
            self.state = parts[0].state  # one piece holding every lane's cursor (no workers): the state itself
            self.cursors = self.state.get("lane_cursors", {})  # shared, so only ever replaced, never updated
            return
        cursors = dict(self.cursors)
        for part in parts:
            cursors.update(part.state.get("lane_cursors", {}))
        if len(cursors) > len(self.cursors):  # a lane the start did not hold: sorted in (the start holds them all)
            cursors = dict(sorted(cursors.items(), key=lambda kv: int(kv[0])))
        self.cursors = cursors
        self.state = {**parts[-1].state, "lane_cursors": self.cursors}

    def close(self) -> None:
        """The end of the iteration: the rows handed out written (their file closed)."""
        log, self._log = self._log, None
        if log is not None:
            log.close()
