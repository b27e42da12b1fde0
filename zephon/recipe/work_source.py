"""Work sources: the training curriculum described as configuration (exported by ``zephon.work``).

A work source says which datasets are mixed, in what proportions, how they are shuffled and how much is
read. It holds no data and plans nothing: ``zephon.planner`` turns a ``WorkSource`` into a plan bundle. The
public ``zephon.work.StaticMixtureWorkSource`` is this class with the ``plan()`` convenience that calls the
planner, so the recipe layer never imports an engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

from zephon.checks import is_int, is_number, plain, plain_numbers, require_bool, require_positive
from zephon.errors import ConfigError
from zephon.keywords import known_keywords
from zephon.recipe.dataset import Dataset


@known_keywords
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
        if isinstance(self.weights, Mapping):  # NumPy weights (weights computed with arrays) as Python floats
            object.__setattr__(self, "weights", {name: plain(w) for name, w in self.weights.items()})
        for name, weight in self.weights.items():
            if not is_number(weight, finite=True):
                raise ConfigError(f"mixture weight of {name!r} must be a finite number, got {weight!r} — fix it")
            if weight <= 0:
                raise ConfigError(
                    f"mixture weight of {name!r} must be > 0, got {weight} — remove the dataset from the "
                    "work source instead of giving it weight 0"
                )
        object.__setattr__(self, "weights", dict(self.weights))


@known_keywords
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


@known_keywords
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
        plain_numbers(self, "enabled", "window_shards")
        require_bool(self.enabled, "ShuffleSpec.enabled")
        require_positive(self.window_shards, "ShuffleSpec.window_shards")


PhaseUnit = Literal["fraction", "documents", "tokens", "steps", "cost"]
PHASE_UNITS: tuple[str, ...] = ("fraction", "documents", "tokens", "steps", "cost")


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class Phase:
    """From ``start`` on, the plan mixes by ``mixture`` (until the next phase or the end of the plan).

    The work source's own ``mixture`` is phase 0, from the start of training. Phases compile into the same
    plan: each dataset keeps reading where it stopped (same epoch order, no document repeated early), only
    the proportions change, and each phase's mixture holds in every window inside the phase
    (docs/plans.md, "Phases").

    Attributes:
        start: where the phase begins, in ``unit``.
        mixture: the phase's weights; datasets it does not name get weight 0 (are not read) in the phase.
        unit: ``"fraction"`` of the budget (``num_documents``, ``num_tokens`` or ``num_cost``); ``"documents"``
            (plan positions); ``"tokens"`` (token mixtures: the phase starts with the first document after the
            first ``start`` tokens); ``"cost"`` (cost mixtures, ``mixture_unit="cost"``: the phase starts with the
            first sample after the samples' costs reach ``start``); ``"steps"`` (exact wrap plans: ``start ×
            global_batch_size × max_length`` tokens, so the phase starts in step ``start``).
        global_batch_size: sequences per step, for ``unit="steps"``.

    Example — anneal on a high-quality mix for the last 10 % of a token budget::

        Phase(start=0.9, mixture=MixtureSpec({"web": 0.3, "math": 0.4, "code": 0.3}))
    """

    start: float
    mixture: MixtureSpec
    unit: PhaseUnit = "fraction"
    global_batch_size: int | None = None

    def __post_init__(self) -> None:
        plain_numbers(self, "start", "global_batch_size")
        if self.unit not in PHASE_UNITS:
            raise ConfigError(
                f'Phase unit must be "fraction", "documents", "tokens", "cost" or "steps", got {self.unit!r} — pick one'
            )
        if not isinstance(self.mixture, MixtureSpec):
            raise ConfigError(
                f"Phase mixture must be a MixtureSpec, got {type(self.mixture).__name__} — wrap the weights in "
                "MixtureSpec({...})"
            )
        if not is_number(self.start) or not math.isfinite(self.start) or self.start <= 0:
            raise ConfigError(
                f"Phase start must be a number > 0, got {self.start!r} — phase 0 is the work source's `mixture`"
            )
        if self.unit == "fraction" and self.start >= 1:
            raise ConfigError(
                f"Phase start as a fraction of the budget must be in (0, 1), got {self.start} — e.g. 0.9 for the "
                "last 10 %"
            )
        if self.unit != "fraction" and not is_int(self.start):
            raise ConfigError(
                f'Phase start in {self.unit} must be an integer, got {self.start!r} — round it, or use unit="fraction"'
            )
        if self.unit == "steps":
            g = self.global_batch_size
            if not is_int(g) or g < 1:
                raise ConfigError(
                    f"a Phase in steps must give global_batch_size (sequences per step), got {g!r} — pass it"
                )
        elif self.global_batch_size is not None:
            raise ConfigError(
                f'Phase global_batch_size is only for unit="steps", got {self.global_batch_size!r} with unit '
                f"{self.unit!r} — drop it"
            )


OnExhaustion = Literal["new_epoch", "stop"]


@known_keywords
@dataclass(frozen=True, kw_only=True, slots=True)
class WorkSource:
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
        mixture_unit: ``None`` (samples, or tokens with ``token_estimation``) or ``"cost"``: weights are shares of
            the samples' costs (every dataset needs ``cost=``; docs/records.md#costs-and-packing-samples).
        num_cost: plan samples until their costs reach this many; needs ``mixture_unit="cost"``.
        phases: later mixtures of a curriculum (``Phase``), in order of their start; they need a
            ``num_documents``, ``num_tokens`` or ``num_cost`` budget.
        lanes: estimated plans only. ``None`` (the default): a run packs one lane per row of its global batch,
            so every data-parallel size that divides the global batch gives the same global batches. An
            integer fixes the packing lanes for every run (a data-parallel size must divide it; the global
            batches then do not depend on the global batch size either). See docs/training.md. Exact plans
            need no lanes: any size dividing the global batch works.
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
    lanes: int | None = None
    phases: Sequence[Phase] = ()
    mixture_unit: str | None = None
    num_cost: int | None = None

    def __post_init__(self) -> None:
        plain_numbers(self, "seed", "num_documents", "epochs", "num_tokens", "num_cost", "lanes", "exact_tokens")
        require_bool(self.exact_tokens, "exact_tokens")
        if not isinstance(self.mixture, MixtureSpec):
            raise ConfigError(
                f"mixture must be a MixtureSpec, got {type(self.mixture).__name__} — wrap the weights in "
                "MixtureSpec({...})"
            )
        if isinstance(self.datasets, Dataset | str | bytes | Mapping) or not hasattr(self.datasets, "__iter__"):
            got = "one Dataset" if isinstance(self.datasets, Dataset) else type(self.datasets).__name__
            raise ConfigError(f"datasets must be a list of Dataset, got {got} — pass datasets=[Dataset.from_path(...)]")
        if not isinstance(self.shuffle, ShuffleSpec):
            raise ConfigError(
                f"shuffle must be a ShuffleSpec, got {self.shuffle!r} — pass ShuffleSpec(enabled=True|False) (the "
                "default shuffles)"
            )
        if self.token_estimation is not None and not isinstance(self.token_estimation, TokenEstimation):
            raise ConfigError(
                f"token_estimation must be a TokenEstimation or None, got {self.token_estimation!r} — pass "
                "TokenEstimation() for a token mixture"
            )
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
        if not is_int(self.seed) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.num_documents is not None and self.epochs is not None:
            raise ConfigError(
                f"budget must be num_documents or epochs, got both ({self.num_documents}, {self.epochs}) — drop one"
            )
        if self.num_tokens is not None:
            given = {k: v for k, v in (("num_documents", self.num_documents), ("epochs", self.epochs)) if v is not None}
            if given:
                raise ConfigError(f"budget must be num_tokens alone, got it with {given} — drop one")
            if self.token_estimation is None:
                raise ConfigError(
                    f"num_tokens={self.num_tokens} needs a token mixture, got token_estimation=None — set "
                    "token_estimation (TokenEstimation()), or give the budget as num_documents"
                )
        self._check_cost()
        for label, value in (
            ("num_cost", self.num_cost),
            ("num_documents", self.num_documents),
            ("epochs", self.epochs),
            ("num_tokens", self.num_tokens),
        ):
            require_positive(value, label, optional=True)
        if self.lanes is not None and (not is_int(self.lanes) or not 1 <= self.lanes <= 4096):
            raise ConfigError(
                f"lanes must be None or an integer in [1, 4096], got {self.lanes!r} — leave it unset (one lane per "
                "row of the global batch) or use e.g. 64"
            )
        if isinstance(self.phases, Phase) or not isinstance(self.phases, Sequence):
            raise ConfigError(
                f"phases must be a list of zephon.work.Phase, got {type(self.phases).__name__} — pass "
                "phases=[Phase(...), ...]"
            )
        object.__setattr__(self, "phases", tuple(self.phases))
        self._check_phases(names)
        if self.on_exhaustion not in ("new_epoch", "stop"):
            raise ConfigError(f'on_exhaustion must be "new_epoch" or "stop", got {self.on_exhaustion!r}')

    def _check_cost(self) -> None:
        """A cost mixture: every dataset has a cost, no token estimation; ``num_cost`` alone and only with it."""
        if self.mixture_unit not in (None, "cost"):
            raise ConfigError(
                f'mixture_unit must be None or "cost", got {self.mixture_unit!r} — leave it unset (samples, or tokens '
                'with token_estimation) or write mixture_unit="cost"'
            )
        if self.mixture_unit == "cost":
            if self.token_estimation is not None or self.exact_tokens:
                raise ConfigError(
                    'mixture_unit="cost" must mix records by their costs, got token_estimation/exact_tokens too — '
                    "drop them (a cost mixture has no tokenizer)"
                )
            missing = [ds.name for ds in self.datasets if ds.cost is None]
            if missing:
                raise ConfigError(
                    f'mixture_unit="cost" needs a cost= on every dataset, got none on {missing} — add e.g. '
                    'Dataset.from_path(..., cost="1") for one unit per sample'
                )
        if self.num_cost is None:
            return
        if self.mixture_unit != "cost":
            raise ConfigError(
                f"num_cost={self.num_cost} needs a cost mixture, got mixture_unit={self.mixture_unit!r} — set "
                'mixture_unit="cost", or give the budget as num_documents'
            )
        given = {k: v for k, v in (("num_documents", self.num_documents), ("epochs", self.epochs)) if v is not None}
        if given:
            raise ConfigError(f"budget must be num_cost alone, got it with {given} — drop one")

    def _check_phases(self, names: list[str]) -> None:
        for phase in self.phases:
            if not isinstance(phase, Phase):
                raise ConfigError(f"phases must be zephon.work.Phase values, got {type(phase).__name__} — wrap them")
            unknown = sorted(set(phase.mixture.weights) - set(names))
            if unknown:
                raise ConfigError(
                    f"phase mixture names must be dataset names {names}, got unknown {unknown} — fix the keys"
                )
        if not self.phases:
            return
        if self.num_documents is None and self.num_tokens is None and self.num_cost is None:
            raise ConfigError(
                "phases must come with a num_documents, num_tokens or num_cost budget, got "
                f"{'epochs=' + str(self.epochs) if self.epochs else 'no budget (1 epoch)'} — set one"
            )
        units = sorted({p.unit for p in self.phases})
        if len(units) > 1:
            raise ConfigError(f"phases must share one unit, got {units} — express every start in one unit")
        starts = [p.start for p in self.phases]
        if any(b <= a for a, b in pairwise(starts)):
            raise ConfigError(f"phase starts must strictly increase, got {starts} — order the phases")
        unit = units[0]
        budget = {"documents": self.num_documents, "tokens": self.num_tokens, "cost": self.num_cost}.get(unit)
        if budget is not None and starts[-1] >= budget:
            raise ConfigError(
                f"phase starts must lie inside the budget of {budget} {unit}, got a phase at {starts[-1]} {unit}, "
                "which would never begin — lower its start, raise the budget, or drop the phase"
            )
        if unit == "cost" and self.mixture_unit != "cost":
            raise ConfigError(
                f"phases in cost need a cost mixture, got mixture_unit={self.mixture_unit!r} — set "
                'mixture_unit="cost", or give starts in unit="fraction" or "documents"'
            )
        if self.mixture_unit == "cost" and unit in ("tokens", "steps"):
            raise ConfigError(
                f'phases of a cost mixture must start in unit="cost", "fraction" or "documents", got unit={unit!r} — '
                'a cost mixture has no tokens (its samples\' costs stand where tokens stand): write unit="cost"'
            )
        if unit in ("tokens", "steps") and self.token_estimation is None:
            raise ConfigError(
                f"phases in {unit} need a token mixture, got token_estimation=None — set token_estimation, or give "
                'starts in unit="fraction" or "documents"'
            )
        if unit == "steps" and not self.exact_tokens:
            raise ConfigError(
                "phases in steps need an exact plan (steps are known at plan time only there), got "
                'exact_tokens=False — set exact_tokens=True, or use unit="tokens"'
            )
        sizes = {p.global_batch_size for p in self.phases}
        if len(sizes) > 1:
            raise ConfigError(f"phases in steps must share one global_batch_size, got {sorted(sizes)} — pick one")

    def budget(self) -> dict[str, int | None]:
        budget = {"num_documents": self.num_documents, "epochs": self.epochs, "num_tokens": self.num_tokens}
        if self.num_cost is not None:  # only then: other plans keep their config and hash
            budget["num_cost"] = self.num_cost
        return budget
