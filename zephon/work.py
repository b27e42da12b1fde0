"""``zephon.work``: the seed API's work sources, mixtures, phases and token estimation.

The configuration types live in ``zephon.recipe.work_source``; this module exports them under the seed
API's names and adds what joins a recipe to the planner: ``StaticMixtureWorkSource.plan()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from zephon.recipe.work_source import (
    MixtureSpec,
    OnExhaustion,
    Phase,
    PhaseUnit,
    ShuffleSpec,
    TokenEstimation,
    WorkSource,
)
from zephon.specs import PackSpec, TokenizeSpec

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
    ) -> Path:
        """Write this curriculum as a plan bundle in ``out_dir`` and return its path.

        ``tokenize`` is needed for token mixtures and exact plans, ``pack`` for exact plans; ``workers`` steers
        the count pass of exact plans; ``progress`` the bars of long steps (``None``: on a terminal only, see
        ``zephon.storage.progress``). The planner (Polars, DuckDB) is imported here, on first use, so that
        making a work source stays light.
        """
        from zephon.planner.build import write_plan

        return write_plan(
            self,
            Path(out_dir),
            tokenize=tokenize,
            pack=pack,
            overwrite=overwrite,
            workers=workers,
            progress=progress,
            operators=operators,
        )
