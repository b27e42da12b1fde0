"""Scanning and normalizing a work source: everything a plan depends on, and the hash that names it.

The normalized config holds the seed, each dataset's path and content fingerprint, the mixture as exact fractions
and its unit (samples | tokens), the budget, shuffle and exhaustion rules, and — when the plan depends on tokens —
the tokenizer's fingerprint, the text field, the token-estimation settings and, for exact plans, the packing. Its
canonical JSON's SHA-256 is the plan's ``config_hash``; ``Pipeline`` caches plans under it. Per-row token counts
(estimated or exact) are computed here too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon.errors import ConfigError, DatasetError
from zephon.executor.encode.encoders import make_encoder
from zephon.executor.operators import Operator
from zephon.executor.operators import describe as describe_operators
from zephon.plan.format import FORMAT_VERSION
from zephon.plan.integrity import config_digest
from zephon.plan.manifest_parts import STORES_ONLY
from zephon.plan.records import ShardInfo, ShardRef
from zephon.planner.costs import check_costs, check_oversize, dataset_costs
from zephon.planner.counts.computed import describe as describe_cost
from zephon.planner.counts.computed import source_costs
from zephon.planner.counts.cost_worker import resolve
from zephon.planner.counts.estimate import estimate_dataset
from zephon.planner.counts.lengths import CountReport, token_counts
from zephon.planner.counts.shard_tokens import ShardTokens
from zephon.planner.counts.stores import forget_stores, open_dataset_store, store_identity, store_shards, store_tokens
from zephon.planner.interleave import exact_weights
from zephon.planner.phases import Stage, normalized, stages
from zephon.planner.ray_cluster import check_engine
from zephon.planner.room import pass_counts
from zephon.planner.segment import SegmentStart
from zephon.planner.selection.evaluate import SelectedRows, select_rows
from zephon.planner.selection.stores import selection_refs
from zephon.recipe.computed_cost import ComputedCost
from zephon.recipe.dataset import Dataset
from zephon.recipe.work_source import WorkSource
from zephon.specs import PackSpec, SamplePackSpec, TokenizeSpec
from zephon.storage.progress import progress_bar
from zephon.storage.scan import scan_shard


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedPlan:
    """A scanned, normalized work source ready to be laid out."""

    source: WorkSource
    shards: tuple[tuple[ShardRef, ...], ...]  # per dataset, global shard ids
    config: dict[str, Any]
    config_hash: str
    #: Per dataset, per shard: tokens of each row (``ShardTokens`` loads a shard's array when it is read).
    tokens: tuple[Sequence[np.ndarray], ...] | None
    token_provenance: dict[str, Any] | None
    tokenize: TokenizeSpec | None
    tokenizer_fingerprint: str | None
    pack: PackSpec | None
    count_report: CountReport | None
    #: Phase 0 (the mixture) and the work source's phases, resolved (``zephon.planner.phases``).
    stages: tuple[Stage, ...]
    #: Per dataset: its selected rows (``zephon.planner.selection.evaluate``), or None when it reads every row.
    selections: tuple[SelectedRows | None, ...] = ()
    #: A continued plan's new segment: what its parent's kept prefix placed (``zephon.planner.segment``), or None.
    segment: SegmentStart | None = None
    #: ``Pipeline.pack_samples``: samples grouped into rows by cost at plan time (``zephon.planner.costs``).
    sample_pack: SamplePackSpec | None = None
    _epochs: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)  # epoch_tokens

    def selection(self, index: int) -> SelectedRows | None:
        """Dataset ``index``'s selection, or None when it reads every row."""
        return self.selections[index] if self.selections else None

    def dataset_rows(self, index: int) -> int:
        """Documents one pass of dataset ``index`` reads: its selected rows, or all its rows."""
        chosen = self.selection(index)
        return chosen.selected if chosen is not None else sum(r.rows for r in self.shards[index])

    def epoch_tokens(self, index: int) -> int:
        """Tokens (costs) of one pass of dataset ``index``, computed once for the room check and the layout."""
        if index not in self._epochs:
            self._epochs[index] = sum(int(a.sum(dtype=np.int64)) for a in pass_counts(self, index))
        return self._epochs[index]

    @property
    def unit(self) -> str:
        if self.source.mixture_unit == "cost":
            return "cost"
        return "tokens" if self.source.token_estimation is not None else "samples"

    @property
    def costs(self) -> bool:
        """Whether ``tokens`` holds the samples' costs (its datasets have ``cost=``), not token counts."""
        return any(ds.cost is not None for ds in self.source.datasets)

    @property
    def exact(self) -> bool:
        return self.source.exact_tokens


