"""plan.json of a laid-out plan, built as the typed ``zephon.plan.manifest.Manifest`` that ``write_bundle``
(``zephon.planner.build``) seals and writes (``Manifest.to_json``).

What each key says (docs/plan-format.md): the datasets as configured and what the plan reads of each, the
mixture, the tokenizer and packing of token-counted plans, the budget, files and totals, the shortfalls
(``zephon.planner.shortfalls``), the phases, the sources of several selections (``zephon.planner.selection.overlaps``),
the selection copies, and a continuation's phases and lineage (``zephon.planner.continuation.bundle``).
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from zephon.executor.step_arithmetic import sequences_in
from zephon.plan.format import BINS_FILE, COPIES_FILE, FORMAT_VERSION, SAMPLES_FILE, SHARDS_FILE
from zephon.plan.manifest import (
    Manifest,
    PhaseStart,
    PlanBudget,
    PlanCopies,
    PlanDataset,
    PlanFiles,
    PlanLineage,
    PlanMixture,
    PlanPacking,
    PlanPhase,
    PlanSamplePacking,
    PlanShuffle,
    PlanSource,
    PlanTokenizer,
    PlanTotals,
    RowClose,
)
from zephon.planner.best_fit import Bins, pack, padding_fraction
from zephon.planner.homogeneous import window_bound_rows
from zephon.planner.layout import Chunk
from zephon.planner.prepare import PreparedPlan
from zephon.planner.samples_writer import Totals
from zephon.planner.selection.overlaps import overlaps
from zephon.planner.shortfalls import plan_warnings


class Continued(Protocol):
    """What a continuation hands ``write_bundle`` (``zephon.planner.continuation.bundle.Continued``): the parent's
    kept rows (``prefix``), written first; the new segment's chunks checked against them; the child's ``lineage``
    and its ``phases``. A protocol, so that writing a bundle does not depend on the continuation that uses it."""

    prefix: Any
    lineage: PlanLineage
    #: A plan packing samples by cost: the parent's row closes before the seam, then the seam's.
    sample_closes: tuple[tuple[int, int | None], ...]

    def checked(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]: ...

    def phases(self, prepared: PreparedPlan, segment_phases: tuple[PlanPhase, ...]) -> tuple[PlanPhase, ...]: ...


__all__ = ["eval_fraction", "plan_manifest"]


def _zephon_version() -> str:
    try:
        return version("zephon")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "0+unknown"


def plan_manifest(
    prepared: PreparedPlan,
    totals: Totals,
    bins: Bins | None,
    dropped: np.ndarray | None = None,
    continued: Continued | None = None,
    copies: dict[str, PlanCopies] | None = None,
    samples: tuple[str, ...] = (SAMPLES_FILE,),
) -> Manifest:
    """plan.json of the laid-out plan, typed (``zephon.plan.manifest``), before its integrity record; ``samples``:
    the samples files written (``SamplesWriter.files``)."""
    source = prepared.source
    n_docs = totals.documents
    known = prepared.tokens is not None
    tok = totals.tokens if known and n_docs else None
    total_tokens = float(tok.sum()) if tok is not None else 0.0
    datasets = _datasets(prepared, totals, tok, total_tokens, dropped)
    phases = _phases(prepared, totals)
    if continued is not None:
        phases = continued.phases(prepared, phases)
    elif not source.phases:
        phases = ()
    shuffle, budget = prepared.config["shuffle"], prepared.config["budget"]
    tokens = int(total_tokens) if known else None
    return Manifest(
        format_version=FORMAT_VERSION,
        zephon_version=_zephon_version(),
        config_hash=prepared.config_hash,
        config=prepared.config,
        seed=source.seed,
        kind="exact" if prepared.exact else "estimated",
        lanes=None if prepared.exact else source.lanes,
        datasets=datasets,
        mixture=PlanMixture(unit=prepared.unit, weights=MappingProxyType({d.name: d.weight for d in datasets})),
        token_estimation=prepared.token_provenance,
        tokenizer=_tokenizer(prepared),
        packing=_packing(prepared, totals, bins, total_tokens),
        sample_packing=_sample_packing(prepared, bins, total_tokens),
        shuffle=PlanShuffle(enabled=shuffle["enabled"], window_shards=shuffle["window_shards"]),
        budget=PlanBudget(
            num_documents=budget["num_documents"],
            epochs=budget["epochs"],
            num_tokens=budget["num_tokens"],
            num_cost=budget.get("num_cost"),
        ),
        on_exhaustion=source.on_exhaustion,
        files=PlanFiles(
            samples=samples,
            shards=SHARDS_FILE,
            bins=BINS_FILE if bins is not None else None,
            copies=COPIES_FILE if copies is not None else None,
        ),
        totals=PlanTotals(
            documents=n_docs,
            shards=sum(len(r) for r in prepared.shards),
            tokens=tokens,
            tokens_are=("cost" if prepared.costs else "exact" if prepared.exact else "estimated") if known else None,
        ),
        warnings=plan_warnings(prepared, documents=n_docs, docs=totals.docs, tokens=tokens),
        phases=phases,
        sources=_sources(prepared, datasets),
        selected_copies=MappingProxyType(copies) if copies is not None else None,
        lineage=continued.lineage if continued is not None else None,
    )


def _datasets(
    prepared: PreparedPlan, totals: Totals, tok: np.ndarray | None, total_tokens: float, dropped: np.ndarray | None
) -> tuple[PlanDataset, ...]:
    """plan.json ``datasets``: each dataset as configured and what the plan reads of it."""
    weights = prepared.config["mixture"]["weights"]
    docs = totals.docs
    out = []
    for index, (ds, info, refs) in enumerate(
        zip(prepared.source.datasets, prepared.config["datasets"], prepared.shards, strict=True)
    ):
        share = None
        if tok is not None:
            share = float(tok[index] / total_tokens) if total_tokens else 0.0
        out.append(
            PlanDataset(
                id=index,
                name=ds.name,
                path=ds.path,
                pinned=ds.pinned or ds.path,
                format=refs[0].format,
                fingerprint=info["fingerprint"],
                shards=info["shards"],
                first_shard_id=refs[0].shard_id,
                rows=info["rows"],
                weight=float(eval_fraction(weights[ds.name])),
                planned_documents=int(docs[index]),
                epochs_started=int(totals.last_epoch[index]) + 1 if docs[index] else 0,
                passes_completed=int(docs[index]) // prepared.dataset_rows(index),
                selection=info.get("selection"),  # the config's entry (zephon.planner.prepare)
                token_store=info.get("token_store"),  # the config's entry (zephon.planner.prepare)
                planned_tokens=int(tok[index]) if tok is not None else None,
                planned_token_share=share,
                dropped_by_operators=int(dropped[index]) if dropped is not None else None,
            )
        )
    return tuple(out)


def _tokenizer(prepared: PreparedPlan) -> PlanTokenizer | None:
    """plan.json ``tokenizer``: the tokenizer the plan's token counts depend on (none without counts)."""
    if prepared.tokenize is None or prepared.tokenizer_fingerprint is None:
        return None
    return PlanTokenizer(
        id=prepared.tokenize.tokenizer_id,
        fingerprint=prepared.tokenizer_fingerprint,
        field=prepared.tokenize.field,
        add_bos=prepared.tokenize.add_bos,
        eos_token=prepared.tokenize.eos_token,
    )


