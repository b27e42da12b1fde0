"""Writing a plan bundle (see ``zephon.plan.format``) from a prepared work source.

``write_plan`` = ``prepare`` (scan, count or estimate tokens, normalize, hash) → ``layout`` (positions,
tokens, offsets, bins, in chunks) → write ``samples.parquet`` chunk by chunk with pyarrow
(``zephon.planner.samples_writer``: bounded memory, exact row groups, per-column encodings),
``shards.parquet`` and ``bins.parquet`` (best fit) with Polars, and ``plan.json``, into a temporary
directory renamed into place, so a reader never sees a half-written bundle.
"""

from __future__ import annotations

import itertools
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from zephon.errors import ConfigError
from zephon.executor.operators import Operator
from zephon.executor.step_arithmetic import sequences_in
from zephon.plan.format import (
    BINS_FILE,
    BINS_ROW_GROUP,
    BUNDLE_FILES,
    COPIES_DIR,
    COPIES_FILE,
    FORMAT_VERSION,
    PLAN_JSON,
    SAMPLES_FILE,
    SHARDS_FILE,
    is_copy_name,
)
from zephon.plan.integrity import INTEGRITY_KEY, integrity_record
from zephon.plan.manifest import read_manifest, warn_plan
from zephon.plan.records import shards_table
from zephon.planner.best_fit import Bins, pack, padding_fraction
from zephon.planner.homogeneous import window_bound_rows
from zephon.planner.layout import best_fit, chunks
from zephon.planner.prepare import PreparedPlan, prepare
from zephon.planner.room import check_room
from zephon.planner.samples_writer import SamplesWriter, Totals
from zephon.planner.selection_copies import copied_datasets, write_copies
from zephon.planner.shortfalls import plan_warnings
from zephon.planner.sources import overlaps
from zephon.recipe.work_source import WorkSource
from zephon.specs import PackSpec, TokenizeSpec
from zephon.storage.files import CACHE_DIR_FIX, atomic_directory, cache_dir, write_atomic
from zephon.storage.files import WRITER_SUFFIX as WRITER_SUFFIX  # re-exported: docs and tests name them here
from zephon.storage.files import sweep_stale_temporaries as sweep_stale_temporaries

if TYPE_CHECKING:
    from zephon.planner.continued import Continued

__all__ = ["PreparedPlan", "prepare", "write_bundle", "write_plan"]


def _zephon_version() -> str:
    try:
        return version("zephon")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "0+unknown"


