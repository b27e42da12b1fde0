"""Writing a plan bundle (see ``zephon.plan.format``) from a prepared work source.

``write_plan`` = ``prepare`` (scan, count or estimate tokens, normalize, hash) → ``layout`` (positions,
tokens, offsets, bins, in chunks) → write ``samples.parquet`` chunk by chunk with pyarrow
(``zephon.planner.samples_writer``: bounded memory, exact row groups, per-column encodings),
``shards.parquet`` and ``bins.parquet`` (best fit) with Polars, and ``plan.json`` (the typed ``Manifest`` of
``zephon.planner.manifest_writer``, sealed last), into a temporary directory renamed into place, so a reader
never sees a half-written bundle.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from zephon.checks import require_bool
from zephon.errors import ConfigError, DatasetError
from zephon.executor.operators import Operator, all_dropped
from zephon.plan.format import (
    BINS_FILE,
    BINS_ROW_GROUP,
    BUNDLE_FILES,
    COPIES_DIR,
    PLAN_JSON,
    SAMPLES_DIR,
    SHARDS_FILE,
    is_copy_name,
    is_samples_part,
)
from zephon.plan.integrity import INTEGRITY_KEY, integrity_record
from zephon.plan.json_record import to_json_value
from zephon.plan.manifest import plan_json_text, read_manifest, warn_plan
from zephon.plan.records import shards_table
from zephon.planner.copies import copied_datasets, write_copies
from zephon.planner.layout import best_fit, chunks
from zephon.planner.manifest_writer import Continued, plan_manifest
from zephon.planner.prepare import PreparedPlan, prepare
from zephon.planner.ray_cluster import check_engine
from zephon.planner.room import check_room
from zephon.planner.samples_writer import SamplesWriter, Totals
from zephon.recipe.work_source import WorkSource
from zephon.specs import PackSpec, SamplePackSpec, TokenizeSpec
from zephon.storage.files import CACHE_DIR_FIX, atomic_directory, cache_dir, write_atomic
from zephon.storage.files import WRITER_SUFFIX as WRITER_SUFFIX  # re-exported: docs and tests name them here
from zephon.storage.files import sweep_stale_temporaries as sweep_stale_temporaries

__all__ = ["PlanOptions", "PreparedPlan", "prepare", "write_bundle", "write_plan"]


def _shards_frame(prepared: PreparedPlan) -> pl.DataFrame:
    # Columns and types from SHARDS_SCHEMA; written by Polars, as the bundle's other small tables.
    frame = pl.from_arrow(shards_table(r for group in prepared.shards for r in group))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _has_operators(prepared: PreparedPlan) -> bool:
    """The plan was made with user operators (``Pipeline.map_transform`` / ``map_batch``; named in its config)."""
    return bool(prepared.config.get("operators"))


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
        above = next((a for a in out_dir.absolute().parents if a.exists()), None)  # the nearest that exists
        if above is not None and not above.is_dir():
            raise ConfigError(f"plan output must be in a directory, got a file at {above} — choose another path")
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
    """Whether a plan writer may have written ``path``: a bundle file, or the copies (samples parts) directory holding
    copies (parts) only."""
    if path.is_symlink():
        return False
    if path.name == COPIES_DIR and path.is_dir():
        return all(is_copy_name(p.name) and p.is_file() and not p.is_symlink() for p in path.iterdir())
    if path.name == SAMPLES_DIR and path.is_dir():
        return all(is_samples_part(p.name) and p.is_file() and not p.is_symlink() for p in path.iterdir())
    return path.name in BUNDLE_FILES and path.is_file()


def _nothing(_path: Path) -> bool:
    """Without ``overwrite`` no entry of ``out_dir`` is a plan writer's to replace."""
    return False


