"""plan.json, typed: the bundle's manifest, read and validated at one door, ``read_manifest``.

``read_manifest(plan_dir)`` parses ``plan.json`` into a frozen ``Manifest``; the executor, inspection tools,
CLI and pipeline read its attributes, never keys of the JSON. Field names are the JSON keys
(``Manifest.packing.max_length`` is ``plan.json`` ``packing.max_length``), so these dataclasses are the one
list of the keys readers know; docs/plan-format.md says what each means. Only ``config`` (the normalized
config, hashed into ``config_hash``) and ``token_estimation`` (provenance) stay JSON mappings.

Validation is here too: an unknown format version, a missing required key or a value of the wrong type is a
``PlanFormatError`` of one line naming the file and the key (``zephon.plan.json_fields``). Keys added over
time are optional and read as the plans without them meant: no ``kind`` is an estimated plan, no (or null)
``lanes`` one lane per row of the global batch, no ``phases`` none (``Manifest.resolved_phases`` gives one
phase 0 then), no ``shuffle`` a window of one shard, no ``files.shards`` ``shards.parquet``, no ``warnings``
none. Unknown keys are ignored: adding an optional key does not bump the format version.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from zephon.errors import PlanFormatError, PlanWarning, warn
from zephon.plan.format import FORMAT_VERSION, PLAN_JSON, READABLE_VERSIONS, SHARDS_FILE
from zephon.plan.json_fields import (
    COUNT,
    FLAG,
    INT,
    NAME,
    NUMBER,
    POSITIVE,
    TEXT,
    JsonObject,
    Value,
    json_mapping,
    list_of,
    mapping_of,
    nested,
    one_of,
    texts,
)

Kind = Literal["estimated", "exact"]


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanDataset:
    """One entry of ``datasets``, in work-source order; ``planned_tokens`` and its share with token counts only."""

    id: int
    name: str
    path: str
    pinned: str
    format: str | None
    fingerprint: str
    shards: int
    rows: int
    weight: float
    planned_documents: int
    first_shard_id: int | None = None
    epochs_started: int | None = None
    passes_completed: int | None = None
    planned_tokens: int | None = None
    planned_token_share: float | None = None
    #: The dataset's selection by metadata as JSON (query, sidecar fingerprint, counts); ``None`` without one.
    selection: Mapping[str, Any] | None = None
    #: Exact plans with user operators: scheduled documents a ``map_transform`` / ``map_batch`` dropped (rows of
    #: ``samples.parquet`` with 0 tokens, in no sequence); ``None`` in plans without operators.
    dropped_by_operators: int | None = None

    @property
    def documents(self) -> int:
        """Documents one pass reads: the selected rows, or every row."""
        return int(self.selection["selected"]) if self.selection is not None else self.rows


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanMixture:
    """``mixture``: the unit of the weights and the normalized weights per dataset name."""

    unit: Literal["samples", "tokens"] = "samples"
    weights: Mapping[str, float] = field(default_factory=_empty)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanTokenizer:
    """``tokenizer``: the tokenizer the plan depends on (token mixtures and exact plans)."""

    id: str
    fingerprint: str
    field: str
    add_bos: bool | None = None
    eos_token: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanPacking:
    """``packing``: packing decided in the plan (exact plans); the best-fit statistics with best fit only."""

    algorithm: Literal["wrap", "best_fit", "homogeneous"]
    max_length: int
    sequences: int
    padding_fraction: float | None = None
    oversize: str | None = None
    first_fit_padding_fraction: float | None = None
    split_documents: int | None = None
    dropped_documents: int | None = None
    dropped_tokens: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanShuffle:
    """``shuffle``; a plan without it reads a window of one shard (``enabled`` ``None``: not recorded)."""

    enabled: bool | None = None
    window_shards: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanBudget:
    """``budget``: the one of documents, epochs or tokens the plan was sized by (the others ``None``)."""

    num_documents: int | None = None
    epochs: int | None = None
    num_tokens: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanFiles:
    """``files``: the bundle's files, relative to the plan directory."""

    samples: tuple[str, ...]
    shards: str = SHARDS_FILE
    bins: str | None = None
    #: selected.parquet of a plan written with ``materialize_selections``; ``None`` otherwise.
    copies: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanTotals:
    """``totals``: documents (rows of the samples files) and shards; tokens when the plan knows them."""

    documents: int
    shards: int
    tokens: int | None = None
    tokens_are: Literal["exact", "estimated"] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseStart:
    """A phase's ``start`` as configured: a fraction (``"1/2"``) or a count in ``unit``."""

    start: str | int
    unit: str
    global_batch_size: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanPhase:
    """One entry of ``phases``: the positions ``[first_position, end_position)`` it occupies and its mixture."""

    index: int
    first_position: int
    end_position: int
    documents: int
    weights: Mapping[str, float]
    planned_documents: Mapping[str, int]
    start: PhaseStart | None = None
    start_position: int | None = None
    start_tokens: int | None = None
    tokens: int | None = None
    planned_tokens: Mapping[str, int] | None = None
    #: The lineage segment the phase belongs to (continued plans only; None in others).
    segment: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LineageParent:
    """``lineage.parent``: the plan a continued plan branched from."""

    config_hash: str
    #: SHA-256 of the parent's plan.json bytes (whose integrity record covers its Parquet files).
    plan_json_sha256: str
    path: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LineageBranch:
    """``lineage.branch``: the first step and document position of the new segment, for ``global_batch`` rows."""

    step: int
    position: int
    global_batch: int
    #: Tokens (exact or estimated; 0 without counts) of the kept prefix.
    tokens: int


