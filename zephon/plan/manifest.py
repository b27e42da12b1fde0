"""plan.json, typed: the bundle's manifest, one schema that the planner writes through and every reader reads
through.

``Manifest`` and its records (``zephon.plan.manifest_parts``, ``zephon.plan.manifest_phases``) are the one list
of plan.json's keys: field names are the JSON keys (``Manifest.packing.max_length`` is plan.json
``packing.max_length``), in the order the planner writes them, each declared once with what it must hold and
what its absence means (``zephon.plan.json_record``). docs/plan-format.md says what each key means. Only
``config`` (the normalized config, hashed into ``config_hash``), ``token_estimation`` (provenance) and a
dataset's ``selection`` (its entry of ``config``) stay JSON mappings.

Writing: the planner (``zephon.planner.build``) builds a ``Manifest`` and writes ``Manifest.to_json()``:
``json.dumps(to_json_dict(), indent=2)`` and a newline, the ``integrity`` record last. Reading:
``read_manifest(plan_dir)`` / ``Manifest.from_json(text, file)``; the executor, inspection tools, CLI and
pipeline read attributes, never keys of the JSON. A plan the planner wrote reads back and writes out byte for
byte: ``Manifest.from_json(text, file).to_json() == text``.

Validation is here too: an unknown format version, a missing required key or a value of the wrong type is a
``PlanFormatError`` of one line naming the file and the key (``zephon.plan.json_fields``). Keys added over
time are optional and read as the plans without them meant: no ``kind`` is an estimated plan, no (or null)
``lanes`` one lane per row of the global batch, no ``phases`` none (``Manifest.resolved_phases`` gives one
phase 0 then), no ``shuffle`` a window of one shard, no ``files.shards`` ``shards.parquet``, no ``warnings``
none, no ``sources`` a plan without selections. Unknown keys are ignored: adding an optional key does not bump
the format version.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from zephon.errors import PlanFormatError, PlanWarning, warn
from zephon.plan.format import FORMAT_VERSION, PLAN_JSON, READABLE_VERSIONS
from zephon.plan.integrity import INTEGRITY_KEY, Integrity, integrity_record, parse_integrity
from zephon.plan.json_fields import INT, POSITIVE, TEXT, JsonObject, Value, json_mapping, mapping_of, one_of
from zephon.plan.json_record import key, read_record, record, records, to_json_value
from zephon.plan.manifest_parts import (
    PlanBatch,
    PlanBudget,
    PlanCopies,
    PlanDataset,
    PlanFiles,
    PlanMixture,
    PlanPacking,
    PlanSamplePacking,
    PlanShuffle,
    PlanSource,
    PlanTokenizer,
    PlanTotals,
    PlanWarningEntry,
    RowClose,
    SourceReads,
    empty,
    read_dataset,
)
from zephon.plan.manifest_phases import (
    LineageBranch,
    LineageParent,
    LineageSegment,
    PhaseStart,
    PlanLineage,
    PlanPhase,
)

__all__ = [
    "Kind",
    "LineageBranch",
    "LineageParent",
    "LineageSegment",
    "Manifest",
    "PhaseStart",
    "PlanBatch",
    "PlanBudget",
    "PlanCopies",
    "PlanDataset",
    "PlanFiles",
    "PlanLineage",
    "PlanMixture",
    "PlanPacking",
    "PlanPhase",
    "PlanSamplePacking",
    "PlanShuffle",
    "PlanSource",
    "PlanTokenizer",
    "PlanTotals",
    "PlanWarningEntry",
    "RowClose",
    "SourceReads",
    "parse_manifest",
    "plan_json_text",
    "read_manifest",
    "read_plan_json",
    "warn_plan",
]

Kind = Literal["estimated", "exact"]

#: ``integrity``, parsed by ``zephon.plan.integrity`` (its own messages).
_INTEGRITY = Value("an object", lambda v: isinstance(v, dict), lambda v, where, file: parse_integrity(v, file))
_COPIES = mapping_of(record(PlanCopies), "an object of dataset names to objects")


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """``plan.json`` of a bundle, validated (see the module docstring); read it with ``read_manifest``."""

    format_version: int = key(INT)
    zephon_version: str | None = key(TEXT.optional(), always=True)
    config_hash: str = key(TEXT)
    #: The normalized config as JSON (the mapping ``config_hash`` hashes); empty when plan.json has none.
    config: Mapping[str, Any] = key(json_mapping().optional(empty()), always=True)
    seed: int | None = key(INT.optional(), always=True)
    kind: Kind = key(one_of("estimated", "exact").optional("estimated"), always=True)
    #: Packing lanes fixed by an estimated plan (``lanes=`` when planning); ``None`` for an exact plan and for an
    #: estimated plan with one lane per row of the run's global batch (the default: any dp size dividing it).
    lanes: int | None = key(POSITIVE.optional(), always=True)
    datasets: tuple[PlanDataset, ...] = key(records(PlanDataset, read_dataset))
    mixture: PlanMixture = key(record(PlanMixture).optional(PlanMixture()), always=True)
    #: Method and provenance of the token counts per dataset, as JSON; ``None`` for sample mixtures.
    token_estimation: Mapping[str, Any] | None = key(json_mapping().optional(), always=True)
    tokenizer: PlanTokenizer | None = key(record(PlanTokenizer).optional(), always=True)
    packing: PlanPacking | None = key(record(PlanPacking).optional(), always=True)
    #: Record plans packed by cost (``Pipeline.pack_samples``); absent otherwise.
    sample_packing: PlanSamplePacking | None = key(record(PlanSamplePacking).optional())
    shuffle: PlanShuffle = key(record(PlanShuffle).optional(PlanShuffle()), always=True)
    budget: PlanBudget | None = key(record(PlanBudget).optional(), always=True)
    on_exhaustion: Literal["new_epoch", "stop"] | None = key(one_of("new_epoch", "stop").optional(), always=True)
    files: PlanFiles = key(record(PlanFiles))
    totals: PlanTotals = key(record(PlanTotals))
    #: Shortfalls found when planning (budget not met, heavy repetition); ``()`` in plans written without them.
    warnings: tuple[PlanWarningEntry, ...] = key(records(PlanWarningEntry).optional(()), always=True)
    #: Phases (``()``: none; ``resolved_phases``). A continued plan writes them after ``selected_copies``, beside
    #: its ``lineage`` (``to_json_dict``).
    phases: tuple[PlanPhase, ...] = key(records(PlanPhase).optional(()))
    #: Datasets that are selections of one source and how often each document is read
    #: (``zephon.planner.selection.overlaps``); ``None`` in plans without selections (``()``: no two of them share one).
    sources: tuple[PlanSource, ...] | None = key(records(PlanSource).optional())
    #: Plans written with ``materialize_selections``: per copied dataset, its copies (``zephon.planner.
    #: selection_copies``); ``None`` otherwise.
    selected_copies: Mapping[str, PlanCopies] | None = key(_COPIES.optional())
    #: Continued plans: the parent, the branch and the segments (``zephon.planner.continuation.child``); ``None``
    #: in plans laid out from their start.
    lineage: PlanLineage | None = key(record(PlanLineage).optional())
    batch: PlanBatch | None = key(record(PlanBatch).optional())
    #: Digests of plan.json's keys and of the Parquet files; checked by ``zephon.plan.bundle.open_bundle``
    #: (``zephon.plan.integrity``). ``None`` in plans written before it, and in a manifest not yet sealed.
    integrity: Integrity | None = key(_INTEGRITY.optional())

    @classmethod
    def from_json(cls, text: str, file: Path = Path(PLAN_JSON)) -> Manifest:
        """The manifest of plan.json's ``text`` (``file`` names it in errors; see ``parse_manifest``)."""
        return parse_manifest(_parsed(text, file), file)

    @classmethod
    def from_json_dict(cls, data: object, file: Path = Path(PLAN_JSON)) -> Manifest:
        """The manifest of plan.json's parsed JSON ``data`` (``parse_manifest``)."""
        return parse_manifest(data, file)

    def to_json_dict(self) -> dict[str, Any]:
        """plan.json as JSON values, keys in the order the planner writes them (``integrity`` last)."""
        out: dict[str, Any] = to_json_value(self)
        if self.lineage is not None and "phases" in out:
            # A continuation writes its phases beside its lineage, after the other keys.
            phases = out.pop("phases")
            after = {name: out.pop(name) for name in ("lineage", "batch", INTEGRITY_KEY) if name in out}
            out |= {"phases": phases} | after
        return out

    def to_json(self) -> str:
        """plan.json's text, as the planner writes it (``plan_json_text`` of ``to_json_dict``)."""
        return plan_json_text(self.to_json_dict())

    def sealed(self, plan_dir: str | Path) -> Manifest:
        """This manifest with its ``integrity`` record: digests of its other keys and of the Parquet files of
        ``files`` in ``plan_dir`` (``zephon.plan.integrity``; the planner seals after writing every file)."""
        unsealed = replace(self, integrity=None).to_json_dict()
        return replace(self, integrity=integrity_record(unsealed, plan_dir))

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


