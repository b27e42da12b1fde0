"""``zephon.Pipeline``: the seed API over the planner and the executor.

``Pipeline(work_source)`` plans on first iteration: the work source is scanned, its normalized config hashed,
and the bundle written to ``$ZEPHON_CACHE_DIR/plans/<config hash>`` unless a bundle with that hash is
already there. ``Pipeline.from_plan(path)`` runs a bundle written by ``zephon plan``. Both run the same
executor (``zephon.executor.engine``). The builder methods return new pipelines; a Pipeline is immutable.
The planner (and with it Polars and DuckDB) is imported only when a work source must be planned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from zephon.errors import ConfigError
from zephon.executor.batch import Batch
from zephon.executor.engine import BatchSpec, ExecutorSpec, PackSpec, RunStats, iterate_batches
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.tokenize import TokenizeSpec
from zephon.io import StoreOptions
from zephon.shard_scan import cache_dir

if TYPE_CHECKING:
    from zephon.work import StaticMixtureWorkSource


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Steps:
    io: StoreOptions = dataclasses.field(default_factory=StoreOptions)
    tokenize: TokenizeSpec | None = None
    pack: PackSpec | None = None
    batch: BatchSpec | None = None


class Pipeline:
    """An iterable of training batches that follows a plan."""

    def __init__(self, work_source: StaticMixtureWorkSource | None = None, *, _plan_dir: Path | None = None):
        if work_source is None and _plan_dir is None:
            raise ConfigError("Pipeline needs a work source, got None — pass StaticMixtureWorkSource(...)")
        self._work_source = work_source
        self._plan_dir = _plan_dir
        self._steps = _Steps()

    @classmethod
    def from_plan(cls, path: str | Path) -> Pipeline:
        """A pipeline over a plan bundle written by ``zephon plan`` (validated now)."""
        PlanBundle(path)
        return cls(_plan_dir=Path(path))

    def _with(self, **changes: object) -> Pipeline:
        new = Pipeline.__new__(Pipeline)
        new._work_source = self._work_source
        new._plan_dir = self._plan_dir
        new._steps = dataclasses.replace(self._steps, **changes)
        return new

    def options(self, *, io_options: StoreOptions | None = None) -> Pipeline:
        """Execution options; they never change the data."""
        if io_options is not None and not isinstance(io_options, StoreOptions):
            raise ConfigError(f"io_options must be zephon.io.StoreOptions, got {type(io_options).__name__}")
        return self._with(io=io_options or self._steps.io)

    def tokenize(
        self,
        *,
        tokenizer_id: str,
        field: str = "text",
        add_bos: bool | None = None,
        eos_token: str | None = None,
    ) -> Pipeline:
        """Tokenize ``field`` with a Hugging Face tokenizer, appending EOS (see zephon.executor.tokenize)."""
        spec = TokenizeSpec(tokenizer_id=tokenizer_id, field=field, add_bos=add_bos, eos_token=eos_token)
        return self._with(tokenize=spec)

    def pack_flat(
        self, *, max_length: int, algorithm: str = "wrap", pad_token_id: int | None = None, oversize: str = "split"
    ) -> Pipeline:
        """Pack documents into rows of ``max_length`` tokens (context length + 1); see ``PackSpec``."""
        spec = PackSpec(max_length=max_length, algorithm=algorithm, pad_token_id=pad_token_id, oversize=oversize)
        return self._with(pack=spec)

    def batch(self, *, microbatch_size: int, drop_last: bool = False) -> Pipeline:
        """Group packed rows into batches of ``microbatch_size``."""
        return self._with(batch=BatchSpec(microbatch_size=microbatch_size, drop_last=drop_last))

    @property
    def plan_dir(self) -> Path:
        """The plan bundle this pipeline runs, planning the work source first if needed."""
        if self._plan_dir is None:
            assert self._work_source is not None
            from zephon.planner.build import prepare, write_bundle

            prepared = prepare(self._work_source, tokenize=self._steps.tokenize, pack=self._steps.pack)
            target = cache_dir() / "plans" / prepared.config_hash
            if not (target / "plan.json").is_file():
                write_bundle(prepared, target, overwrite=True)
            self._plan_dir = target
        return self._plan_dir

    def executor_spec(self) -> ExecutorSpec:
        missing = [
            name
            for name, value in (
                ("tokenize", self._steps.tokenize),
                ("pack_flat", self._steps.pack),
                ("batch", self._steps.batch),
            )
            if value is None
        ]
        if missing:
            raise ConfigError(
                f"Pipeline must have .tokenize(), .pack_flat() and .batch() before iterating, got none for "
                f"{', '.join(missing)} — add {missing[0]}(...)"
            )
        assert self._steps.tokenize and self._steps.pack and self._steps.batch
        return ExecutorSpec(
            tokenize=self._steps.tokenize, pack=self._steps.pack, batch=self._steps.batch, io=self._steps.io
        )

    def __iter__(self) -> Iterator[Batch]:
        spec = self.executor_spec()
        self._stats = RunStats()
        return iterate_batches(self.plan_dir, spec, self._stats)

    def stats(self) -> RunStats:
        """Documents and realized tokens per dataset read by the latest iteration (estimated plans; an exact
        plan's shares are in its plan.json)."""
        return getattr(self, "_stats", None) or RunStats()
