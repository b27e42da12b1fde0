"""What a mixture audit is asked (``AuditSpec``) and what it finds (``AuditResult``, per dataset ``DatasetAudit``,
per phase ``PhaseAudit``); the algorithm is ``zephon.inspection.audit`` (its docstring has the worked example),
which exports these under its own name too."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from zephon.checks import require_positive
from zephon.errors import ConfigError

__all__ = ["AuditResult", "AuditSpec", "DatasetAudit", "PhaseAudit", "Unit"]

Unit = Literal["samples", "tokens", "cost"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditSpec:
    """What to audit."""

    #: Global batch in sequences (``None``: plan.json ``batch.global_batch_size``, else an error).
    batch_size: int | None = None
    #: Tokens per sequence, for estimated token plans (exact plans fix it).
    max_length: int | None = None
    #: Steps per sliding window.
    window: int = 100
    #: Allowed deviation of a window's share from the target, in percentage points.
    tolerance_pp: float = 1.0
    #: ``samples``, ``tokens`` or ``cost`` (record plans with costs); ``None``: the plan's mixture unit.
    by: Unit | None = None
    #: Datasets with a smaller weight are reported but never violate.
    min_weight: float = 0.05

    def __post_init__(self) -> None:
        require_positive(self.window, "window", unit="steps", fix="pass e.g. --window 100")
        if (
            not isinstance(self.tolerance_pp, int | float)
            or not math.isfinite(self.tolerance_pp)
            or self.tolerance_pp < 0
        ):
            raise ConfigError(
                f"tolerance_pp must be a finite number ≥ 0 (percentage points), got {self.tolerance_pp!r} — "
                "pass e.g. --tolerance 1"
            )
        if self.by not in (None, "samples", "tokens", "cost"):
            raise ConfigError(
                f"by must be 'samples', 'tokens' or 'cost', got {self.by!r} — pass --by samples, tokens or cost"
            )
        if not 0 <= self.min_weight <= 1:
            raise ConfigError(f"min_weight must be in [0, 1], got {self.min_weight!r} — pass e.g. 0.05")


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetAudit:
    """One dataset's target, overall share and worst window (shares are fractions, deviations too)."""

    dataset_id: int
    name: str
    weight: float
    target: float
    overall_share: float
    worst_share: float
    #: First and last step (inclusive) of the window whose share is furthest from the target.
    worst_first_step: int
    worst_last_step: int
    #: ``worst_share - target``.
    worst_deviation: float
    #: ``weight ≥ min_weight``: only checked datasets can violate.
    checked: bool
    violated: bool


class _Verdict:
    """``violations`` and ``ok`` of an audit part that holds ``datasets``."""

    __slots__ = ()
    datasets: tuple[DatasetAudit, ...]

    @property
    def violations(self) -> tuple[DatasetAudit, ...]:
        return tuple(d for d in self.datasets if d.violated)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseAudit(_Verdict):
    """The audit of one phase of a phased plan (positions ``[first_position, end_position)``)."""

    index: int
    first_position: int
    end_position: int
    #: Steps holding the phase's documents (a boundary step belongs to both phases).
    first_step: int
    last_step: int
    window: int
    windows: int
    datasets: tuple[DatasetAudit, ...]
    #: The lineage segment of a continued plan's phase (each segment is checked against its own target);
    #: None in plans without lineage.
    segment: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditResult(_Verdict):
    """The audit of one plan; ``ok`` when no checked dataset leaves the tolerance in any window."""

    plan: str
    by: Unit
    #: ``exact`` or ``estimated`` when auditing tokens; ``None`` for samples.
    tokens_are: str | None
    #: ``weights`` (the mixture's) or ``overall`` (the plan's own shares, when ``by`` is not the mixture unit).
    target_source: str
    batch_size: int
    max_length: int | None
    steps: int
    #: Steps per window actually used (``min(window, steps)``; phased plans: the widest phase's) and the
    #: number of windows (all phases).
    window: int
    windows: int
    tolerance_pp: float
    min_weight: float
    datasets: tuple[DatasetAudit, ...]
    #: Per phase, for phased plans (empty otherwise).
    phases: tuple[PhaseAudit, ...] = ()
    #: First step of each window, each dataset's share in it and its target there (``windows × datasets``).
    window_first_step: np.ndarray = field(repr=False, compare=False)
    window_shares: np.ndarray = field(repr=False, compare=False)
    window_targets: np.ndarray = field(repr=False, compare=False)
    #: Exact plans: the packing (``wrap``, ``best_fit``, ``homogeneous``), and what it guarantees per window.
    packing: str | None = None
    #: Homogeneous packing: every window's share is within this many pp of its target (two rows of the
    #: window: ``window_bound_rows`` / (window × batch)); None for other packings, which bound nothing.
    bound_pp: float | None = None
    #: Exact plans: the longest document as pp of a window's tokens — how far one document can move a window
    #: of a packing that places whole documents (wrap, best fit).
    longest_document_pp: float | None = None
