"""plan.json's nested records (datasets, mixture, tokenizer, packing, shuffle, budget, files, totals, warnings,
sources, selection copies): the one declaration each is read from and written by (``zephon.plan.json_record``).

Field names are the JSON keys, in the order the planner writes them; ``key(...)`` says what each must hold and
what its absence means. docs/plan-format.md says what each key means; ``zephon.plan.manifest`` holds the top
object, ``zephon.plan.manifest_phases`` the phases and the lineage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from zephon.plan.format import SHARDS_FILE
from zephon.plan.json_fields import (
    COUNT,
    FLAG,
    NAME,
    NUMBER,
    POSITIVE,
    TEXT,
    JsonObject,
    Value,
    json_mapping,
    mapping_of,
    one_of,
    texts,
)
from zephon.plan.json_record import key, read_record, record, records

__all__ = [
    "COUNTS",
    "STORES_ONLY",
    "WEIGHTS",
    "PlanBatch",
    "PlanBudget",
    "PlanCopies",
    "PlanDataset",
    "PlanFiles",
    "PlanMixture",
    "PlanPacking",
    "PlanShuffle",
    "PlanSource",
    "PlanTokenizer",
    "PlanTotals",
    "PlanWarningEntry",
    "SourceReads",
    "empty",
    "read_dataset",
]


def empty() -> Mapping[str, Any]:
    return MappingProxyType({})


#: Dataset names to numbers (weights), and to integers ≥ 0 (documents, tokens); read-only mappings.
WEIGHTS = mapping_of(NUMBER, "an object of dataset names to numbers")
COUNTS = mapping_of(COUNT, "an object of dataset names to integers ≥ 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanDataset:
    """One entry of ``datasets``, in work-source order; ``planned_tokens`` and its share with token counts only."""

    id: int = key(COUNT)
    name: str = key(TEXT)
    path: str = key(TEXT)
    pinned: str = key(TEXT)
    format: str | None = key(TEXT.or_null())
    fingerprint: str = key(TEXT)
    shards: int = key(COUNT)
    first_shard_id: int | None = key(COUNT.optional())
    rows: int = key(COUNT)
    weight: float = key(NUMBER)
    planned_documents: int = key(COUNT)
    epochs_started: int | None = key(COUNT.optional())
    passes_completed: int | None = key(COUNT.optional())
    #: The dataset's selection by metadata as JSON (query, sidecar fingerprint, counts: the config's own
    #: entry, ``zephon.recipe.selection``); ``None`` without one.
    selection: Mapping[str, Any] | None = key(json_mapping().optional())
    planned_tokens: int | None = key(COUNT.optional())
    planned_token_share: float | None = key(NUMBER.optional())
    #: A token store's options as the executor opens it again (``fmt``, ``tokenizer``, ``tokens_field``, ``dtype``,
    #: ``eos_token_id``, ``bos_token_id``: ``zephon.recipe.token_store``); ``None`` for raw text.
    token_store: Mapping[str, Any] | None = key(json_mapping().optional())
    #: Exact plans with user operators: scheduled documents a ``map_transform`` / ``map_batch`` dropped (rows of
    #: ``samples.parquet`` with 0 tokens, in no sequence); ``None`` in plans without operators.
    dropped_by_operators: int | None = key(COUNT.optional())

    @property
    def documents(self) -> int:
        """Documents one pass reads: the selected rows, or every row."""
        return int(self.selection["selected"]) if self.selection is not None else self.rows


def read_dataset(o: JsonObject) -> PlanDataset:
    """A ``datasets`` entry; ``planned_tokens`` comes with its share."""
    entry = read_record(PlanDataset, o)
    if entry.planned_tokens is not None and entry.planned_token_share is None:
        raise o.missing(o.key("planned_token_share"), " (with planned_tokens)")
    return entry


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanMixture:
    """``mixture``: the unit of the weights and the normalized weights per dataset name."""

    unit: Literal["samples", "tokens", "cost"] = key(
        one_of("samples", "tokens", "cost").optional("samples"), always=True
    )
    weights: Mapping[str, float] = key(WEIGHTS.optional(empty()), always=True)


#: ``tokenizer.fingerprint`` of a plan made only of token stores: its counts come from the stores' indexes, so
#: the tokenizer was never loaded (the run checks its ids against the stores instead: ``zephon.executor.exact``).
STORES_ONLY = "token-stores-only"


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanTokenizer:
    """``tokenizer``: the tokenizer the plan depends on (token mixtures and exact plans)."""

    id: str = key(TEXT)
    fingerprint: str = key(TEXT)
    field: str = key(TEXT)
    add_bos: bool | None = key(FLAG.optional(), always=True)
    eos_token: str | None = key(TEXT.optional(), always=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanPacking:
    """``packing``: packing decided in the plan (exact plans); the planned rows' statistics with best fit and
    homogeneous packing only."""

    algorithm: Literal["wrap", "best_fit", "homogeneous"] = key(one_of("wrap", "best_fit", "homogeneous"))
    max_length: int = key(POSITIVE)
    sequences: int = key(COUNT)
    oversize: str | None = key(TEXT.optional())
    padding_fraction: float | None = key(NUMBER.optional())
    first_fit_padding_fraction: float | None = key(NUMBER.optional())
    split_documents: int | None = key(COUNT.optional())
    dropped_documents: int | None = key(COUNT.optional())
    dropped_tokens: int | None = key(COUNT.optional())
    #: Homogeneous packing: rows by which a dataset's count in any window of rows can miss its share.
    window_bound_rows: int | None = key(COUNT.optional())


@dataclass(frozen=True, kw_only=True, slots=True)
class RowClose:
    """One entry of ``sample_packing.closes``: before the sample at ``position`` was placed, every open row
    numbered below ``rows_below`` was closed (every open row, when absent: a phase boundary)."""

    position: int = key(COUNT)
    rows_below: int | None = key(COUNT.optional())


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanSamplePacking:
    """``sample_packing``: samples grouped into rows by cost at plan time (``Pipeline.pack_samples``); the rows
    are bins.parquet's ``sequence`` values, each sample one piece of ``length`` = its cost."""

    algorithm: Literal["best_fit"] = key(one_of("best_fit"))
    max_cost: int = key(POSITIVE)
    oversize: str = key(TEXT)
    rows: int = key(COUNT)
    #: Total cost over the rows' capacity (``rows × max_cost``).
    fill_fraction: float = key(NUMBER)
    dropped_samples: int = key(COUNT)
    dropped_cost: int = key(COUNT)
    #: Where rows were closed (phase boundaries, a continuation's seam); absent when nowhere, so plans without
    #: phases keep their bytes. A continuation replays its parent's packing with them.
    closes: tuple[RowClose, ...] = key(records(RowClose).optional(()))


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanShuffle:
    """``shuffle``; a plan without it reads a window of one shard (``enabled`` ``None``: not recorded)."""

    enabled: bool | None = key(FLAG.optional(), always=True)
    window_shards: int = key(POSITIVE.optional(1), always=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanBudget:
    """``budget``: the one of documents, epochs or tokens the plan was sized by (the others ``None``)."""

    num_documents: int | None = key(COUNT.optional(), always=True)
    epochs: int | None = key(COUNT.optional(), always=True)
    num_tokens: int | None = key(COUNT.optional(), always=True)
    #: A cost mixture's budget (``WorkSource.num_cost``); absent otherwise.
    num_cost: int | None = key(COUNT.optional())


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanFiles:
    """``files``: the bundle's files, relative to the plan directory."""

    samples: tuple[str, ...] = key(texts())
    shards: str = key(NAME.optional(SHARDS_FILE), always=True)
    bins: str | None = key(NAME.optional())
    #: selected.parquet of a plan written with ``materialize_selections``; ``None`` otherwise.
    copies: str | None = key(NAME.optional())


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanTotals:
    """``totals``: documents (rows of the samples files) and shards; tokens when the plan knows them."""

    documents: int = key(COUNT)
    shards: int = key(COUNT)
    tokens: int | None = key(COUNT.optional())
    #: ``"cost"``: samples.parquet's ``tokens`` are the samples' costs (``cost=``, docs/records.md).
    tokens_are: Literal["exact", "estimated", "cost"] | None = key(one_of("exact", "estimated", "cost").optional())


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanBatch:
    """``batch`` (optional, not written by the planner): the global batch inspection tools cut steps with."""

    global_batch_size: int | None = key(POSITIVE.optional())


#: A number kept as written (an integer stays one: documents and tokens are counts).
_AMOUNT = Value("a number", NUMBER.test)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanWarningEntry:
    """One entry of ``warnings``: a shortfall the planner found (docs/plans.md, "Warnings").

    ``kind`` is ``"budget_not_met"`` (``budget``, ``requested`` and ``planned`` in the budget's unit:
    documents, tokens, or passes for ``epochs``; ``dataset`` is the one that ran out) or ``"repetition"``
    (``dataset`` read ``passes`` times, more than ``limit`` = ``REPETITION_LIMIT`` × ``epochs``). A reader
    keeps kinds it does not know; ``message`` is the line ``zephon plan`` prints.
    """

    kind: str = key(NAME)
    dataset: str | None = key(TEXT.or_null().optional(), always=True)
    budget: str | None = key(TEXT.optional())
    requested: int | float | None = key(_AMOUNT.optional())
    planned: int | float | None = key(_AMOUNT.optional())
    passes: int | float | None = key(_AMOUNT.optional())
    epochs: int | None = key(COUNT.optional())
    limit: int | float | None = key(_AMOUNT.optional())
    message: str = key(TEXT)


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceReads:
    """``reads_per_document`` of a source: the least and most times the plan reads any one of its documents."""

    min: int = key(COUNT)
    max: int = key(COUNT)


#: A non-empty list of dataset names, as a tuple.
_NAMES = Value(
    "a non-empty list of dataset names",
    lambda v: isinstance(v, list) and bool(v) and all(isinstance(s, str) for s in v),
    lambda v, where, file: tuple(v),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanSource:
    """One entry of ``sources``: datasets that are selections of one source (``zephon.planner.selection.overlaps``), its
    distinct selected documents, those more than one selection holds, and how often the plan reads each."""

    datasets: tuple[str, ...] = key(_NAMES)
    documents: int = key(COUNT)
    in_several_selections: int = key(COUNT)
    reads_per_document: SourceReads = key(record(SourceReads))


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanCopies:
    """One value of ``selected_copies`` (``materialize_selections``, ``zephon.planner.copies``): a
    copied dataset's copies — shards, planned rows, bytes — and the bytes of the source shards they stand for."""

    shards: int = key(COUNT)
    rows: int = key(COUNT)
    bytes: int = key(COUNT)
    source_bytes: int = key(COUNT)