def _shards_frame(prepared: PreparedPlan) -> pl.DataFrame:
    # Columns and types from SHARDS_SCHEMA; written by Polars, as the bundle's other small tables.
    frame = pl.from_arrow(shards_table(r for group in prepared.shards for r in group))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _manifest(
    prepared: PreparedPlan,
    totals: Totals,
    bins: Bins | None,
    dropped: np.ndarray | None = None,
    continued: Continued | None = None,
    copies: dict[str, Any] | None = None,
) -> dict[str, Any]:
    source = prepared.source
    weights = prepared.config["mixture"]["weights"]
    n_docs = totals.documents
    docs = totals.docs
    known = prepared.tokens is not None
    tok = totals.tokens if known and n_docs else None
    total_tokens = float(tok.sum()) if tok is not None else 0.0
    datasets = []
    for index, (ds, info, refs) in enumerate(
        zip(source.datasets, prepared.config["datasets"], prepared.shards, strict=True)
    ):
        entry: dict[str, Any] = {
            "id": index,
            "name": ds.name,
            "path": ds.path,
            "pinned": ds.pinned or ds.path,
            "format": refs[0].format,
            "fingerprint": info["fingerprint"],
            "shards": info["shards"],
            "first_shard_id": refs[0].shard_id,
            "rows": info["rows"],
            "weight": float(eval_fraction(weights[ds.name])),
            "planned_documents": int(docs[index]),
            "epochs_started": int(totals.last_epoch[index]) + 1 if docs[index] else 0,
            "passes_completed": int(docs[index]) // prepared.dataset_rows(index),
        }
        if "selection" in info:
            entry["selection"] = info["selection"]
        if tok is not None:
            entry["planned_tokens"] = int(tok[index])
            entry["planned_token_share"] = float(tok[index] / total_tokens) if total_tokens else 0.0
        if dropped is not None:
            entry["dropped_by_operators"] = int(dropped[index])
        datasets.append(entry)
    counts: dict[str, Any] = {"documents": n_docs, "shards": sum(len(r) for r in prepared.shards)}
    if known:
        counts["tokens"] = int(total_tokens)
        counts["tokens_are"] = "exact" if prepared.exact else "estimated"
    packing = None
    if prepared.exact and prepared.pack is not None:
        L = prepared.pack.max_length
        packing = {"algorithm": prepared.pack.algorithm, "max_length": L}
        if bins is None:
            packing["sequences"] = sequences_in(int(total_tokens), L)
            packing["padding_fraction"] = (packing["sequences"] * L - total_tokens) / (packing["sequences"] * L)
        else:
            b = bins
            packing.update({"sequences": b.sequences, "oversize": prepared.pack.oversize})
            packing["padding_fraction"] = padding_fraction(b, L)
            if prepared.pack.algorithm == "best_fit":
                tokens = totals.all_tokens().astype(np.int64)
                first_fit = pack(tokens, L, oversize=prepared.pack.oversize, first_fit=True)
                packing["first_fit_padding_fraction"] = padding_fraction(first_fit, L)
            packing.update(
                {
                    "split_documents": b.split_documents,
                    "dropped_documents": b.dropped_documents,
                    "dropped_tokens": b.dropped_tokens,
                }
            )
            if prepared.pack.algorithm == "homogeneous":  # any window of rows holds each share within this
                packing["window_bound_rows"] = window_bound_rows()
    tokenizer = None
    if prepared.tokenize is not None and prepared.tokenizer_fingerprint is not None:
        tokenizer = {
            "id": prepared.tokenize.tokenizer_id,
            "fingerprint": prepared.tokenizer_fingerprint,
            "field": prepared.tokenize.field,
            "add_bos": prepared.tokenize.add_bos,
            "eos_token": prepared.tokenize.eos_token,
        }
    files: dict[str, Any] = {"samples": [SAMPLES_FILE], "shards": SHARDS_FILE}
    if bins is not None:
        files["bins"] = BINS_FILE
    if copies is not None:
        files["copies"] = COPIES_FILE
    return (
        {
            "format_version": FORMAT_VERSION,
            "zephon_version": _zephon_version(),
            "config_hash": prepared.config_hash,
            "config": prepared.config,
            "seed": source.seed,
            "kind": "exact" if prepared.exact else "estimated",
            "lanes": None if prepared.exact else source.lanes,
            "datasets": datasets,
            "mixture": {"unit": prepared.unit, "weights": {d["name"]: d["weight"] for d in datasets}},
            "token_estimation": prepared.token_provenance,
            "tokenizer": tokenizer,
            "packing": packing,
            "shuffle": prepared.config["shuffle"],
            "budget": prepared.config["budget"],
            "on_exhaustion": source.on_exhaustion,
            "files": files,
            "totals": counts,
            "warnings": plan_warnings(
                prepared, documents=n_docs, docs=docs, tokens=int(total_tokens) if known else None
            ),
        }
        | ({"phases": _phases(prepared, totals)} if prepared.source.phases and continued is None else {})
        | _sources(prepared, datasets)
        | ({"selected_copies": copies} if copies is not None else {})
        | (continued.keys(prepared, _phases(prepared, totals)) if continued is not None else {})
    )


def _has_operators(prepared: PreparedPlan) -> bool:
    """The plan was made with user operators (``Pipeline.map_transform`` / ``map_batch``; named in its config)."""
    return bool(prepared.config.get("operators"))


def _sources(prepared: PreparedPlan, datasets: list[dict[str, Any]]) -> dict[str, Any]:
    """plan.json ``sources`` (datasets that are selections of one source, ``zephon.planner.selection.overlaps``);
    only in plans with a selection, so plans without one keep their bytes."""
    if not prepared.selections:
        return {}
    names = [d["name"] for d in datasets]
    planned = [d["planned_documents"] for d in datasets]
    return {"sources": overlaps(names, prepared.shards, prepared.selections, planned)}