def _sample_packing(prepared: PreparedPlan, bins: Bins | None, total_cost: float) -> PlanSamplePacking | None:
    """plan.json ``sample_packing`` of a plan that packs samples by cost: its rows and what they hold."""
    spec = prepared.sample_pack
    if spec is None:
        return None
    assert bins is not None
    capacity = bins.sequences * spec.max_cost
    return PlanSamplePacking(
        algorithm="best_fit",
        max_cost=spec.max_cost,
        oversize=spec.oversize,
        rows=bins.sequences,
        fill_fraction=float(total_cost - bins.dropped_tokens) / capacity if capacity else 0.0,
        dropped_samples=bins.dropped_documents,
        dropped_cost=bins.dropped_tokens,
        closes=tuple(RowClose(position=p, rows_below=b) for p, b in bins.closes),
    )


def _packing(prepared: PreparedPlan, totals: Totals, bins: Bins | None, total_tokens: float) -> PlanPacking | None:
    """plan.json ``packing`` of an exact plan: wrap's rows and padding, or the planned rows' statistics."""
    spec = prepared.pack
    if not prepared.exact or spec is None:
        return None
    L = spec.max_length
    if bins is None:
        sequences = sequences_in(int(total_tokens), L)
        padding = (sequences * L - total_tokens) / (sequences * L)
        return PlanPacking(algorithm=spec.algorithm, max_length=L, sequences=sequences, padding_fraction=padding)
    first_fit = None
    if spec.algorithm == "best_fit":
        tokens = totals.all_tokens().astype(np.int64)
        first_fit = padding_fraction(pack(tokens, L, oversize=spec.oversize, first_fit=True), L)
    return PlanPacking(
        algorithm=spec.algorithm,
        max_length=L,
        sequences=bins.sequences,
        oversize=spec.oversize,
        padding_fraction=padding_fraction(bins, L),
        first_fit_padding_fraction=first_fit,
        split_documents=bins.split_documents,
        dropped_documents=bins.dropped_documents,
        dropped_tokens=bins.dropped_tokens,
        # any window of rows holds each share within this
        window_bound_rows=window_bound_rows() if spec.algorithm == "homogeneous" else None,
    )