def shard_refs(
    source: WorkSource, *, progress: bool | None = None, engine: str = "local", workers: int | None = None
) -> tuple[tuple[ShardRef, ...], ...]:
    """Scan every dataset's shards and number them (global shard ids in dataset order).

    The scan is ``Dataset.shards()`` taken a shard at a time, so that a bar can follow it on a terminal
    (``zephon.storage.progress``): Hub shards cost two range requests each, JSONL shards a full read.
    ``engine="ray"`` scans the raw datasets' shards as Ray tasks in batches (``zephon.planner.ray_scan``; the same
    shard records); ``workers``: CPUs of a local Ray instance when no cluster is running.
    """
    out = []
    next_id = 0
    total = sum(len(ds.files) for ds in source.datasets)
    with progress_bar(total=total, desc="scanning shards", unit="shard", progress=progress) as bar:
        scanned: list[list[ShardInfo]] | None = None
        if check_engine(engine) == "ray":
            from zephon.planner.ray_scan import scan_on_ray

            raw = [(ds.name, ds.files if ds.token_store is None else ()) for ds in source.datasets]
            scanned = scan_on_ray(raw, workers=workers, on_done=bar.update)
        for index, ds in enumerate(source.datasets):
            refs = []
            if ds.token_store is not None:
                infos: Iterator[ShardInfo] = iter(store_shards(ds))
            elif scanned is not None:
                infos = iter(scanned[index])
            else:
                infos = (scan_shard(ds.name, f) for f in ds.files)
            for info in infos:
                if scanned is None or ds.token_store is not None:
                    bar.update(1)
                if info.rows > np.iinfo(np.int32).max:
                    raise DatasetError(f"dataset {ds.name!r}: shard {info.uri} must have < 2^31 rows, got {info.rows}")
                refs.append(info.placed(shard_id=next_id, dataset_id=index, dataset=ds.name))
                next_id += 1
            if sum(r.rows for r in refs) == 0:
                raise DatasetError(
                    f"dataset {ds.name!r} must have at least one row, got 0 rows in {len(refs)} shard(s) at "
                    f"{ds.path!r} — fix the path or remove the dataset"
                )
            out.append(tuple(refs))
    return tuple(out)