def _phases(prepared: PreparedPlan, totals: Totals) -> list[dict[str, Any]]:
    """plan.json ``phases``: each phase's start as configured, weights, and the positions it occupies."""
    names = [ds.name for ds in prepared.source.datasets]
    configured = [None, *prepared.config.get("phases", [])]
    out = []
    end = totals.documents
    for stage in reversed(prepared.stages):
        done = totals.stages.get(stage.index)
        first = done.first_position if done is not None else end
        docs = done.docs if done is not None else np.zeros(len(names), np.int64)
        entry: dict[str, Any] = {
            "index": stage.index,
            "start": configured[stage.index]
            and {k: configured[stage.index][k] for k in ("start", "unit", "global_batch_size")},
            "start_position": stage.start_position,
            "start_tokens": stage.start_tokens,
            "weights": {n: float(f) for n, f in zip(names, stage.fractions(), strict=True) if f},
            "first_position": first,
            "end_position": end,
            "documents": int(docs.sum()),
            "planned_documents": {n: int(d) for n, d in zip(names, docs, strict=True)},
        }
        if done is not None and done.tokens is not None:
            entry["tokens"] = int(done.tokens.sum())
            entry["planned_tokens"] = {n: int(t) for n, t in zip(names, done.tokens, strict=True)}
        out.append(entry)
        end = first
    return out[::-1]


def eval_fraction(text: str) -> float:
    num, _, den = text.partition("/")
    return int(num) / int(den or 1)


def _storage_fix(out_dir: Path) -> str:
    """The alternative a storage error offers: the Pipeline plans into the cache, ``zephon plan`` where told."""
    if out_dir.absolute().is_relative_to(cache_dir().absolute()):
        return CACHE_DIR_FIX
    return "or write the plan to another directory"


def _check_replaceable(out_dir: Path, overwrite: bool) -> None:
    """Refuse to write over anything but nothing, an empty directory or (with ``overwrite``) a plan bundle.

    Writing replaces ``out_dir`` whole, so ``overwrite`` must never reach a directory that holds anything a
    plan writer did not write: a mistyped ``-o`` pointed at a dataset, a home directory or an old bundle a
    user added notes to is refused, with the first foreign entry named.
    """
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise ConfigError(
            f"plan output must be a directory, got {'a link' if out_dir.is_symlink() else 'a file'} at {out_dir} "
            "— choose another path"
        )
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries:
        return
    if not overwrite:
        raise ConfigError(
            f"plan output directory must be new or empty, got existing {out_dir} — choose another path "
            "or pass overwrite=True (--overwrite)"
        )
    foreign = [name for name in entries if not _ours(out_dir / name)]
    if foreign or PLAN_JSON not in entries:
        what = f"{foreign[0]!r}" if foreign else f"no {PLAN_JSON}"
        raise ConfigError(
            f"overwrite replaces only a plan bundle, got {out_dir} with {what} in it — nothing was changed; "
            "choose another output directory (overwrite never deletes what a plan writer did not write)"
        )


def _ours(path: Path) -> bool:
    """Whether a plan writer may have written ``path``: a bundle file, or the copies directory holding copies only."""
    if path.is_symlink():
        return False
    if path.name == COPIES_DIR and path.is_dir():
        return all(is_copy_name(p.name) and p.is_file() and not p.is_symlink() for p in path.iterdir())
    return path.name in BUNDLE_FILES and path.is_file()


def _nothing(_path: Path) -> bool:
    """Without ``overwrite`` no entry of ``out_dir`` is a plan writer's to replace."""
    return False


