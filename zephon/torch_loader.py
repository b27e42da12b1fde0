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
``/dev/shm`` this loader makes and removes (``zephon.executor.read.shared_groups``). With any number of workers,
one included, the row groups ``num_steps()`` decoded in the loader's process are published there before the
workers start, so their first reads map them instead of decoding them again (a worker's first piece came after
0.7-0.9 s, ~0.45 s of it decoding, on ``bench_workers.py``'s plan; 0.3-0.4 s with them published), and unlinked
once every worker has handed over its first piece (a worker needing one later decodes it, or maps another
worker's copy). A lone worker only maps: it publishes nothing, there being nobody to map it.

State: each piece carries its worker's state and counts after it; ``state_dict()`` merges the states into the
rank's after the last microbatch handed out — ``Pipeline.state_dict()``'s after the same batch — so a run resumes
exactly with any ``num_workers`` (``load_state_dict`` starts new workers), and ``stats()`` sums the counts
(``zephon.loader_stats``). A Zephon error in a worker crosses as its last item and is raised here in its own one
line, after every piece before it (``zephon.loader_pieces.WorkerError``).

Epochs (``len``: an epoch's microbatches): the first iteration starts where the pipeline (or ``load_state_dict``)
says, later ones at the plan's start, as iterating a ``Pipeline`` again does — unless the one before failed (not a
``break``): the next resumes after its last batch handed out, on new workers (``zephon.loader_failures``).

Without workers and without ``pin_memory`` the loader takes the pieces from its dataset itself: a ``DataLoader``
would only hand them over, at some 100 µs a microbatch (``benchmarks/bench_integrations.py``) — and its
iteration starts on the runner ``num_steps()`` calibrated, if any (``zephon.run.KeptRunner``: the pipeline's, handed
to the loader when it is made), reading the shards that calibration decoded. With workers that runner is closed
once the steps are known, its decoded row groups published first: each worker reads its own shards.

``pin_memory``: with ``c = 1`` the DataLoader's pinning thread pins the pieces; with ``c > 1`` the loader
concatenates straight into page-locked buffers. Without an accelerator it does nothing (torch's warning).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from zephon.errors import WorkerLost, ZephonError, warn
from zephon.executor.batch import Batch, join_training
from zephon.executor.cores import share_cores
from zephon.executor.pack import run_length
from zephon.executor.read.ahead import read_ahead_enabled
from zephon.executor.read.shared_groups import SharedRowGroups, make_share_directory, remove_share_directory
from zephon.executor.records.runner import RecordRunner
from zephon.executor.runner import RankRunner
from zephon.executor.settings import RunStats
from zephon.executor.state import gather_states
from zephon.executor.worker_share import check_loader_workers
from zephon.loader_failures import WorkerWatch, at_end, lost_message, stop_workers, worker_loss, workers_died
from zephon.loader_options import LOADER_SETTINGS, LoaderOptions
from zephon.loader_pieces import Handed, PieceGroup, Tensors, WorkerError, WorkerPiece, in_order
from zephon.loader_shutdown import wait_for_feeders
from zephon.loader_stats import StatsSender
from zephon.run import ends_epoch, moved_by_a_load
from zephon.training_options import check_training_options
from zephon.worker_slots import SlotReader, SlotWriter, group_size, loader_pins

#: A ``zephon.Pipeline`` (not imported: the pipeline imports this module, and no import may cycle).
Pipeline = Any


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
            run_length.LOADER_WARNS = True  # lanes cut: the loader warns once, of every worker's (this process's own)
        self.pipeline._pending_state = self.state if self._iterations == 0 else None
        self._iterations += 1
        self.pipeline._stats = RunStats()  # each iteration counts afresh, as iterating a pipeline does
        if info is None:  # in the loader's process: the runner num_steps() calibrated, if it is this one
            return self._pieces(self.pipeline._iteration_runner(), WorkerPiece.local)
        runner = self.pipeline._make_runner(worker, self.pieces)
        runner.log_hand_over = True  # its provenance rows go with its pieces: the loader logs what it hands out
        if self.row_groups is not None and isinstance(runner, RankRunner):
            # decoded by one worker, mapped by the rest; a lone worker maps what the loader published, nothing more
            runner.shared_groups = SharedRowGroups(self.row_groups, closed=info.num_workers == 1)
        writer = SlotWriter(self.in_flight, group=self.group)
        return self._groups(self._pieces(runner, WorkerPiece.slotted(writer), writer, info.id), info.id)

    def _groups(self, pieces: Iterator[WorkerPiece], worker: int) -> Iterator[PieceGroup]:
        """``self.group`` pieces an item; the last item (its pieces may be none), made once the run has ended,
        carries the worker's stats after its whole run (``final``: what it counts after its last batch, such as
        documents skipped at the end of the plan)."""
        group: list[WorkerPiece] = []
        try:
            for piece in pieces:
                group.append(piece)
                if len(group) == self.group:
                    yield PieceGroup(worker=worker, pieces=tuple(group))
                    group = []
        except ZephonError as exc:  # raised by the loader in the pipeline's order, in its own one line
            error = WorkerError.of(exc)
            yield PieceGroup(worker=worker, pieces=tuple(group), final=self.pipeline._stats, error=error)
            return
        yield PieceGroup(worker=worker, pieces=tuple(group), final=self.pipeline._stats)

    def _pieces(
        self, runner: Any, piece: Any, writer: SlotWriter | None = None, worker: int = 0
    ) -> Iterator[WorkerPiece]:
        sender = StatsSender(self.pipeline._stats)  # the runner counts into it (Pipeline._make_runner)
        for batch in runner:
            if writer is not None and isinstance(batch, Batch):  # written straight into the piece's slot
                tensors = batch.to_training(**self.training, allocate=writer.allocator())
            else:
                tensors = batch.to_training(**self.training)
            made = piece(tensors, step=batch.step, microbatch=batch.microbatch, state=runner.state())
            made.worker, made.stats = worker, sender.piece()
            log = runner.log
            if log is not None and log.hand_over:
                made.log = (log.header, log.take())
            yield made


class PipelineLoader:
    """Iterates ``to_training`` dicts of a pipeline through a ``torch`` DataLoader (see the module docstring)."""

    def __init__(self, pipeline: Pipeline, options: LoaderOptions, training: dict[str, Any]) -> None:
        check_training_options(
            training, what="dataloader()", settings=LOADER_SETTINGS, records=pipeline._spec.records
        )
        self.options = options
        self.training = dict(training)
        self._pipeline = pipeline._with()  # the loader's own copy: the same plan, settings and encoder
        self._pipeline._known_steps = pipeline._known_steps
        self._pipeline._kept, pipeline._kept = pipeline._kept, None  # num_steps()'s runner: this loader's to use
        self._owner = weakref.ref(pipeline)  # its stats() are this loader's once it iterates
        self._state: dict[str, Any] | None = pipeline._pending_state  # where the next iteration starts
        self._taken = pipeline._pending_state  # the pipeline's loaded state: this loader's first iteration takes it
        self._loads = 0  # states loaded: an iteration begun before the latest load is refused to go on
        pipeline._followers.loaders.add(self)  # a state loaded into the pipeline later reaches this loader
        geometry = pipeline.geometry()
        #: Items per microbatch (``zephon.executor.worker_share``); refuses a count that would repeat work.
        self.pieces = check_loader_workers(geometry, options.num_workers) if options.num_workers else 1
        self._dataset: PieceDataset | None = None
        self._loader: DataLoader | None = None
        self._handed: Handed | None = None
        #: How the pieces of the last iteration crossed from the workers: through slots or pickled (a diagnostic).
        self.handover = {"slots": 0, "pickled": 0}
        #: The row groups ``num_steps()`` decoded here, published for the workers' first reads, and
        #: unlinked once every worker has handed over its first item (``_unpublish``).
        self._published: SharedRowGroups | None = None

    def _torch_loader(self) -> tuple[DataLoader, PieceDataset]:
        if self._loader is None or self._dataset is None:
            o = self.options
            self._pipeline._pending_state = self._state
            share = make_share_directory() if o.num_workers else None
            if share is not None:  # removed with this loader, whatever the workers left in it
                weakref.finalize(self, remove_share_directory, share)
                self._unpublish()  # a loader made again (a state loaded): what it published before, unlinked
                self._published = SharedRowGroups(share)
            if o.num_workers:  # once, here: the workers start from it instead of each calibrating
                read_ahead_enabled()  # a bad ZEPHON_READ_AHEAD: its one line here, not wrapped by a worker's traceback
                self._pipeline.num_steps()  # (without workers the runner calibrates on the shards it then reads)
                # the workers read their own shards: this process's are released, their decoded row groups
                # published first (with a share), which the workers then map instead of decoding them again
                self._pipeline._drop_kept(self._published)
            in_flight = o.prefetch_factor if o.prefetch_factor is not None else 2  # torch's default
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
        return self._runner_at(self._state).state()

    def _runner_at(self, state: dict[str, Any] | None) -> RankRunner | RecordRunner:
        """A runner of this loader's pipeline starting at ``state`` (None: the plan's start)."""
        self._pipeline._pending_state = state
        return self._pipeline._make_runner()

    def __iter__(self) -> Iterator[Tensors]:
        loads = self._loads
        start = self._runner_at(self._state)  # where this iteration starts: the state of it is the rank's first
        if self._state is not None and ends_epoch(start):  # an epoch's end: the next whole
            self._state, self._loader, self._dataset = None, None, None
            start = self._runner_at(None)
        loader, dataset = self._torch_loader()
        handed = Handed(start.state(), self._pipeline._spec.provenance_dir)
        self._handed = handed
        # The workers start (and copy the dataset) here. Without workers or pinning the DataLoader would only
        # hand over the dataset's items, at some 100 µs each (its profiler span and fetcher): taken directly.
        o = self.options
        owner = self._owner()
        if owner is not None:  # Pipeline.stats(): this iteration's (the counts only: not the loader, its workers)
            owner._stats_from, owner._loader_from = handed.stats, weakref.ref(self)  # its state_dict() too
            owner._followers.seen()
            if self._taken is not None and owner._pending_state is self._taken:  # applied once: a loader made
                owner._pending_state = None  # again (a framework reloading it) starts at the plan's start
            self._taken = None
        source = iter(loader) if o.num_workers or o.pin_memory else iter(dataset)
        items = source
        finals: dict[int, RunStats] = {}  # each worker's stats after its run, with its last item
        watch = WorkerWatch.install() if o.num_workers else None  # a worker's death: raised at a fetch, not later
        if o.num_workers:
            items = in_order(watch.fetch(items) if watch else items, o.num_workers, finals)  # type: ignore[arg-type]
            items = self._unpublish_after(items, o.num_workers)  # type: ignore[arg-type]
        self._state, dataset.state = None, None  # later iterations start at the beginning of the plan
        ended = False
        try:
            try:
                for tensors in self._hand_out(items, handed):
                    if self._loads != loads:  # a state loaded since this iteration began: its batches do not follow
                        raise moved_by_a_load()
                    yield tensors
                ended = True
            except GeneratorExit:  # a break: the next iteration starts at the plan's start (epochs) — unless a
                if o.num_workers and workers_died(source):  # worker died (torch raised it in the caller's code)
                    self._resume_after(handed, loads)
                    stop_workers(source, kill_first=True)
                elif o.num_workers and not o.persistent_workers:  # now, not when collected (a traceback delays it)
                    stop_workers(source, kill_first=False)
                raise
            except BaseException as exc:  # failed: the next iteration resumes here (zephon.loader_failures)
                lost = worker_loss(exc)
                self._resume_after(handed, loads)
                if o.num_workers:  # none left alive, persistent ones included: the next iteration starts new ones
                    stop_workers(source, kill_first=lost is not None or isinstance(exc, KeyboardInterrupt))
                if lost is not None and at_end(handed.state, self.num_steps()):  # after the last batch: run whole
                    warn(f"{lost} after the run's last batch: its final counts are missing from stats()")
                    return
                if lost is not None:
                    raise WorkerLost(lost_message(lost, handed.state)) from None
                raise
        finally:  # stats() as iterating the pipeline gives them: after the run, or as they were at an error
            if watch is not None:
                watch.close()
            handed.stats.finish(finals if o.num_workers else {0: self._pipeline._stats})
            if ended and o.num_workers and (merged := handed.stats.stats()).lanes_cut:  # once here, for every worker
                run_length.warn_short_run(merged.tokens_cut, merged.lanes_cut, self.num_steps())
            handed.close()
            if o.num_workers and not o.persistent_workers:  # nothing printed at exit (zephon.loader_shutdown)
                wait_for_feeders(source)

    def _resume_after(self, handed: Handed, loads: int) -> None:
        """A failed iteration: the next resumes after its last batch handed out, on new workers (unless a state
        was loaded since it began: that decides)."""
        if self._loads == loads:
            self._state, self._loader, self._dataset = handed.state, None, None

    def _unpublish_after(self, items: Iterator[WorkerPiece], count: int) -> Iterator[WorkerPiece]:
        """``items``; the row groups published for the workers' start unlinked once ``count`` items have come —
        one from each worker, in turn — or when the iteration ends first. A worker that needs one of them later
        decodes it (or maps another worker's copy): the share's protocol when a file is absent."""
        try:
            yield from itertools.islice(items, count)
            self._unpublish()
            yield from items  # the rest delegated as they come: nothing more done a piece
        finally:
            self._unpublish()

    def _unpublish(self) -> None:
        published, self._published = self._published, None
        if published is not None:
            published.forget_all()

    def _hand_out(self, items: Iterator[WorkerPiece], handed: Handed) -> Iterator[Tensors]:
        """The training dicts of ``items`` (the pieces in order), each microbatch's pieces joined."""
        pin = loader_pins(self.options.pin_memory, self.pieces)
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

    def num_steps(self) -> int:
        """Global steps of the run (``Pipeline.num_steps``)."""
        self._pipeline._pending_state = self._state
        return self._pipeline.num_steps()

    def __len__(self) -> int:  # an epoch's dicts on this rank, from the plan's start (a resumed one: the rest)
        return self.num_steps() * self._pipeline.geometry().accumulation

    def stats(self) -> RunStats:
        """What the latest iteration handed out (``Pipeline.stats()``, which returns it once this loader iterates):
        every worker's counts after its last piece handed out, summed; after the last batch, after the whole
        run (``zephon.loader_stats``). Reset by each iteration."""
        return self._handed.stats.stats() if self._handed is not None else RunStats()

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
        self._loads += 1
        self._state, self._handed = state, None
        self._loader, self._dataset = None, None

    def adopt(self, state: dict[str, Any]) -> None:
        """``state`` was loaded into the pipeline this loader was made from (``zephon.followers``): loaded here too,
        and, being the pipeline's loaded state, cleared there by this loader's next iteration (applied once)."""
        self.load_state_dict(state)
        self._taken = state