def prepare(
    source: WorkSource,
    *,
    tokenize: TokenizeSpec | None = None,
    pack: PackSpec | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    operators: tuple[Operator, ...] = (),
    sample_pack: SamplePackSpec | None = None,
    engine: str = "local",
) -> PreparedPlan:
    """Scan the datasets, compute token counts if the plan needs them, and normalize the config.

    ``sample_pack`` (``Pipeline.pack_samples``) groups samples into rows by their ``cost=`` (``zephon.planner.costs``);
    the costs take the place of token counts. ``engine="ray"`` runs the heavy steps as Ray tasks — the footer scan,
    a partitioned sidecar join's partitions, the count pass (docs/ray.md) — with the local path's results, byte for
    byte; ``workers`` is then the CPUs of a local Ray instance when no cluster is running.

    ``operators`` (``Pipeline.map_transform`` / ``map_batch``) run before the count pass counts, and are named in the
    config (so in ``config_hash``) when there are any. ``progress``: bars for the scan, the estimate and the count
    pass (``zephon.storage.progress``: ``None`` draws them on a terminal only); they never change the result."""
    needs_tokens = source.token_estimation is not None or source.exact_tokens
    if needs_tokens and tokenize is None:
        raise ConfigError(
            "a token mixture or exact plan must be planned with a tokenizer, got none — call "
            ".tokenize(tokenizer_id=...) on the Pipeline, pass tokenize= to plan(), or add `tokenizer:` to CONFIG"
        )
    if source.exact_tokens and pack is None:
        raise ConfigError(
            "an exact plan decides packing, so it needs pack settings, got none — call .pack_flat(max_length=...) "
            "on the Pipeline, pass pack= to plan(), or add `packing:` to CONFIG"
        )
    if pack is not None and pack.algorithm != "wrap" and not source.exact_tokens:
        raise ConfigError(
            f'pack_flat(algorithm="{pack.algorithm}") must run on an exact plan, got exact_tokens=False — set '
            "exact_tokens=True on the work source (its rows are planned offline from exact counts)"
        )
    if pack is not None and pack.algorithm == "homogeneous" and source.phases:
        raise ConfigError(
            'pack_flat(algorithm="homogeneous") must plan a static mixture, got phases — its rows interleave '
            'over the whole plan; pack phased plans with algorithm="wrap" or "best_fit"'
        )
    chat = tokenize is not None and tokenize.chat is not None
    if chat and source.token_estimation is not None and not source.exact_tokens:
        raise ConfigError(
            "a token mixture of chat data must count tokens exactly, got token_estimation without exact_tokens "
            "— set exact_tokens=True (calibration measures tokens per byte of text, which a conversation is not)"
        )
    check_costs(source, tokenize, sample_pack)
    check_engine(engine)
    forget_stores()
    shards = shard_refs(source, progress=progress, engine=engine, workers=workers)
    selections = select_datasets(source, shards, engine=engine)
    raw = [ds.token_store is None for ds in source.datasets]
    # A plan made only of token stores never loads its tokenizer: its counts come from the stores' indexes.
    encoder = make_encoder(tokenize, operators) if needs_tokens and tokenize is not None and any(raw) else None
    tokens: list[Sequence[np.ndarray]] | None = None
    provenance: dict[str, Any] | None = None
    report = None
    if needs_tokens and tokenize is not None:
        pairs = enumerate(zip(source.datasets, shards, strict=True))
        stored = {i: store_tokens(ds, refs) for i, (ds, refs) in pairs if not raw[i]}
        if source.exact_tokens:
            tokens = [stored.get(i, ShardTokens([], rows=[], names=[])) for i in range(len(shards))]
            if encoder is not None:
                flat = [r for i, refs in enumerate(shards) if raw[i] for r in refs]
                arrays, report = token_counts(
                    flat, tokenize, encoder, workers=workers, progress=progress, engine=engine
                )
                at = 0
                for i, refs in enumerate(shards):
                    if raw[i]:
                        tokens[i], at = arrays[at : at + len(refs)], at + len(refs)
            provenance = {ds.name: {"method": "exact" if raw[i] else "index"} for i, ds in enumerate(source.datasets)}
        else:
            assert source.token_estimation is not None
            tokens, provenance = [], {}
            for index, (ds, refs) in enumerate(zip(source.datasets, shards, strict=True)):
                if index in stored:  # a token store's counts are exact, from its index
                    tokens.append(stored[index])
                    provenance[ds.name] = {"method": "index"}
                    continue
                assert encoder is not None
                estimate = estimate_dataset(
                    index=index,
                    name=ds.name,
                    refs=refs,
                    field=tokenize.field,
                    encoder=encoder,
                    estimation=source.token_estimation,
                    seed=source.seed,
                    progress=progress,
                )
                tokens.append(estimate.tokens)
                provenance[ds.name] = estimate.provenance
    if any(ds.cost is not None for ds in source.datasets):
        computed, _ = source_costs(source.datasets, shards, workers=workers, progress=progress, engine=engine)
        tokens = [
            dataset_costs(ds, refs, computed.get(index))
            for index, (ds, refs) in enumerate(zip(source.datasets, shards, strict=True))
        ]
        if sample_pack is not None and sample_pack.oversize == "refuse":
            for index, (ds, refs) in enumerate(zip(source.datasets, shards, strict=True)):
                chosen = selections[index] if selections else None
                rows: list[np.ndarray | None] = [None] * len(refs)
                if chosen is not None:
                    rows = [np.zeros(0, np.int64) for _ in refs]
                    for j, picked in chosen.by_shard():
                        rows[j] = picked
                check_oversize(ds, refs, tokens[index], rows, sample_pack.max_cost)
    return assemble(
        source,
        shards,
        sample_pack=sample_pack,
        tokens=tuple(tokens) if tokens is not None else None,
        token_provenance=provenance,
        tokenize=tokenize,
        tokenizer_fingerprint=(
            encoder.fingerprint
            if encoder is not None
            else (STORES_ONLY if needs_tokens and tokenize is not None else None)
        ),
        pack=pack,
        count_report=report,
        operators=operators,
        selections=selections,
    )


def select_datasets(
    source: WorkSource, shards: tuple[tuple[ShardRef, ...], ...], *, engine: str = "local"
) -> tuple[SelectedRows | None, ...] | None:
    """Each dataset's selection evaluated (``zephon.planner.selection.evaluate``; a partitioned join's partitions
    as Ray tasks with ``engine="ray"``); None when no dataset has one."""
    if all(ds.selection is None for ds in source.datasets):
        return None
    return tuple(
        select_rows(ds.selection, _selection_refs(ds, refs), seed=source.seed, dataset_index=index, engine=engine)
        if ds.selection is not None
        else None
        for index, (ds, refs) in enumerate(zip(source.datasets, shards, strict=True))
    )


def _selection_refs(ds: Dataset, refs: tuple[ShardRef, ...]) -> tuple[ShardRef, ...]:
    """The files a selection reads: the shards, or a token store's parts as their files
    (``zephon.planner.selection.stores``)."""
    return refs if ds.token_store is None else selection_refs(ds.name, open_dataset_store(ds), refs)