def plan_json_text(data: Mapping[str, Any]) -> str:
    """plan.json's text of the JSON values ``data``: indented by 2, ASCII, keys as given, a final newline."""
    return json.dumps(data, indent=2) + "\n"


def read_manifest(plan_dir: str | Path) -> Manifest:
    """Read and validate ``plan.json`` of a bundle; refuse unknown format versions (one line naming the file).

    Parses only: ``zephon.plan.bundle.open_bundle`` also checks the bundle's integrity and its Parquet files."""
    data, path = read_plan_json(plan_dir)
    return parse_manifest(data, path)


def plan_dir_path(plan_dir: object) -> Path:
    """``plan_dir`` as a ``Path``; anything but a non-empty path (``None``, ``""``: not the working directory) is
    one line."""
    if not isinstance(plan_dir, str | os.PathLike) or not str(plan_dir).strip():
        raise PlanFormatError(
            f"plan directory must be a path, got {plan_dir!r} — pass a directory written by `zephon plan` or "
            "work_source.plan(DIR)"
        )
    return Path(plan_dir)


def read_plan_json(plan_dir: str | Path) -> tuple[object, Path]:
    """``plan.json`` of a bundle as parsed JSON, with its path (missing or not JSON: one line naming it)."""
    path = plan_dir_path(plan_dir) / PLAN_JSON
    if not path.is_file():
        there = Path(plan_dir)
        got = (
            f"a file at {there}"
            if there.is_file()
            else f"none at {path}"
            if there.is_dir()
            else f"nothing at {there}"
        )
        raise PlanFormatError(
            f"plan directory must contain {PLAN_JSON}, got {got} — pass a directory written by `zephon plan` or "
            "work_source.plan(DIR)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise _not_json(path, exc) from exc
    return _parsed(text, path), path


def _parsed(text: str, file: Path) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _not_json(file, exc) from exc


def _not_json(file: Path, exc: Exception) -> PlanFormatError:
    return PlanFormatError(f"{file} must be valid JSON, got {exc} — rewrite the plan with `zephon plan`")


def parse_manifest(data: object, file: Path) -> Manifest:
    """The ``Manifest`` of the parsed JSON ``data`` of ``file`` (validated; see the module docstring)."""
    version = data.get("format_version") if isinstance(data, dict) else None
    if version not in READABLE_VERSIONS:
        raise PlanFormatError(
            f"plan format version must be {FORMAT_VERSION}, got {version!r} in {file} — "
            "re-plan with this Zephon version, or install the version that wrote the plan"
        )
    top = JsonObject(data, file)
    manifest = read_record(Manifest, top)
    if manifest.exact and manifest.lanes is not None:
        manifest = replace(manifest, lanes=None)
    elif version == 1 and not manifest.exact:  # format 1 fixed the lanes of every estimated plan (none: one)
        manifest = replace(manifest, lanes=manifest.lanes or 1)
    if manifest.exact:
        for name in ("packing", "tokenizer"):
            if getattr(manifest, name) is None:
                raise top.missing(name, " (an exact plan's)")
        if manifest.totals.tokens is None:
            raise top.missing("totals.tokens", " (an exact plan's)")
        if manifest.exact_packing().algorithm != "wrap" and manifest.files.bins is None:
            raise top.missing("files.bins", f" (a {manifest.exact_packing().algorithm.replace('_', '-')} plan's)")
    return manifest


def warn_plan(manifest: Manifest) -> None:
    """Issue each of the plan's ``warnings`` as a ``zephon.PlanWarning`` (``warnings.warn``, attributed to the
    caller outside Zephon)."""
    for entry in manifest.warnings:
        warn(entry.message, PlanWarning)
