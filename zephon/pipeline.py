"""``zephon.Pipeline``: the documented API over the planner and the executor.

``Pipeline(work_source)`` plans on first iteration: the work source is scanned, its normalized config hashed,
and the bundle written to ``$ZEPHON_CACHE_DIR/plans/<config hash>`` unless a bundle with that hash is
already there. ``Pipeline.from_plan(path)`` runs a bundle written by ``zephon plan``. Both run the same
executor (``zephon.executor.runner``). The builder methods return new pipelines. The planner (and with it
Polars and DuckDB) is imported only when a work source must be planned.

One run, opened once: a pipeline opens (and checks) its plan bundle once and builds its encoder once per process
(``zephon.run.OpenedRun``), shared by ``num_steps``, ``load_state_dict``, ``state_dict``, iteration and
``to_torch_dataset`` (a DataLoader worker, a process of its own, opens its own). The runner ``num_steps()``
calibrated is kept for the next iteration, which then reads the shards it decoded (``zephon.run.KeptRunner``).

A pipeline is also a checkpointable component (the ``Stateful`` protocol of ``torch.distributed.checkpoint``):
``state_dict()`` says where the latest iteration stands, ``load_state_dict(state)`` makes the next iteration
resume there (load before iterating). See docs/training.md.

Over 400 lines: ``Pipeline`` is the documented API's one class, and its builder methods carry the docstrings the
docs point to; what it delegates lives in ``zephon.run`` and the executor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import get_worker_info

from zephon.checks import require_bool, require_positive
from zephon.errors import ConfigError
from zephon.executor.batch import Batch
from zephon.executor.geometry import Geometry
from zephon.executor.operators import Operator
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.read.shared_groups import SharedRowGroups
from zephon.executor.records.batch import RecordBatch
from zephon.executor.records.collate import Collate, check_collate
from zephon.executor.records.runner import RecordRunner
from zephon.executor.runner import RankRunner
from zephon.executor.settings import ExecutorSpec, RunStats
from zephon.executor.state import gather_states
from zephon.followers import Followers
from zephon.keywords import known_keywords
from zephon.loader_stats import HandedStats
from zephon.plan.manifest import warn_plan
from zephon.run import KeptRunner, OpenedRun, ends_epoch, moved_by_a_load
from zephon.specs import BatchSpec, ChatSpec, PackSpec, SamplePackSpec, StoreOptions, TokenizeSpec
from zephon.user_functions import reduce_for_process

if TYPE_CHECKING:
    from zephon.torch_data import PipelineDataset
    from zephon.torch_loader import PipelineLoader
    from zephon.work import StaticMixtureWorkSource


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlanningOptions:
    """How ``Pipeline(work_source)`` plans (never what): the count pass's ``workers`` and ``progress`` bars
    (``zephon plan --workers/--progress``), and ``materialize_selections`` (copies of selected rows,
    docs/curricula.md). Set with ``Pipeline.options(plan_workers=, plan_progress=, materialize_selections=)``."""

    workers: int | None = None
    progress: bool | None = None
    materialize_selections: bool = False


#: The ``options()`` that belong to ``PlanningOptions``, not ``ExecutorSpec``.
PLANNING = frozenset(f.name for f in dataclasses.fields(PlanningOptions))


class Pipeline:
    """An iterable of training batches that follows a plan."""

    def __init__(self, work_source: StaticMixtureWorkSource | None = None, *, _plan_dir: Path | None = None):
        if work_source is None and _plan_dir is None:
            raise ConfigError("Pipeline needs a work source, got None — pass StaticMixtureWorkSource(...)")
        self._work_source = work_source
        self._plan_dir = _plan_dir
        self._spec = ExecutorSpec()  # the one settings object: each builder step replaces it (checked there)
        self._planning = PlanningOptions()
        self._runner: RankRunner | RecordRunner | None = None
        self._pending_state: dict[str, Any] | None = None
        self._loads = 0  # states loaded so far: an iteration started before the latest load is refused to go on
        self._stats = RunStats()
        #: What the ``Pipeline.dataloader()`` whose iteration was this pipeline's latest handed out (``stats()``).
        self._stats_from: HandedStats | None = None
        #: The loader (``dataloader()``) whose iteration was this pipeline's latest: ``state_dict()`` is its.
        self._loader_from: Callable[[], PipelineLoader | None] | None = None
        #: ``num_steps()``'s result and the spec and geometry it was computed for: a later runner with the same
        #: ones starts from it instead of calibrating again.
        self._known_steps: tuple[ExecutorSpec, Geometry, int, str | None] | None = None
        self._opened: OpenedRun | None = None
        self._kept: KeptRunner | None = None  # the runner num_steps() calibrated, for the next iteration
        #: The loaders and datasets made from this pipeline: a state loaded later reaches them (zephon.followers).
        self._followers = Followers()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_opened"] = None  # another process (a DataLoader worker) opens its own
        state["_kept"] = None
        state["_stats_from"] = state["_loader_from"] = None  # a loader of this process
        state["_followers"] = None  # this process's loaders and datasets
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._followers = Followers()

    def _fresh(self) -> OpenedRun:
        """What this process opened for this pipeline's bundle (``zephon.run.OpenedRun.current``)."""
        self._opened = OpenedRun.current(self._opened, lambda: self.plan_dir)
        return self._opened

    @classmethod
    def from_plan(cls, path: str | Path) -> Pipeline:
        """A pipeline over a plan bundle written by ``zephon plan`` (validated now; its plan.json ``warnings``
        are issued now as ``zephon.PlanWarning``). The bundle is checked now, once
        (``zephon.plan.bundle.open_bundle``), and again whenever one of its files has changed since (a stat of
        each, before every use): a missing, truncated, foreign or edited file is one ``PlanFormatError``
        naming it."""
        plan = PlanBundle(path)
        warn_plan(plan.manifest)
        pipeline = cls(_plan_dir=Path(path))
        pipeline._opened = OpenedRun.of(Path(path), plan)
        return pipeline

    def _with(self, **changes: object) -> Pipeline:
        new = Pipeline.__new__(Pipeline)
        new._work_source = self._work_source
        new._plan_dir = self._plan_dir
        planning = {k: changes.pop(k) for k in list(changes) if k in PLANNING}
        new._spec = dataclasses.replace(self._spec, **changes)
        new._planning = dataclasses.replace(self._planning, **planning)
        new._runner = None
        new._pending_state = self._pending_state  # a loaded state goes on to the pipeline these settings make
        new._loads = 0
        new._stats = RunStats()
        new._stats_from = new._loader_from = None
        new._known_steps = None
        new._kept = None  # other settings: calibrated again (their own runner)
        new._opened = self._opened  # the same bundle; the encoder is reused only for the same settings
        new._followers = Followers()
        return new

    @known_keywords
    def options(
        self,
        *,
        io_options: StoreOptions | None = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        read_chunk: int | None = None,
        provenance_dir: str | Path | None = None,
        on_bad_document: str | None = None,
        tokenizer_threads: int | None = None,
        plan_workers: int | None = None,
        plan_progress: bool | None = None,
        materialize_selections: bool | None = None,
    ) -> Pipeline:
        """Execution options; they never change the global batches. Options left None keep their value.

        ``dp_rank``/``dp_size`` override the data-parallel identity (default: torch.distributed, else
        RANK/WORLD_SIZE); ``read_chunk`` is how many documents are read and tokenized together (at least: an
        estimated plan's chunks of small documents take more, up to 4×, ``zephon.executor.chunk_sizes``);
        ``provenance_dir`` makes every rank log what it yields (``zephon.executor.provenance_log``), for
        ``zephon audit PLAN --log DIR``. ``on_bad_document="skip"`` (estimated plans only; default
        ``"raise"``) skips documents that cannot be read as text and counts them by reason and shard in
        ``stats().skipped`` (docs/reliability.md); a skipped document contributes no tokens, and a rank whose
        whole share is skipped raises a ``DatasetError`` (docs/training.md). ``tokenizer_threads``: threads this
        rank tokenizes on (default ``RAYON_NUM_THREADS``, else the usable cores), e.g. a node's spare cores;
        ``stats().tokenizer_engine`` says which engine encoded (docs/performance.md).

        Planning, for ``Pipeline(work_source)`` only (``PlanningOptions``): ``plan_workers`` processes for the
        count pass, ``plan_progress`` its bars (default: on a terminal), ``materialize_selections=True`` writes
        copies of the selected rows into the bundle (docs/curricula.md) — the cached plan then lives beside the
        one without copies, under its own name.
        """
        changes: dict[str, object] = {
            "io": io_options,
            "read_chunk": read_chunk,
            "tokenizer_threads": tokenizer_threads,
            "provenance_dir": None if provenance_dir is None else str(provenance_dir),
            "on_bad_document": on_bad_document,
            "workers": plan_workers,
            "progress": plan_progress,
            "materialize_selections": materialize_selections,
        }
        if dp_rank is not None or dp_size is not None:
            changes.update(dp_rank=dp_rank, dp_size=dp_size)  # both or neither: ExecutorSpec checks
        changes = {k: v for k, v in changes.items() if v is not None}
        if self._work_source is None and any(k in PLANNING for k in changes):
            raise ConfigError(
                "plan_workers, plan_progress and materialize_selections must go to the planner, got them for a "
                "pipeline over a plan bundle already written — pass them to zephon plan (--workers, --progress, "
                "--materialize-selections) or work_source.plan(...)"
            )
        if "workers" in changes:
            require_positive(plan_workers, "plan_workers")
        for key, name in (("progress", "plan_progress"), ("materialize_selections", "materialize_selections")):
            if key in changes:
                require_bool(changes[key], name)
        return self._with(**changes)

    @known_keywords
    def tokenize(
        self,
        *,
        tokenizer_id: str,
        field: str = "text",
        add_bos: bool | None = None,
        eos_token: str | None = None,
        special_tokens: str | None = None,
        max_tokens: int | None = None,
        long_documents: str = "truncate",
    ) -> Pipeline:
        """Tokenize ``field`` with a Hugging Face tokenizer, appending EOS (see zephon.executor.encode.text).

        ``special_tokens``: ``"bos_eos" | "bos" | "eos" | "none" | "tokenizer_default"`` (default: BOS by the
        tokenizer's convention or ``add_bos``, one EOS); ``max_tokens`` caps each document, which
        ``long_documents="truncate"`` cuts or ``"split"`` splits into several (zephon.executor.encode.encoders)."""
        spec = TokenizeSpec(
            tokenizer_id=tokenizer_id,
            field=field,
            add_bos=add_bos,
            eos_token=eos_token,
            special_tokens=special_tokens,
            max_tokens=max_tokens,
            long_documents=long_documents,
        )
        return self._with(tokenize=spec)

    @known_keywords
    def tokenize_chat(
        self,
        *,
        tokenizer_id: str,
        field: str | None = None,
        chat_template: str | None = None,
        loss_on: str = "assistant",
        layout: str = "messages",
        max_tokens: int | None = None,
        long_documents: str = "truncate",
    ) -> Pipeline:
        """Tokenize conversations with a chat template and a loss mask over the assistant turns.

        ``layout``: ``"messages"`` (``field``, default ``"messages"``, holds ``[{role, content}]``),
        ``"alpaca"`` (columns instruction, input, output) or ``"sharegpt"`` (``field``, default
        ``"conversations"``, holds ``[{from, value}]``). ``chat_template``: a Jinja template (default: the
        tokenizer's). ``loss_on="all"`` trains on every token. Batches then carry ``loss_mask``, and
        ``to_training`` puts -100 on labels outside it and across documents (docs/operators.md)."""
        chat = ChatSpec(layout=layout, chat_template=chat_template, loss_on=loss_on)
        spec = TokenizeSpec(  # field None: the layout's column (specs.CHAT_FIELDS)
            tokenizer_id=tokenizer_id,
            field=field or None,
            chat=chat,
            max_tokens=max_tokens,
            long_documents=long_documents,
        )
        return self._with(tokenize=spec)

    @known_keywords
    def map_transform(
        self, fn: Callable[..., dict[str, Any] | None], *, version: str | int | None = None, seeded: bool = False
    ) -> Pipeline:
        """Run ``fn`` on every record before tokenizing: it gets the record (a dict of its columns) and returns a
        record, or None to drop it (counted in ``stats().skipped["dropped"]``). Operators run in the order they
        were added, always before tokenizing, on the read-ahead thread. They are fingerprinted (name, source,
        ``version``): a state or an exact plan made with other operators is refused, and a function that gives
        different outputs for the same record is refused at start-up (docs/operators.md).

        ``seeded=True`` (record pipelines, docs/records.md): ``fn(record, rng)`` gets a NumPy generator derived
        from the plan seed and the record's plan position — the same random crop after a resume and at any dp
        size."""
        return self._with(operators=(*self._spec.operators, Operator.of("map_transform", fn, version, seeded=seeded)))

    @known_keywords
    def map_batch(
        self, fn: Callable[[list[dict[str, Any]]], list[dict[str, Any] | None]], *, version: str | int | None = None
    ) -> Pipeline:
        """Like ``map_transform`` over a list of records at once: ``fn`` returns one output per record (None drops
        it). Each output must depend on its own record only (batch sizes are execution settings): checked at
        start-up like determinism (docs/operators.md)."""
        return self._with(operators=(*self._spec.operators, Operator.of("map_batch", fn, version)))

    @known_keywords
    def pack_flat(
        self, *, max_length: int, algorithm: str = "wrap", pad_token_id: int | None = None, oversize: str = "split"
    ) -> Pipeline:
        """Pack documents into rows of ``max_length`` tokens (context length + 1); see ``PackSpec``."""
        spec = PackSpec(max_length=max_length, algorithm=algorithm, pad_token_id=pad_token_id, oversize=oversize)
        return self._with(pack=spec)

    @known_keywords
    def pack_samples(self, *, max_cost: int, algorithm: str = "best_fit", oversize: str = "refuse") -> Pipeline:
        """Records grouped into rows at plan time, none costing over ``max_cost`` (docs/records.md)."""
        return self._with(sample_pack=SamplePackSpec(max_cost=max_cost, algorithm=algorithm, oversize=oversize))

    @known_keywords
    def batch(
        self,
        *,
        microbatch_size: int,
        global_batch_size: int | None = None,
        drop_last: bool = False,
        collate: Collate | None = None,
    ) -> Pipeline:
        """Group packed rows into batches of ``microbatch_size`` per rank; see ``BatchSpec``.

        A pipeline without ``.tokenize()`` batches records instead (docs/records.md): ``microbatch_size`` records
        per rank, collated by ``collate`` (default: numbers and equal-shape arrays stacked into tensors, bytes,
        strings and ragged values kept as lists; ``zephon.executor.records.collate``)."""
        check_collate(collate)
        spec = BatchSpec(microbatch_size=microbatch_size, global_batch_size=global_batch_size, drop_last=drop_last)
        return self._with(batch=spec, collate=collate)

    @property
    def plan_dir(self) -> Path:
        """The plan bundle this pipeline runs, planning the work source first if needed."""
        if self._plan_dir is None:
            assert self._work_source is not None
            from zephon.planner.build import PlanOptions
            from zephon.planner.entry import plan_source

            spec, planning = self._spec, self._planning
            options = PlanOptions(
                tokenize=spec.tokenize,
                pack=spec.pack,
                sample_pack=spec.sample_pack,
                operators=spec.operators,
                workers=planning.workers,
                progress=planning.progress,
                materialize_selections=planning.materialize_selections,
            )
            target = plan_source(self._work_source, None, options)
            plan = PlanBundle(target)
            warn_plan(plan.manifest)  # planned now or cached: a shortfall is a zephon.PlanWarning
            self._plan_dir = target
            self._opened = OpenedRun.of(target, plan)
        return self._plan_dir

    def executor_spec(self) -> ExecutorSpec:
        """The pipeline's settings, once ``.tokenize()``, ``.pack_flat()`` and ``.batch()`` are set."""
        return self._spec.ready()

    def geometry(self) -> Geometry:
        """Batch sizes and data-parallel identity of this process."""
        return OpenedRun.geometry(self.executor_spec(), self._fresh().plan)

    def _make_runner(self, worker: tuple[int, int] = (0, 1), pieces: int = 1) -> RankRunner | RecordRunner:
        spec, known = self.executor_spec(), self._known_steps
        return self._fresh().runner(
            spec, state=self._pending_state, stats=self._stats, worker=worker, pieces=pieces, known=known
        )

    def _iteration_runner(self) -> RankRunner | RecordRunner:
        """The runner of an iteration starting at the pending state: the one ``num_steps()`` kept, if it is
        exactly that runner (``KeptRunner.take``), else a new one."""
        kept, self._kept = self._kept, None
        runner = kept.take(self.executor_spec(), self._fresh(), self._pending_state, self._stats) if kept else None
        return runner if runner is not None else self._make_runner()

    def _drop_kept(self, publish: SharedRowGroups | None = None) -> None:
        """Close the runner ``num_steps()`` kept (its decoded shards), if any; with ``publish``, its decoded row
        groups published there first (``KeptRunner.close``)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close(publish)

    def __iter__(self) -> Iterator[Batch | RecordBatch]:
        self._stats = RunStats()
        self._stats_from = self._loader_from = None
        self._followers.seen()
        self._runner = self._iteration_runner()
        if self._pending_state is not None and ends_epoch(self._runner):  # a state at an epoch's end: the next whole
            self._runner.close()
            self._pending_state = None
            self._runner = self._make_runner()
        self._pending_state = None
        return self._batches(self._runner, self._loads)

    def _batches(self, runner: RankRunner | RecordRunner, loads: int) -> Iterator[Batch | RecordBatch]:
        """``runner``'s batches, while no state was loaded since the iteration began (its batches would not follow
        the loaded state: a checkpoint then would record one position while training took others)."""
        batches = iter(runner)
        try:
            for batch in batches:
                if self._loads != loads:
                    raise moved_by_a_load()
                yield batch
        except GeneratorExit:  # a break: the next iteration starts at the plan's start (epochs)
            raise
        except BaseException:  # failed (a read that timed out, a bad document): the next iteration resumes after
            if self._loads == loads and self._runner is runner:  # the last batch yielded, never from the start
                with contextlib.suppress(Exception):  # (a runner that cannot tell: as before, the error alone)
                    self._pending_state = runner.state()
            raise
        finally:
            close = getattr(batches, "close", None)  # a generator's: its threads and open shards, now
            if close is not None:
                close()

    def stats(self) -> RunStats:
        """What this rank handed out in the latest iteration, for every plan kind: documents and tokens per
        dataset, counted as each batch is yielded (never what was read ahead), and the documents skipped under
        ``on_bad_document="skip"`` (``skipped``: by reason; ``skipped_by_shard``) and those ``max_tokens`` cut
        (``truncated``, ``truncated_tokens``: per dataset). See ``RunStats`` and
        docs/training.md. Through ``Pipeline.dataloader()``, once its loader iterates: what the loader handed
        out, from every worker (``zephon.loader_stats``)."""
        return self._stats_from.stats() if self._stats_from is not None else self._stats

    def num_steps(self) -> int:
        """Global steps of the run, before the first batch: every rank yields exactly this many (and ends on the
        same step), at any data-parallel size. Exact plans: their sequences over the global batch; estimated
        plans: computed from the plan's lanes and a calibration all ranks measure alike (docs/training.md). The
        calibrating runner is kept: the next iteration starts on it, reading the shards it decoded."""
        runner = self._iteration_runner()
        try:
            steps = runner.num_steps()
        except BaseException:
            runner.close()  # the calibration's open shards and shard cache pins
            raise
        outputs = getattr(runner, "outputs", None)  # what its operators made of the calibration documents
        self._known_steps = (runner.spec, runner.geometry, steps, outputs)  # the next iteration: not calibrated again
        self._kept = KeptRunner.of(runner, self._pending_state)
        return steps

    # -- checkpointing (the Stateful protocol) -------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the latest iteration stands: JSON-serializable, versioned, carrying the plan hash.

        Under torch.distributed every rank's lane cursors are gathered (a collective: call it on all ranks
        together), so any one rank's state resumes any data-parallel size.
        """
        self._followers.check_visible()  # a to_torch_dataset() iterated in workers since: refused
        loader = self._loader_from() if self._loader_from is not None and self._pending_state is None else None
        if loader is not None:  # a loader's iteration was the latest: where it stands (DataCheckpoint(pipeline))
            return loader.state_dict()
        # a state loaded since the latest iteration is where the next one starts: that, not the latest's position
        runner = self._runner if self._runner is not None and self._pending_state is None else self._make_runner()
        return gather_states(runner.state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume where ``state`` was taken (validated now)."""
        if not isinstance(state, dict):
            hint = ""  # a file's path, or its JSON text
            if isinstance(state, str) and state.lstrip().startswith("{"):
                hint = "; JSON text of one: json.loads(text)"
            elif isinstance(state, str | os.PathLike):
                hint = "; a file of one: json.load(open(path))"
            raise ConfigError(
                f"state must be the dict that state_dict() returned, got {type(state).__name__} — pass a saved "
                f"pipeline.state_dict() (or merge_states([...]) of every rank's){hint}"
            )
        self._drop_kept()  # made for another start
        self._loads += 1  # an iteration under way ends at its next batch (moved_by_a_load)
        self._pending_state = state
        self._make_runner()  # refuses a state of another plan, tokenizer, packing or geometry
        self._followers.load(state)  # loaders and datasets made before: the state reaches them (zephon.followers)

    def to_torch_dataset(self, **training: Any) -> PipelineDataset:
        """A ``torch.utils.data.IterableDataset`` of whole ``batch.to_training(**training)`` dicts, for a
        ``DataLoader(ds, batch_size=None, num_workers=N)``: worker ``w`` yields microbatches ``w, w+N, …`` of the
        iteration, and the DataLoader's in-order fetching restores the pipeline's order for any ``N``. Workers
        tokenize disjoint lanes when ``N`` divides the gradient accumulation; ``dataloader()`` always does
        (``zephon.torch_data``)."""
        from zephon.torch_data import PipelineDataset

        state, self._pending_state = self._pending_state, None  # the dataset's first epoch's (zephon.torch_data)
        dataset = PipelineDataset(self._dataset_runner, training, records=self._spec.records, state=state)
        self._followers.add_dataset(dataset)
        return dataset

    def _dataset_runner(self, state: dict[str, Any] | None, worker: tuple[int, int]) -> RankRunner | RecordRunner:
        """A ``to_torch_dataset()`` worker's runner, starting at ``state`` (in the worker's copy of the pipeline);
        iterated in this process (no DataLoader workers), it is this pipeline's latest: ``state_dict()`` is its."""
        self._pending_state = state
        runner = self._make_runner(worker)
        self._pending_state = None
        if get_worker_info() is None:  # here, not in a worker's copy: state_dict() follows it
            self._runner, self._stats_from, self._loader_from = runner, None, None
            self._followers.seen()
        return runner

    def dataloader(
        self,
        num_workers: int = 0,
        *,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: Any = None,
        timeout: float = 0,
        **training: Any,
    ) -> PipelineLoader:
        """This rank's ``batch.to_training(**training)`` dicts from ``num_workers`` DataLoader workers that own
        disjoint packing lanes — no document is tokenized twice — joined back into whole microbatches; the same
        dicts as iterating the pipeline, for every ``num_workers``. Checkpointable: ``state_dict()`` /
        ``load_state_dict()``. The other arguments are ``torch.utils.data.DataLoader``'s (``zephon.torch_loader``,
        docs/training.md)."""
        from zephon.loader_options import LoaderOptions
        from zephon.torch_loader import PipelineLoader

        options = LoaderOptions(
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            multiprocessing_context=multiprocessing_context,
            timeout=timeout,
        )
        return PipelineLoader(self, options, training)


# Sent to a spawned or forkserver DataLoader worker: its user functions checked first (zephon.user_functions).
ForkingPickler.register(Pipeline, reduce_for_process)