def _sources(prepared: PreparedPlan, datasets: tuple[PlanDataset, ...]) -> tuple[PlanSource, ...] | None:
    """plan.json ``sources`` (datasets that are selections of one source, ``zephon.planner.selection.overlaps``);
    only in plans with a selection, so plans without one keep their bytes."""
    if not prepared.selections:
        return None
    names = [d.name for d in datasets]
    planned = [d.planned_documents for d in datasets]
    return overlaps(names, prepared.shards, prepared.selections, planned)


def _phases(prepared: PreparedPlan, totals: Totals) -> tuple[PlanPhase, ...]:
    """plan.json ``phases``: each phase's start as configured, weights, and the positions it occupies."""
    names = [ds.name for ds in prepared.source.datasets]
    configured = [None, *prepared.config.get("phases", [])]
    out = []
    end = totals.documents
    for stage in reversed(prepared.stages):
        done = totals.stages.get(stage.index)
        first = done.first_position if done is not None else end
        docs = done.docs if done is not None else np.zeros(len(names), np.int64)
        configured_start = configured[stage.index]
        start = None
        if configured_start:
            start = PhaseStart(
                start=configured_start["start"],
                unit=configured_start["unit"],
                global_batch_size=configured_start["global_batch_size"],
            )
        tokens = planned_tokens = None
        if done is not None and done.tokens is not None:
            tokens = int(done.tokens.sum())
            planned_tokens = MappingProxyType({n: int(t) for n, t in zip(names, done.tokens, strict=True)})
        out.append(
            PlanPhase(
                index=stage.index,
                start=start,
                start_position=stage.start_position,
                start_tokens=stage.start_tokens,
                weights=MappingProxyType({n: float(f) for n, f in zip(names, stage.fractions(), strict=True) if f}),
                first_position=first,
                end_position=end,
                documents=int(docs.sum()),
                planned_documents=MappingProxyType({n: int(d) for n, d in zip(names, docs, strict=True)}),
                tokens=tokens,
                planned_tokens=planned_tokens,
            )
        )
        end = first
    return tuple(out[::-1])


def eval_fraction(text: str) -> float:
    num, _, den = text.partition("/")
    return int(num) / int(den or 1)