def _check_tokens(prepared: PreparedPlan, totals: Totals, dropped: np.ndarray | None) -> None:
    """An exact plan must hold a token to train on (its packing has no row otherwise): one line saying why not."""
    if not prepared.exact or totals.tokens is None or totals.tokens.sum() > 0 or not totals.documents:
        return
    n = totals.documents
    if dropped is not None and int(dropped.sum()) == n:
        raise all_dropped(n, "the plan", counted=True)
    raise DatasetError(
        f"an exact plan must hold tokens to train on, got 0 tokens in its {n} documents (empty texts, and no BOS or "
        "EOS added) — check the text field and the data, or keep the special tokens"
    )


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
    shards (``zephon.planner.copies``); the plan itself is the same.

    ``continued``: a continuation's kept parent rows, written first, and its ``lineage`` and ``phases`` keys
    (``zephon.planner.continuation.child``)."""
    out_dir = Path(out_dir)
    _check_replaceable(out_dir, overwrite)
    check_room(prepared, out_dir)  # before days of layout into a hidden temporary
    copied = copied_datasets(prepared) if materialize_selections else None  # refused before anything is laid out
    ours = _ours if overwrite else _nothing
    with atomic_directory(out_dir, "the plan bundle", _storage_fix(out_dir), ours=ours, wait=wait) as tmp:
        packs = prepared.sample_pack is not None or (
            prepared.exact and prepared.pack is not None and prepared.pack.algorithm != "wrap"
        )
        totals = Totals(datasets=len(prepared.shards), keep_tokens=packs)
        # Exact plans with user operators: a record an operator dropped was counted 0 tokens (count_worker), so
        # its plan rows are those with 0 tokens; counted per dataset for plan.json. Only then: other plans keep
        # their bytes.
        dropped = np.zeros(len(prepared.shards), np.int64) if prepared.exact and _has_operators(prepared) else None
        writer = SamplesWriter(tmp)
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
        _check_tokens(prepared, totals, dropped)
        closes = _sample_closes(prepared, totals, continued)
        bins = best_fit(prepared, totals.all_tokens(), totals.all_datasets(), closes) if packs else None
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
        samples = [tmp / name for name in writer.files]
        copies = write_copies(prepared, copied, tmp, samples) if copied is not None else None
        # Written in place: the whole directory is renamed into place, so no reader sees a part of it.
        # Sealed last: the integrity record digests every other key and the Parquet files written above, and is
        # checked whenever the bundle is opened (zephon.plan.integrity).
        manifest = plan_manifest(prepared, totals, bins, dropped, continued, copies, tuple(writer.files)).sealed(tmp)
        (tmp / PLAN_JSON).write_text(manifest.to_json(), encoding="utf-8")
    return out_dir


def _sample_closes(
    prepared: PreparedPlan, totals: Totals, continued: Continued | None
) -> tuple[tuple[int, int | None], ...]:
    """Where a plan that packs samples by cost closes its rows (``zephon.planner.best_fit``): every open row at
    the first position of each phase, so no row holds two phases' samples and each phase's rows hold its shares
    alone; a continuation first replays its parent's closes before the seam, then closes the rows it keeps at the
    seam (``Continued.sample_closes``). Other plans: none."""
    if prepared.sample_pack is None:
        return ()
    out = list(continued.sample_closes) if continued is not None else []
    seam = continued.prefix.position if continued is not None else 0
    firsts = sorted(s.first_position for index, s in totals.stages.items() if index >= 0)
    out.extend((p, None) for p in firsts if p > seam)
    return tuple(out)


def seal_bundle(plan_dir: str | Path) -> None:
    """Rewrite plan.json of ``plan_dir`` with an ``integrity`` record of its present content and files.

    For tools and tests that write or rewrite a bundle on purpose; ``write_bundle`` seals what it writes. The
    JSON is kept as it is, keys the schema does not know (or an older format's) included: only the record is
    replaced, last. plan.json is replaced by a rename, so a reader sees the old or the new file, whole.
    """
    path = Path(plan_dir)
    data = json.loads((path / PLAN_JSON).read_text(encoding="utf-8"))
    data.pop(INTEGRITY_KEY, None)
    text = plan_json_text(data | {INTEGRITY_KEY: to_json_value(integrity_record(data, path))})
    write_atomic(path / PLAN_JSON, lambda tmp: tmp.write_text(text, encoding="utf-8"), "plan.json", _storage_fix(path))


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanOptions:
    """What a work source is planned with besides itself, for every way of planning (``planner.entry``).

    ``tokenize``, ``pack`` and ``operators`` are part of the plan (its counts and config hash depend on them);
    ``overwrite``, ``workers`` (count-pass processes, or a local Ray instance's CPUs), ``engine`` ("local", or
    "ray": the scan, a partitioned sidecar join and the count pass as Ray tasks, docs/ray.md), ``progress`` (bars;
    None: on a terminal) and ``materialize_selections`` (copies of the selected rows, ``write_bundle``) change how
    it is written, never what.
    """

    tokenize: TokenizeSpec | None = None
    pack: PackSpec | None = None
    operators: tuple[Operator, ...] = ()
    overwrite: bool = False
    workers: int | None = None
    progress: bool | None = None
    materialize_selections: bool = False
    #: ``Pipeline.pack_samples``: samples grouped into rows by cost (part of the plan, like ``pack``).
    sample_pack: SamplePackSpec | None = None
    engine: str = "local"

    def __post_init__(self) -> None:
        check_engine(self.engine)
        require_bool(self.overwrite, "overwrite")  # a quoted "false" would replace an existing bundle
        require_bool(self.progress, "progress", optional=True)
        require_bool(self.materialize_selections, "materialize_selections")

    def prepare(self, source: WorkSource) -> PreparedPlan:
        """``source`` scanned, counted and normalized with these options (``prepare``)."""
        return prepare(
            source,
            tokenize=self.tokenize,
            pack=self.pack,
            workers=self.workers,
            progress=self.progress,
            operators=self.operators,
            sample_pack=self.sample_pack,
            engine=self.engine,
        )


def write_plan(source: WorkSource, out_dir: Path, options: PlanOptions | None = None) -> Path:
    """Plan ``source`` and write the bundle to ``out_dir`` (``PlanOptions``)."""
    options = options or PlanOptions()
    written = write_bundle(
        options.prepare(source),
        out_dir,
        overwrite=options.overwrite,
        materialize_selections=options.materialize_selections,
    )
    warn_plan(read_manifest(written))  # a budget not met or heavy repetition: zephon.PlanWarning
    return written