@dataclass(frozen=True, kw_only=True, slots=True)
class LineageSegment:
    """One entry of ``lineage.segments``: the stretch of the plan one configuration laid out, from its first
    global step and position to the next segment's."""

    segment: int
    config_hash: str
    first_step: int
    first_position: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanLineage:
    """``lineage`` (continued plans only; ``zephon.planner.continuation.child``)."""

    parent: LineageParent
    branch: LineageBranch
    segments: tuple[LineageSegment, ...]

    def accepts(self, config_hash: str, step: int, microbatch: int) -> bool:
        """Whether a checkpoint state of plan ``config_hash`` at ``step`` (``microbatch``) resumes on this plan:
        it comes from the parent at a step before the branch (or at it, on a step boundary), or from an earlier
        segment's plan at a step before the next segment."""
        if config_hash == self.parent.config_hash:
            return step < self.branch.step or (step == self.branch.step and microbatch == 0)
        for here, after in zip(self.segments, self.segments[1:], strict=False):
            if here.config_hash == config_hash:
                return step < after.first_step or (step == after.first_step and microbatch == 0)
        return False

    def segment_of_step(self, step: int) -> int:
        """The segment holding global step ``step`` (of ``branch.global_batch`` rows)."""
        return max((s.segment for s in self.segments if s.first_step <= step), default=0)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanBatch:
    """``batch`` (optional, not written by the planner): the global batch inspection tools cut steps with."""

    global_batch_size: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanWarningEntry:
    """One entry of ``warnings``: a shortfall the planner found (docs/plans.md, "Warnings").

    ``kind`` is ``"budget_not_met"`` (``budget``, ``requested`` and ``planned`` in the budget's unit:
    documents, tokens, or passes for ``epochs``; ``dataset`` is the one that ran out) or ``"repetition"``
    (``dataset`` read ``passes`` times, more than ``limit`` = ``REPETITION_LIMIT`` × ``epochs``). A reader
    keeps kinds it does not know; ``message`` is the line ``zephon plan`` prints.
    """

    kind: str
    message: str
    dataset: str | None = None
    budget: str | None = None
    requested: int | float | None = None
    planned: int | float | None = None
    passes: int | float | None = None
    epochs: int | None = None
    limit: int | float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """``plan.json`` of a bundle, validated (see the module docstring); build it with ``read_manifest``."""

    format_version: int
    config_hash: str
    datasets: tuple[PlanDataset, ...]
    totals: PlanTotals
    files: PlanFiles
    #: The normalized config as JSON (the mapping ``config_hash`` hashes); empty when plan.json has none.
    config: Mapping[str, Any] = field(default_factory=_empty)
    zephon_version: str | None = None
    seed: int | None = None
    kind: Kind = "estimated"
    #: Packing lanes fixed by an estimated plan (``lanes=`` when planning); ``None`` for an exact plan and for an
    #: estimated plan with one lane per row of the run's global batch (the default: any dp size dividing it).
    lanes: int | None = None
    mixture: PlanMixture = field(default_factory=PlanMixture)
    #: Method and provenance of the token counts per dataset, as JSON; ``None`` for sample mixtures.
    token_estimation: Mapping[str, Any] | None = None
    tokenizer: PlanTokenizer | None = None
    packing: PlanPacking | None = None
    shuffle: PlanShuffle = field(default_factory=PlanShuffle)
    budget: PlanBudget | None = None
    on_exhaustion: Literal["new_epoch", "stop"] | None = None
    phases: tuple[PlanPhase, ...] = ()
    batch: PlanBatch | None = None
    #: Digests of plan.json's keys and of the Parquet files, as JSON; checked by ``zephon.plan.bundle.open_bundle``
    #: (``zephon.plan.integrity``). ``None`` in plans written before it.
    integrity: Mapping[str, Any] | None = None
    #: Shortfalls found when planning (budget not met, heavy repetition); ``()`` in plans written without them.
    warnings: tuple[PlanWarningEntry, ...] = ()
    #: Datasets that are selections of one source and how often each document is read, as JSON
    #: (``zephon.planner.selection.overlaps``); ``()`` in plans without selections.
    sources: tuple[Mapping[str, Any], ...] = ()
    #: Plans written with ``materialize_selections``: per copied dataset, its copies' shards, rows, bytes and the
    #: source bytes they stand for, as JSON (``zephon.planner.copies``); ``None`` otherwise.
    selected_copies: Mapping[str, Any] | None = None
    #: Continued plans: the parent, the branch and the segments (``zephon.planner.continuation.child``); ``None``
    #: in plans laid out from their start.
    lineage: PlanLineage | None = None

    @property
    def exact(self) -> bool:
        """Whether token counts, offsets and packing are in the plan (``kind == "exact"``)."""
        return self.kind == "exact"

    @property
    def dataset_names(self) -> list[str]:
        return [d.name for d in self.datasets]

    def exact_packing(self) -> PlanPacking:
        """``packing`` of an exact plan (``read_manifest`` refuses an exact plan without it)."""
        if self.packing is None:
            raise PlanFormatError(
                f"plan {self.config_hash[:12]} must have packing (an exact plan), got a plan of kind {self.kind!r} "
                "without — run it as an estimated plan"
            )
        return self.packing

    @property
    def resolved_phases(self) -> tuple[PlanPhase, ...]:
        """``phases``; for a plan without phases, one phase 0 spanning the plan with the mixture's weights and
        planned documents (and planned tokens, with token counts)."""
        if self.phases:
            return self.phases
        tokens = {d.name: d.planned_tokens for d in self.datasets if d.planned_tokens is not None}
        return (
            PlanPhase(
                index=0,
                first_position=0,
                end_position=self.totals.documents,
                documents=self.totals.documents,
                weights=MappingProxyType({d.name: d.weight for d in self.datasets}),
                planned_documents=MappingProxyType({d.name: d.planned_documents for d in self.datasets}),
                start_position=0,
                tokens=self.totals.tokens if tokens else None,
                planned_tokens=MappingProxyType(tokens) if tokens else None,
            ),
        )