def assemble(
    source: WorkSource,
    shards: tuple[tuple[ShardRef, ...], ...],
    *,
    tokens: tuple[Sequence[np.ndarray], ...] | None = None,
    token_provenance: dict[str, Any] | None = None,
    tokenize: TokenizeSpec | None = None,
    tokenizer_fingerprint: str | None = None,
    pack: PackSpec | None = None,
    count_report: CountReport | None = None,
    operators: tuple[Operator, ...] = (),
    selections: tuple[SelectedRows | None, ...] | None = None,
    sample_pack: SamplePackSpec | None = None,
) -> PreparedPlan:
    """Normalize the config of ``source`` over already scanned ``shards`` (and per-row ``tokens``) and hash it.

    ``prepare`` calls this after scanning; benchmarks call it with synthetic shard tables.
    """
    fracs = exact_weights([float(source.mixture.weights[ds.name]) for ds in source.datasets])
    datasets = []
    for index, (ds, refs) in enumerate(zip(source.datasets, shards, strict=True)):
        digest = hashlib.sha256("\n".join(f"{r.uri}\t{r.fingerprint}" for r in refs).encode()).hexdigest()
        entry: dict[str, Any] = {
            "name": ds.name,
            "path": ds.path,
            "pinned": ds.pinned or ds.path,
            "shards": len(refs),
            "rows": sum(r.rows for r in refs),
            "fingerprint": digest,
        }
        if ds.token_store is not None:
            # How the executor opens the store again: the format as detected, the options, the ids' tokenizer.
            store = open_dataset_store(ds)
            entry["token_store"] = ds.token_store.normalized() | {
                "fmt": store.format,
                "tokenizer": store.tokenizer or ds.token_store.tokenizer,
                "identity": store_identity(ds, tokenize),  # what a run's tokenizer must share (vocab, specials)
            }
            if store.has_loss:  # the run's ids carry the mask (StoreLoss); absent otherwise: plans stay as they were
                entry["token_store"]["loss_mask"] = True
        chosen = selections[index] if selections else None
        if ds.selection is not None and chosen is not None:
            # The query as written, the sidecar's content digest and the counts: a changed sidecar or predicate
            # changes config_hash. Absent without a selection, so such plans stay byte-identical.
            entry["selection"] = ds.selection.normalized() | chosen.report.as_json()
        if isinstance(ds.cost, ComputedCost):  # the function's path and source hash: an edit changes the hash
            entry["cost"] = ds.cost.normalized() | describe_cost(resolve(ds.name, ds.cost.function))
        elif ds.cost is not None:  # only then: plans without costs keep their config and hash
            entry["cost"] = ds.cost
        datasets.append(entry)
    budget = source.budget()
    if all(v is None for v in budget.values()):
        budget["epochs"] = 1
    te = source.token_estimation
    config: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "seed": source.seed,
        "datasets": datasets,
        "mixture": {
            "unit": "cost" if source.mixture_unit == "cost" else ("tokens" if te is not None else "samples"),
            "weights": {ds.name: str(f) for ds, f in zip(source.datasets, fracs, strict=True)},
        },
        "budget": budget,
        "on_exhaustion": source.on_exhaustion,
        "shuffle": {"enabled": source.shuffle.enabled, "window_shards": source.shuffle.window_shards},
        "token_counts": "exact" if source.exact_tokens else ("estimated" if te is not None else None),
        "lanes": None if source.exact_tokens else source.lanes,
    }
    if tokenizer_fingerprint is not None and tokenize is not None:
        # The id is informational (a path may move); the fingerprint identifies the tokenizer.
        config["tokenizer"] = {"fingerprint": tokenizer_fingerprint, "field": tokenize.field}
    if te is not None and not source.exact_tokens:
        config["token_estimation"] = {
            "primer": te.primer,
            "calibration_samples": te.calibration_samples,
            "calibration_shards_max": te.calibration_shards_max,
            "token_count_columns": te.token_count_columns,
        }
    if source.phases:
        config["phases"] = normalized(source)
    if operators:  # only then: plans without user operators keep their config and hash
        config["operators"] = describe_operators(operators)
    if sample_pack is not None:
        config["sample_packing"] = sample_pack.normalized()
    if source.exact_tokens and pack is not None:
        config["packing"] = {"algorithm": pack.algorithm, "max_length": pack.max_length, "oversize": pack.oversize}
    return PreparedPlan(
        source=source,
        shards=shards,
        config=config,
        config_hash=config_digest(config),
        tokens=tokens,
        token_provenance=token_provenance,
        tokenize=tokenize,
        tokenizer_fingerprint=tokenizer_fingerprint,
        pack=pack if source.exact_tokens else None,
        count_report=count_report,
        stages=stages(source, pack if source.exact_tokens else None),
        selections=selections or (),
        sample_pack=sample_pack,
    )
