"""``zephon.work``: the documented API's work sources, mixtures, phases and token estimation.

The configuration types live in ``zephon.recipe.work_source``; this module exports them under the
documented API's names and adds what joins a recipe to the planner: ``StaticMixtureWorkSource.plan()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from zephon.checks import local_directory
from zephon.keywords import known_keywords
from zephon.recipe.work_source import (
    MixtureSpec,
    OnExhaustion,
    Phase,
    PhaseUnit,
    ShuffleSpec,
    TokenEstimation,
    WorkSource,
)
from zephon.specs import PackSpec, SamplePackSpec, TokenizeSpec

if TYPE_CHECKING:
    from zephon.executor.operators import Operator

__all__ = [
    "MixtureSpec",
    "OnExhaustion",
    "Phase",
    "PhaseUnit",
    "ShuffleSpec",
    "StaticMixtureWorkSource",
    "TokenEstimation",
]


class StaticMixtureWorkSource(WorkSource):
    __doc__ = WorkSource.__doc__
    __slots__ = ()

    @known_keywords
    def plan(
        self,
        out_dir: str | Path,
        *,
        tokenize: TokenizeSpec | None = None,
        pack: PackSpec | None = None,
        overwrite: bool = False,
        workers: int | None = None,
        progress: bool | None = None,
        operators: tuple[Operator, ...] = (),
        continue_from: str | Path | None = None,
        at_step: int | None = None,
        global_batch: int | None = None,
        state: dict[str, Any] | None = None,
        materialize_selections: bool = False,
        sample_pack: SamplePackSpec | None = None,
        engine: str = "local",
    ) -> Path:
        """Write this curriculum as a plan bundle in ``out_dir`` and return its path.

        ``tokenize`` is needed for token mixtures and exact plans, ``pack`` for exact plans; ``workers`` steers
        the count pass of exact plans; ``progress`` the bars of long steps (``None``: on a terminal only, see
        ``zephon.storage.progress``). The planner (Polars, DuckDB) is imported here, on first use, so that
        making a work source stays light.

        ``continue_from``: continue the run of that plan on this configuration (docs/training.md,
        ``zephon.planner.continuation.child``): the new plan's first ``at_step`` global steps of ``global_batch`` rows
        are the parent's, byte for byte, and the rest follows this work source. An estimated parent needs the
        run's checkpoint ``state`` at the branch step (``Pipeline.state_dict()``, all lanes); an exact one
        ``at_step`` and ``global_batch``, or a ``state``.

        ``materialize_selections``: also write into the bundle a compact copy of the rows the plan reads from
        each shard of a dataset with a selection (``where``, ``metadata``, ``dedup_on``); runs read those instead
        of the source, so a selective plan decodes no more per token than a plan without selection. The plan —
        and every batch — is the same either way (docs/curricula.md, ``zephon.planner.copies``).

        ``sample_pack``: records grouped into rows by cost (``Pipeline.pack_samples``, docs/records.md).
        ``engine="ray"``: the footer scan, a partitioned sidecar join and the count pass run as Ray tasks on the
        cluster of ``RAY_ADDRESS`` (else a local Ray instance of ``workers`` CPUs); the same bundle (docs/ray.md).
        """
        from zephon.planner.build import PlanOptions
        from zephon.planner.entry import plan_source

        options = PlanOptions(
            tokenize=tokenize,
            pack=pack,
            operators=operators,
            overwrite=overwrite,
            workers=workers,
            progress=progress,
            materialize_selections=materialize_selections,
            sample_pack=sample_pack,
            engine=engine,
        )
        out = local_directory(  # a file there, or above it, planner.build refuses in its own words
            out_dir, "plan out_dir", example="'plans/web'", file_ok=True,
            remote_fix="a plan bundle is written locally; copy it where the ranks read it afterwards",
        )  # fmt: skip
        return plan_source(
            self,
            Path(out),
            options,
            continue_from=continue_from,
            at_step=at_step,
            global_batch=global_batch,
            state=state,
        )