def read_manifest(plan_dir: str | Path) -> Manifest:
    """Read and validate ``plan.json`` of a bundle; refuse unknown format versions (one line naming the file).

    Parses only: ``zephon.plan.bundle.open_bundle`` also checks the bundle's integrity and its Parquet files."""
    data, path = read_plan_json(plan_dir)
    return parse_manifest(data, path)


def read_plan_json(plan_dir: str | Path) -> tuple[object, Path]:
    """``plan.json`` of a bundle as parsed JSON, with its path (missing or not JSON: one line naming it)."""
    path = Path(plan_dir) / PLAN_JSON
    if not path.is_file():
        raise PlanFormatError(
            f"plan directory must contain {PLAN_JSON}, got none at {path} — "
            "pass a directory written by `zephon plan` or work_source.plan(DIR)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanFormatError(f"{path} must be valid JSON, got {exc} — rewrite the plan with `zephon plan`") from exc
    return data, path


def parse_manifest(data: object, file: Path) -> Manifest:
    """The ``Manifest`` of the parsed JSON ``data`` of ``file`` (validated; see the module docstring)."""
    version = data.get("format_version") if isinstance(data, dict) else None
    if version not in READABLE_VERSIONS:
        raise PlanFormatError(
            f"plan format version must be {FORMAT_VERSION}, got {version!r} in {file} — "
            "re-plan with this Zephon version, or install the version that wrote the plan"
        )
    top = JsonObject(data, file)
    values = top.read(
        config_hash=TEXT,
        datasets=list_of(_dataset),
        totals=nested(_totals),
        files=nested(_files),
        format_version=INT,
        config=json_mapping().optional(_empty()),
        zephon_version=TEXT.optional(),
        seed=INT.optional(),
        kind=one_of("estimated", "exact").optional("estimated"),
        lanes=POSITIVE.optional(),
        mixture=nested(_mixture).optional(PlanMixture()),
        token_estimation=json_mapping().optional(),
        tokenizer=nested(_tokenizer).optional(),
        packing=nested(_packing).optional(),
        shuffle=nested(_shuffle).optional(PlanShuffle()),
        budget=nested(_budget).optional(),
        on_exhaustion=one_of("new_epoch", "stop").optional(),
        phases=list_of(_phase).optional(()),
        batch=nested(_batch).optional(),
        integrity=json_mapping().optional(),
        warnings=list_of(_warning).optional(()),
        sources=list_of(lambda o: MappingProxyType(o.data)).optional(()),
        selected_copies=json_mapping().optional(),
        lineage=nested(_lineage).optional(),
    )
    exact = values["kind"] == "exact"
    # Format 1 fixed the lanes of every estimated plan (no ``lanes`` key: one lane).
    values["lanes"] = None if exact else (values["lanes"] or 1) if version == 1 else values["lanes"]
    manifest = Manifest(**values)
    if exact:
        for name in ("packing", "tokenizer"):
            if getattr(manifest, name) is None:
                raise top.missing(name, " (an exact plan's)")
        if manifest.totals.tokens is None:
            raise top.missing("totals.tokens", " (an exact plan's)")
        if manifest.exact_packing().algorithm != "wrap" and manifest.files.bins is None:
            raise top.missing("files.bins", f" (a {manifest.exact_packing().algorithm.replace('_', '-')} plan's)")
    return manifest


_WEIGHTS = mapping_of(NUMBER, "an object of dataset names to numbers")
_COUNTS = mapping_of(COUNT, "an object of dataset names to integers ≥ 0")


def _dataset(o: JsonObject) -> PlanDataset:
    entry = PlanDataset(
        **o.read(
            id=COUNT,
            name=TEXT,
            path=TEXT,
            pinned=TEXT,
            format=TEXT.or_null(),
            fingerprint=TEXT,
            shards=COUNT,
            rows=COUNT,
            weight=NUMBER,
            planned_documents=COUNT,
            first_shard_id=COUNT.optional(),
            epochs_started=COUNT.optional(),
            passes_completed=COUNT.optional(),
            planned_tokens=COUNT.optional(),
            planned_token_share=NUMBER.optional(),
            selection=json_mapping().optional(),
            dropped_by_operators=COUNT.optional(),
        )
    )
    if entry.planned_tokens is not None and entry.planned_token_share is None:
        raise o.missing(o.key("planned_token_share"), " (with planned_tokens)")
    return entry


def _mixture(o: JsonObject) -> PlanMixture:
    return PlanMixture(
        **o.read(unit=one_of("samples", "tokens").optional("samples"), weights=_WEIGHTS.optional(_empty()))
    )


def _tokenizer(o: JsonObject) -> PlanTokenizer:
    return PlanTokenizer(
        **o.read(id=TEXT, fingerprint=TEXT, field=TEXT, add_bos=FLAG.optional(), eos_token=TEXT.optional())
    )


def _packing(o: JsonObject) -> PlanPacking:
    return PlanPacking(
        **o.read(
            algorithm=one_of("wrap", "best_fit", "homogeneous"),
            max_length=POSITIVE,
            sequences=COUNT,
            padding_fraction=NUMBER.optional(),
            oversize=TEXT.optional(),
            first_fit_padding_fraction=NUMBER.optional(),
            split_documents=COUNT.optional(),
            dropped_documents=COUNT.optional(),
            dropped_tokens=COUNT.optional(),
        )
    )


def _shuffle(o: JsonObject) -> PlanShuffle:
    return PlanShuffle(**o.read(enabled=FLAG.optional(), window_shards=POSITIVE.optional(1)))


def _budget(o: JsonObject) -> PlanBudget:
    return PlanBudget(**o.read(num_documents=COUNT.optional(), epochs=COUNT.optional(), num_tokens=COUNT.optional()))


def _files(o: JsonObject) -> PlanFiles:
    return PlanFiles(
        **o.read(samples=texts(), shards=NAME.optional(SHARDS_FILE), bins=NAME.optional(), copies=NAME.optional())
    )


def _totals(o: JsonObject) -> PlanTotals:
    return PlanTotals(
        **o.read(
            documents=COUNT,
            shards=COUNT,
            tokens=COUNT.optional(),
            tokens_are=one_of("exact", "estimated").optional(),
        )
    )


def _phase_start(o: JsonObject) -> PhaseStart:
    start = Value("a fraction or an integer", lambda v: isinstance(v, str) or INT.test(v))
    return PhaseStart(**o.read(start=start, unit=TEXT, global_batch_size=POSITIVE.optional()))


def _phase(o: JsonObject) -> PlanPhase:
    return PlanPhase(
        **o.read(
            index=COUNT,
            first_position=COUNT,
            end_position=COUNT,
            documents=COUNT,
            weights=_WEIGHTS,
            planned_documents=_COUNTS,
            start=nested(_phase_start).optional(),
            start_position=COUNT.optional(),
            start_tokens=COUNT.optional(),
            tokens=COUNT.optional(),
            planned_tokens=_COUNTS.optional(),
            segment=COUNT.optional(),
        )
    )


def _lineage(o: JsonObject) -> PlanLineage:
    return PlanLineage(
        **o.read(
            parent=nested(lambda p: LineageParent(**p.read(config_hash=TEXT, plan_json_sha256=TEXT, path=TEXT))),
            branch=nested(
                lambda b: LineageBranch(**b.read(step=COUNT, position=COUNT, global_batch=POSITIVE, tokens=COUNT))
            ),
            segments=list_of(
                lambda g: LineageSegment(
                    **g.read(segment=COUNT, config_hash=TEXT, first_step=COUNT, first_position=COUNT)
                )
            ),
        )
    )


#: A number kept as written (an integer stays one: documents and tokens are counts).
_AMOUNT = Value("a number", NUMBER.test)


def _warning(o: JsonObject) -> PlanWarningEntry:
    return PlanWarningEntry(
        **o.read(
            kind=NAME,
            message=TEXT,
            dataset=TEXT.or_null().optional(),
            budget=TEXT.optional(),
            requested=_AMOUNT.optional(),
            planned=_AMOUNT.optional(),
            passes=_AMOUNT.optional(),
            epochs=COUNT.optional(),
            limit=_AMOUNT.optional(),
        )
    )


def warn_plan(manifest: Manifest) -> None:
    """Issue each of the plan's ``warnings`` as a ``zephon.PlanWarning`` (``warnings.warn``, attributed to the
    caller outside Zephon)."""
    for entry in manifest.warnings:
        warn(entry.message, PlanWarning)


def _batch(o: JsonObject) -> PlanBatch:
    return PlanBatch(**o.read(global_batch_size=POSITIVE.optional()))
