"""Work sources: the training curriculum described as configuration (``zephon.work``).

A work source says which datasets are mixed, in what proportions, how they are shuffled and how much is
read. It holds no data: ``zephon.planner`` turns it into a plan bundle (``StaticMixtureWorkSource.plan``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from zephon.errors import ConfigError
from zephon.io import Dataset

if TYPE_CHECKING:
    from zephon.executor.engine import PackSpec
    from zephon.executor.tokenize import TokenizeSpec


@dataclass(frozen=True, slots=True)
class MixtureSpec:
    """Target proportions per dataset name, e.g. ``MixtureSpec({"web": 0.7, "code": 0.3})``.

    Weights are normalized to sum to 1; each must be a finite number > 0.
    """

    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ConfigError(
                f"mixture must be a non-empty mapping of dataset name to weight, got {self.weights!r} — "
                'pass e.g. MixtureSpec({"web": 0.7, "code": 0.3})'
            )
        for name, weight in self.weights.items():
            if not isinstance(weight, int | float) or isinstance(weight, bool) or not math.isfinite(weight):
                raise ConfigError(f"mixture weight of {name!r} must be a finite number, got {weight!r} — fix it")
            if weight <= 0:
                raise ConfigError(
                    f"mixture weight of {name!r} must be > 0, got {weight} — remove the dataset from the "
                    "work source instead of giving it weight 0"
                )
        object.__setattr__(self, "weights", dict(self.weights))


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenEstimation:
    """Mix by tokens instead of documents, estimating each document's tokens (see docs/plans.md).

    Attributes:
        primer: ``"measure"`` (tokenize a seeded calibration sample), a float tokens-per-byte ratio for all
            datasets, or a dict of ratios per dataset name.
        calibration_samples: documents tokenized per dataset when measuring.
        calibration_shards_max: shards sampled per dataset when measuring.
        token_count_columns: dataset name → a Parquet column with each document's token count (e.g.
            FineWeb's ``token_count``), used instead of an estimate for that dataset.
    """

    primer: str | float | Mapping[str, float] = "measure"
    calibration_samples: int = 2048
    calibration_shards_max: int = 4
    token_count_columns: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.primer, Mapping):
            object.__setattr__(self, "primer", dict(self.primer))
            bad = {k: v for k, v in self.primer.items() if not isinstance(v, int | float) or v <= 0}
            if bad:
                raise ConfigError(f"TokenEstimation.primer ratios must be numbers > 0, got {bad} — fix them")
        elif not isinstance(self.primer, str) and (not isinstance(self.primer, int | float) or self.primer <= 0):
            raise ConfigError(f"TokenEstimation.primer as a ratio must be > 0, got {self.primer!r}")
        if self.token_count_columns is not None:
            object.__setattr__(self, "token_count_columns", dict(self.token_count_columns))
        if isinstance(self.primer, str) and self.primer != "measure":
            raise ConfigError(f'TokenEstimation.primer must be "measure", a float or a dict, got {self.primer!r}')
        if self.calibration_samples < 1 or self.calibration_shards_max < 1:
            raise ConfigError(
                "TokenEstimation.calibration_samples and calibration_shards_max must be ≥ 1, got "
                f"{self.calibration_samples} and {self.calibration_shards_max} — raise them"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class ShuffleSpec:
    """How documents are shuffled, per dataset and epoch, from the work source's seed.

    Attributes:
        enabled: False keeps shards in path order and rows in file order.
        window_shards: rows are shuffled within windows of this many consecutive shards (after the shard
            order is shuffled). The executor holds about this many shards per dataset in memory; 1 shuffles
            rows within each shard only.
    """

    enabled: bool = True
    window_shards: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.window_shards, int) or self.window_shards < 1:
            raise ConfigError(f"ShuffleSpec.window_shards must be an integer ≥ 1, got {self.window_shards!r}")


OnExhaustion = Literal["new_epoch", "stop"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StaticMixtureWorkSource:
    """A fixed mixture of datasets, interleaved so that every prefix of the plan holds the proportions.

    Attributes:
        datasets: the datasets, each with a unique name.
        mixture: weight per dataset name; every dataset needs one.
        seed: the only source of randomness (shuffles); a non-negative integer.
        token_estimation: when set, weights are token shares (not available in this build yet).
        num_documents: plan exactly this many documents. Exclusive with ``epochs`` and ``num_tokens``.
        num_tokens: plan documents until their (estimated or exact) tokens reach this many; needs
            ``token_estimation``.
        epochs: plan until every dataset has completed this many passes (default 1 when neither budget is
            given); datasets that finish earlier keep repeating to hold the mixture.
        on_exhaustion: ``"new_epoch"`` starts a dataset's next pass with a fresh permutation when it runs
            out; ``"stop"`` ends the plan just before any dataset would need more than ``epochs`` passes
            (1 when only ``num_documents`` is given).
        shuffle: shuffle settings.
        exact_tokens: run the count pass (tokenize every document once, cached) and write an exact plan:
            token counts and stream offsets per document, packing decided in the plan. With
            ``token_estimation`` set, token shares are scheduled by the exact counts.
        lanes: estimated plans only: documents are dealt to this many packing lanes, each packed on its own
            at train time, so a data-parallel size that divides ``lanes`` gives the same global batches
            (see docs/training.md). Exact plans need no lanes: any size dividing the global batch works.
    """

    datasets: Sequence[Dataset]
    mixture: MixtureSpec
    seed: int
    token_estimation: TokenEstimation | None = None
    num_documents: int | None = None
    epochs: int | None = None
    num_tokens: int | None = None
    on_exhaustion: OnExhaustion = "new_epoch"
    shuffle: ShuffleSpec = field(default_factory=ShuffleSpec)
    exact_tokens: bool = False
    lanes: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "datasets", tuple(self.datasets))
        if not self.datasets:
            raise ConfigError("datasets must hold at least one Dataset, got none — add Dataset.from_path(...)")
        for ds in self.datasets:
            if not isinstance(ds, Dataset):
                raise ConfigError(f"datasets must be zephon.io.Dataset objects, got {type(ds).__name__}")
        names = [ds.name for ds in self.datasets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"dataset names must be unique, got {dupes} more than once — rename them")
        unknown = sorted(set(self.mixture.weights) - set(names))
        if unknown:
            raise ConfigError(
                f"mixture names must be dataset names {names}, got unknown {unknown} — fix the mixture keys"
            )
        missing = [n for n in names if n not in self.mixture.weights]
        if missing:
            raise ConfigError(f"mixture must give a weight to every dataset, got none for {missing} — add them")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.num_documents is not None and self.epochs is not None:
            raise ConfigError(
                f"budget must be num_documents or epochs, got both ({self.num_documents}, {self.epochs}) — drop one"
            )
        for label, value in (("num_documents", self.num_documents), ("epochs", self.epochs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{label} must be an integer ≥ 1, got {value!r}")
        if not isinstance(self.lanes, int) or isinstance(self.lanes, bool) or not 1 <= self.lanes <= 4096:
            raise ConfigError(f"lanes must be an integer in [1, 4096], got {self.lanes!r} — use e.g. 8 or 64")
        if self.on_exhaustion not in ("new_epoch", "stop"):
            raise ConfigError(f'on_exhaustion must be "new_epoch" or "stop", got {self.on_exhaustion!r}')

    def budget(self) -> dict[str, int | None]:
        return {"num_documents": self.num_documents, "epochs": self.epochs, "num_tokens": self.num_tokens}

    def plan(
        self,
        out_dir: str | Path,
        *,
        tokenize: TokenizeSpec | None = None,
        pack: PackSpec | None = None,
        overwrite: bool = False,
        workers: int | None = None,
        progress: bool = False,
    ) -> Path:
        """Write this curriculum as a plan bundle in ``out_dir`` and return its path.

        ``tokenize`` is needed for token mixtures and exact plans, ``pack`` for exact plans; ``workers`` and
        ``progress`` steer the count pass of exact plans.
        """
        from zephon.planner.build import write_plan

        return write_plan(
            self, Path(out_dir), tokenize=tokenize, pack=pack, overwrite=overwrite, workers=workers, progress=progress
        )