def write_bundle(
    prepared: PreparedPlan,
    out_dir: Path,
    *,
    overwrite: bool = False,
    continued: Continued | None = None,
    materialize_selections: bool = False,
    wait: bool = False,
) -> Path:
    """Lay out and write the bundle atomically: a temporary sibling directory renamed to ``out_dir``
    (:func:`~zephon.storage.files.atomic_directory`; a full or read-only disk is a ``StorageError``). One writer
    of ``out_dir`` at a time: another is refused in one line, or waited for (``wait``, the Pipeline's plan cache).
    At the moment of replacing, ``out_dir`` must still hold only what a plan writer writes (with ``overwrite``)
    or nothing: a file put there while planning is refused, nothing changed.

    ``materialize_selections``: also write compact copies of the rows the plan reads from its selected datasets'
    shards (``zephon.planner.selection_copies``); the plan itself is the same.

    ``continued``: a continuation's kept parent rows, written first, and its ``lineage`` and ``phases`` keys
    (``zephon.planner.continuation``)."""
    out_dir = Path(out_dir)
    _check_replaceable(out_dir, overwrite)
    check_room(prepared, out_dir)  # before days of layout into a hidden temporary
    copied = copied_datasets(prepared) if materialize_selections else None  # refused before anything is laid out
    ours = _ours if overwrite else _nothing
    with atomic_directory(out_dir, "the plan bundle", _storage_fix(out_dir), ours=ours, wait=wait) as tmp:
        packs = prepared.exact and prepared.pack is not None and prepared.pack.algorithm != "wrap"
        totals = Totals(datasets=len(prepared.shards), keep_tokens=packs)
        # Exact plans with user operators: a record an operator dropped was counted 0 tokens (count_worker), so
        # its plan rows are those with 0 tokens; counted per dataset for plan.json. Only then: other plans keep
        # their bytes.
        dropped = np.zeros(len(prepared.shards), np.int64) if prepared.exact and _has_operators(prepared) else None
        writer = SamplesWriter(tmp / SAMPLES_FILE)
        try:
            kept = continued.prefix.chunks() if continued is not None else iter(())
            laid = continued.checked(chunks(prepared)) if continued is not None else chunks(prepared)
            for chunk in itertools.chain(kept, laid):
                totals.add(chunk)
                if dropped is not None and chunk.tokens is not None:
                    dropped += np.bincount(chunk.dataset_id[chunk.tokens == 0], minlength=len(dropped))
                writer.write(chunk)
        except BaseException:
            writer.abort()
            raise
        writer.close()
        bins = best_fit(prepared, totals.all_tokens(), totals.all_datasets()) if packs else None
        _shards_frame(prepared).write_parquet(tmp / SHARDS_FILE, compression="zstd", statistics=True)
        if bins is not None:
            b = bins
            pl.DataFrame(
                {
                    "sequence": b.sequence,
                    "offset": b.offset,
                    "position": b.position,
                    "doc_start": b.doc_start,
                    "length": b.length,
                }
            ).write_parquet(tmp / BINS_FILE, compression="zstd", statistics=True, row_group_size=BINS_ROW_GROUP)
        copies = write_copies(prepared, copied, tmp, tmp / SAMPLES_FILE) if copied is not None else None
        # Written in place: the whole directory is renamed into place, so no reader sees a part of it.
        manifest = _manifest(prepared, totals, bins, dropped, continued, copies)
        (tmp / PLAN_JSON).write_text(_sealed_text(tmp, manifest), encoding="utf-8")
    return out_dir


def _sealed_text(plan_dir: Path, manifest: dict[str, Any]) -> str:
    """plan.json's text with, last, its ``integrity`` record: digests of every key above and of the bundle's
    Parquet files in ``plan_dir``, checked whenever the bundle is opened (``zephon.plan.integrity``)."""
    manifest.pop(INTEGRITY_KEY, None)
    manifest[INTEGRITY_KEY] = integrity_record(manifest, plan_dir)
    return json.dumps(manifest, indent=2) + "\n"


def seal_bundle(plan_dir: str | Path) -> None:
    """Rewrite plan.json of ``plan_dir`` with an ``integrity`` record of its present content and files.

    For tools and tests that write or rewrite a bundle on purpose; ``write_bundle`` seals what it writes.
    plan.json is replaced by a rename, so a reader sees the old or the new file, whole.
    """
    path = Path(plan_dir)
    text = _sealed_text(path, json.loads((path / PLAN_JSON).read_text(encoding="utf-8")))
    write_atomic(path / PLAN_JSON, lambda tmp: tmp.write_text(text, encoding="utf-8"), "plan.json", _storage_fix(path))


def write_plan(
    source: WorkSource,
    out_dir: Path,
    *,
    tokenize: TokenizeSpec | None = None,
    pack: PackSpec | None = None,
    overwrite: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    operators: tuple[Operator, ...] = (),
    materialize_selections: bool = False,
) -> Path:
    """Plan ``source`` and write the bundle to ``out_dir`` (``progress``, ``operators``: see ``prepare``;
    ``materialize_selections``: see ``write_bundle``)."""
    prepared = prepare(source, tokenize=tokenize, pack=pack, workers=workers, progress=progress, operators=operators)
    written = write_bundle(prepared, out_dir, overwrite=overwrite, materialize_selections=materialize_selections)
    warn_plan(read_manifest(written))  # a budget not met or heavy repetition: zephon.PlanWarning
    return written
