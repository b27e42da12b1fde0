"""One run, opened once per process: a pipeline's checked plan bundle and its encoder (``OpenedRun``).

A ``Pipeline`` asks for its bundle and encoder from ``num_steps``, ``load_state_dict``, ``state_dict``, iteration
and ``to_torch_dataset``; all of them share what ``OpenedRun.current`` returns. Invariant: in one process the
bundle is opened (and verified) once, and checked again only when one of its files changed since (a stat of
each, ``PlanBundle.changed``); the encoder is built once per tokenizer settings (``encoder_for``). Another
process (a DataLoader worker, a forked child) opens its own: an ``OpenedRun`` is never used outside the process
that opened it.

Example: ``Pipeline.from_plan(p)``, then ``num_steps()``, ``load_state_dict(s)`` and iterating → one
``PlanBundle(p)`` and one ``make_encoder`` call (tests/executor/test_one_run.py counts them).

The runner ``num_steps()`` calibrated is kept too (``KeptRunner``): the next iteration of the same pipeline — or
of the loader made from it — takes it, with the shards its calibration decoded, instead of decoding them again.
Invariant: a kept runner is taken only by an iteration it is exactly the fresh runner of — this process, the
same bundle object, an equal spec and geometry, the same start state object — and at most once; any other use
closes it (its open shards and pins released) and makes a new one. Example: ``p.num_steps()`` then ``for b in
p`` → one ``ShardAccess``; ``p.num_steps()`` then ``for b in p.options(read_chunk=64)`` → two, the first closed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError
from zephon.executor.encode.encoders import AnyEncoder, for_stores, make_encoder
from zephon.executor.geometry import Geometry
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.read.shared_groups import SharedRowGroups
from zephon.executor.records.runner import RecordRunner
from zephon.executor.runner import RankRunner
from zephon.executor.settings import ExecutorSpec, RunStats
from zephon.executor.state import check_run_batch

__all__ = ["KeptRunner", "OpenedRun", "ends_epoch", "moved_by_a_load"]


@dataclasses.dataclass(kw_only=True, slots=True)
class OpenedRun:
    """What this process opened for a pipeline: the checked bundle, and the encoder for the settings ``key``."""

    pid: int
    plan_dir: Path
    plan: PlanBundle
    key: tuple[object, ...] | None = None
    encoder: AnyEncoder | None = None

    @classmethod
    def of(cls, plan_dir: Path, plan: PlanBundle) -> OpenedRun:
        """A bundle this process has just opened and checked."""
        return cls(pid=os.getpid(), plan_dir=plan_dir, plan=plan)

    @classmethod
    def current(cls, opened: OpenedRun | None, plan_dir: Callable[[], Path]) -> OpenedRun:
        """``opened`` if this process opened it for ``plan_dir()`` (checked again if its files changed since),
        else the bundle opened now. ``plan_dir`` is called only when needed (it may plan a work source)."""
        if opened is None or opened.pid != os.getpid():
            where = plan_dir()
            return cls.of(where, PlanBundle(where))
        where = plan_dir()
        if opened.plan_dir != where:
            return cls.of(where, PlanBundle(where))
        if opened.plan.changed():  # edited, damaged or replaced since it was checked: checked again
            opened.plan = PlanBundle(opened.plan_dir)
        return opened

    def encoder_for(self, spec: ExecutorSpec) -> AnyEncoder:
        """The encoder for ``spec``, built once in this process (again only when its settings change)."""
        key = (spec.tokenize, spec.operators, spec.tokenizer_threads)
        if self.encoder is None or self.key != key:
            assert spec.tokenize is not None  # spec.ready()
            encoder = make_encoder(spec.tokenize, spec.operators, threads=spec.tokenizer_threads)
            self.encoder = for_stores(encoder, self.plan.manifest.datasets)  # a store's loss mask: flagged ids
            self.key = key
        return self.encoder

    @staticmethod
    def geometry(spec: ExecutorSpec, plan: PlanBundle) -> Geometry:
        """Batch sizes and data-parallel identity of this process for ``spec`` over ``plan``."""
        rank, size = spec.rank()
        manifest = plan.manifest
        assert spec.batch is not None  # spec.ready()
        b = spec.batch.microbatch_size
        g = spec.batch.global_batch_size or b * size
        check_run_batch(manifest, g, records=spec.records)  # a continued plan: the batch its branch was made for
        exact = manifest.exact or spec.records  # a record run has no packing lanes (docs/records.md)
        return Geometry.for_plan(
            microbatch=b, global_batch=g, dp_size=size, dp_rank=rank, exact=exact, plan_lanes=manifest.lanes
        )

    def runner(
        self,
        spec: ExecutorSpec,
        *,
        state: dict[str, Any] | None,
        stats: RunStats,
        worker: tuple[int, int] = (0, 1),
        pieces: int = 1,
        known: tuple[ExecutorSpec, Geometry, int, str | None] | None = None,
    ) -> RankRunner | RecordRunner:
        """This process's runner of ``spec`` over the opened bundle, from ``state``; ``known``: a ``num_steps()``
        an earlier runner of the same spec and geometry computed (then not calibrated again)."""
        geometry = self.geometry(spec, self.plan)
        if spec.records:  # a pipeline without .tokenize() (docs/records.md)
            if pieces != 1:
                raise ConfigError(
                    "Pipeline.dataloader() must run a text pipeline (it splits packing lanes among workers), got a "
                    "record pipeline — use DataLoader(pipeline.to_torch_dataset(), batch_size=None, num_workers=N)"
                )
            return RecordRunner(self.plan, spec, geometry, state=state, stats=stats, worker=worker)
        same = known is not None and known[:2] == (spec, geometry)
        return RankRunner(
            self.plan,
            spec,
            geometry,
            encoder=self.encoder_for(spec),
            state=state,
            stats=stats,
            worker=worker,
            pieces=pieces,
            known_steps=known[2] if same else None,
            known_outputs=known[3] if same else None,
        )


@dataclasses.dataclass(kw_only=True, slots=True)
class KeptRunner:
    """A runner ``Pipeline.num_steps()`` calibrated, kept for the next iteration (module docstring): ``start`` is
    the state it was made to start from (compared by identity), ``pid`` the process that made it."""

    runner: RankRunner
    start: dict[str, Any] | None
    pid: int

    @classmethod
    def of(cls, runner: RankRunner | RecordRunner, start: dict[str, Any] | None) -> KeptRunner | None:
        """``runner`` kept, or None (closed) for a record runner, which calibrates nothing, and for one holding
        shard cache pins: a ``num_steps()`` alone must leave the shared cache free to evict (the next iteration
        then downloads nothing again, it only reopens its copies)."""
        if not isinstance(runner, RankRunner) or (runner.reader is not None and runner.reader.pins):
            runner.close()
            return None
        return cls(runner=runner, start=start, pid=os.getpid())

    def fits(self, spec: ExecutorSpec, opened: OpenedRun, start: dict[str, Any] | None) -> bool:
        """Whether a fresh runner of ``spec`` over ``opened`` from ``start`` would be this one."""
        r = self.runner
        return (
            self.pid == os.getpid()
            and self.start is start
            and r.plan is opened.plan
            and r.spec == spec
            and r.geometry == OpenedRun.geometry(spec, opened.plan)
        )

    def take(
        self, spec: ExecutorSpec, opened: OpenedRun, start: dict[str, Any] | None, stats: RunStats
    ) -> RankRunner | None:
        """The runner, counting into ``stats``, if it fits; else None, the runner closed."""
        if self.fits(spec, opened, start):
            self.runner.stats = stats
            return self.runner
        self.close()
        return None

    def close(self, publish: SharedRowGroups | None = None) -> None:
        """Release the runner's open shards and pins (not in another process: they are its parent's). With
        ``publish`` (the share of the DataLoader workers about to start), the Parquet row groups the calibration
        decoded are published to it first, so the workers map them instead of decoding them again
        (``ShardReader.publish_decoded``)."""
        if self.pid == os.getpid():
            reader = self.runner.reader
            if publish is not None and reader is not None:
                reader.publish_decoded(publish)
            self.runner.close()


def ends_epoch(runner: RankRunner | RecordRunner) -> bool:
    """Whether ``runner`` starts where its run ends: a state taken after an epoch's last batch (every step done,
    none begun). Its iteration would yield nothing — an epoch a framework counts would pass with no data (a
    Lightning run resumed from the checkpoint at an epoch's end skipped the next epoch) — so the pipeline and its
    loader start the next epoch whole instead, as torchdata's ``StatefulDataLoader`` does."""
    return not runner.progress.microbatch and runner.progress.step == runner.num_steps()  # past it: refused


def moved_by_a_load() -> ConfigError:
    """The refusal of an iteration that went on after ``load_state_dict``: its batches follow the position it
    started at, not the loaded one."""
    return ConfigError(
        "an iteration must end when load_state_dict() moves the pipeline or loader to another position, got next() "
        "on one begun before the load — start a new iteration (for batch in ...) after loading a state"
    )
