"""What changed between two plans: config, the first diverging document, per-dataset volumes, shards.

``diff_plans(a, b)`` compares two bundles:

* **config**: the leaves of ``plan.json`` ``config`` whose values differ, as dotted paths (list items by
  index: ``datasets.2.path``, ``mixture.weights.prose``); a key present in one plan only is a difference.
* **first difference**: the first position whose document — (shard URI, shard fingerprint, row) — differs,
  or where one plan ends; with a batch size, the step holding that document's first token in each plan.
  Shards are compared by URI and fingerprint, never by ``shard_id`` (adding a shard renumbers the rest).
  Both samples files are streamed side by side a million rows at a time and the scan stops at the first
  difference, so identical prefixes cost one read of two columns.
* **datasets**: documents and tokens per dataset name in A and in B (matched by name; a dataset missing
  from a plan counts 0).
* **branch**: when one plan continues the other (plan.json ``lineage``), its branch step and position: the
  plans share their steps before it, so the first difference is at or after the branch position.
* **shards**: added (in B only) and removed (in A only), by (URI, fingerprint) (``ShardInfo.identity``): a
  shard rewritten in place shows as removed and added. They are the plans' ``ShardRef`` records (rows of
  shards.parquet).

Worked example: plan A mixes prose/code 1/2 each with seed 1, plan B 3/5 and 2/5. Config differences:
``mixture.weights.code: "1/2" → "2/5"`` and ``mixture.weights.prose: "1/2" → "3/5"``; the earliest-deadline
interleave diverges at the first position where the two weightings pick different datasets; documents per
dataset move from 500/500 to 600/400 in a 1000-document plan.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephon.errors import PlanFormatError, one_line
from zephon.inspection.sql import connect
from zephon.inspection.steps import resolve_layout
from zephon.inspection.views import connect_with_steps, document_steps_sql
from zephon.plan.bundle import DAMAGED, CheckedBundle, CheckedFile, open_bundle
from zephon.plan.manifest import Manifest
from zephon.plan.records import ShardRef, shard_refs

__all__ = ["ConfigChange", "DatasetVolumes", "DocumentRef", "FirstDifference", "PlanDiff", "ShardRef", "diff_plans"]

_CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigChange:
    """A config leaf whose value differs; ``in_a``/``in_b`` say whether the plan has the key at all."""

    path: str
    a: Any
    b: Any
    in_a: bool = True
    in_b: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class DocumentRef:
    """A scheduled document: where it lives."""

    dataset: str
    uri: str
    fingerprint: str
    row: int


@dataclass(frozen=True, kw_only=True, slots=True)
class FirstDifference:
    """The first position whose document differs; ``a`` or ``b`` is ``None`` past the end of that plan."""

    position: int
    step_a: int | None
    step_b: int | None
    a: DocumentRef | None
    b: DocumentRef | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetVolumes:
    """Documents and tokens of one dataset in each plan (tokens ``None`` when that plan has none)."""

    name: str
    documents_a: int
    documents_b: int
    tokens_a: int | None
    tokens_b: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Branch:
    """One plan continues the other (plan.json ``lineage``): where it branched."""

    #: ``"B"`` when B continues A, ``"A"`` when A continues B.
    child: str
    step: int
    position: int
    global_batch: int
    #: Datasets of the parent the child reads no more after the branch (still read by the shared steps).
    removed: tuple[str, ...] = ()
    #: Datasets the child adds after the branch.
    added: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanDiff:
    """Differences from plan A to plan B."""

    plan_a: str
    plan_b: str
    config_hash_a: str
    config_hash_b: str
    config_changes: tuple[ConfigChange, ...]
    #: ``None`` when both plans schedule the same documents in the same order.
    first_difference: FirstDifference | None
    documents_a: int
    documents_b: int
    datasets: tuple[DatasetVolumes, ...]
    shards_added: tuple[ShardRef, ...]
    shards_removed: tuple[ShardRef, ...]
    #: Set when one plan is a continuation of the other (``zephon.planner.continuation.child``).
    branch: Branch | None = None

    @property
    def identical(self) -> bool:
        return (
            not self.config_changes
            and self.first_difference is None
            and not self.shards_added
            and not self.shards_removed
        )


def diff_plans(
    plan_a: str | os.PathLike[str],
    plan_b: str | os.PathLike[str],
    *,
    batch_size: int | None = None,
    max_length: int | None = None,
) -> PlanDiff:
    """Compare two plan bundles (see the module docstring); steps need ``batch_size``."""
    a, b = open_bundle(plan_a), open_bundle(plan_b)
    ma, mb = a.manifest, b.manifest
    shards_a, shards_b = _shards(a), _shards(b)
    keys_a = {s.identity for s in shards_a.values()}
    keys_b = {s.identity for s in shards_b.values()}
    first = _first_difference(a, shards_a, b, shards_b)
    if first is not None and batch_size is not None:
        first = FirstDifference(
            position=first.position,
            step_a=_step_of(a, first.position, batch_size, max_length) if first.a else None,
            step_b=_step_of(b, first.position, batch_size, max_length) if first.b else None,
            a=first.a,
            b=first.b,
        )
    vol_a, vol_b = _volumes(a), _volumes(b)
    names = list(dict.fromkeys([*vol_a, *vol_b]))
    return PlanDiff(
        plan_a=str(a.path),
        plan_b=str(b.path),
        config_hash_a=ma.config_hash,
        config_hash_b=mb.config_hash,
        config_changes=tuple(config_changes(ma.config, mb.config)),
        first_difference=first,
        documents_a=ma.totals.documents,
        documents_b=mb.totals.documents,
        datasets=tuple(
            DatasetVolumes(
                name=n,
                documents_a=vol_a.get(n, (0, None))[0],
                documents_b=vol_b.get(n, (0, None))[0],
                tokens_a=vol_a.get(n, (0, _zero_tokens(ma)))[1],
                tokens_b=vol_b.get(n, (0, _zero_tokens(mb)))[1],
            )
            for n in names
        ),
        branch=_branch(ma, mb),
        shards_added=tuple(s for s in shards_b.values() if s.identity not in keys_a),
        shards_removed=tuple(s for s in shards_a.values() if s.identity not in keys_b),
    )


def config_changes(a: Any, b: Any, prefix: str = "") -> Iterator[ConfigChange]:
    """Differing leaves of two JSON values, depth first, keys in A's order then B's new keys."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in dict.fromkeys([*a, *b]):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in b:
                yield ConfigChange(path=path, a=a[key], b=None, in_b=False)
            elif key not in a:
                yield ConfigChange(path=path, a=None, b=b[key], in_a=False)
            else:
                yield from config_changes(a[key], b[key], path)
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            path = f"{prefix}.{i}" if prefix else str(i)
            if i >= len(b):
                yield ConfigChange(path=path, a=a[i], b=None, in_b=False)
            elif i >= len(a):
                yield ConfigChange(path=path, a=None, b=b[i], in_a=False)
            else:
                yield from config_changes(a[i], b[i], path)
    elif a != b or type(a) is not type(b):
        yield ConfigChange(path=prefix, a=a, b=b)


def _branch(a: Manifest, b: Manifest) -> Branch | None:
    """Where B continues A (or A continues B), from plan.json ``lineage``; None when neither does."""
    for child, parent, label in ((b, a, "B"), (a, b, "A")):
        lineage = child.lineage
        if lineage is not None and lineage.parent.config_hash == parent.config_hash:
            br = lineage.branch
            removed = tuple(child.config.get("continue_from", {}).get("removed", ()))
            added = tuple(n for n in child.dataset_names if n not in parent.dataset_names)
            return Branch(child=label, step=br.step, position=br.position, global_batch=br.global_batch,
                          removed=removed, added=added)  # fmt: skip
    return None


def _zero_tokens(manifest: Manifest) -> int | None:
    return 0 if manifest.totals.tokens is not None else None


def _shards(plan: CheckedBundle) -> dict[int, ShardRef]:
    return {s.shard_id: s for s in shard_refs(plan.shards.read())}


def _chunks(plan: CheckedBundle) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(shard_id, row) of the samples in plan order, in chunks of exactly ``_CHUNK`` rows (the last shorter)."""
    shard_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    held = 0
    for file in plan.samples:
        for batch in _batches(file):
            shard_parts.append(batch.column(0).to_numpy())
            row_parts.append(batch.column(1).to_numpy())
            held += batch.num_rows
            while held >= _CHUNK:
                shard, row = np.concatenate(shard_parts), np.concatenate(row_parts)
                yield shard[:_CHUNK], row[:_CHUNK]
                shard_parts, row_parts, held = [shard[_CHUNK:]], [row[_CHUNK:]], held - _CHUNK
    if held:
        yield np.concatenate(shard_parts), np.concatenate(row_parts)


def _batches(file: CheckedFile) -> Iterator[pa.RecordBatch]:
    """(shard_id, row) batches of a samples file; a data page that does not decode is one line naming it."""
    try:
        yield from file.open().iter_batches(batch_size=_CHUNK, columns=["shard_id", "row"])
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise PlanFormatError(f"{file.path} must be readable Parquet, got {one_line(exc)} — {DAMAGED}") from exc


def _first_difference(
    a: CheckedBundle, sa: dict[int, ShardRef], b: CheckedBundle, sb: dict[int, ShardRef]
) -> FirstDifference | None:
    # One integer per distinct (uri, fingerprint) across both plans, so shard ids of A and B compare.
    keys: dict[tuple[str, str], int] = {}
    for s in [*sa.values(), *sb.values()]:
        keys.setdefault(s.identity, len(keys))

    def lookup(shards: dict[int, ShardRef]) -> np.ndarray:
        table = np.full(max(shards, default=-1) + 1, -1, dtype=np.int64)
        for shard_id, s in shards.items():
            table[shard_id] = keys[s.identity]
        return table

    la, lb = lookup(sa), lookup(sb)
    start = 0
    chunks_b = _chunks(b)
    for shard_a, row_a in _chunks(a):
        shard_b, row_b = next(chunks_b, (np.zeros(0, np.int32), np.zeros(0, np.int32)))
        n = min(len(shard_a), len(shard_b))
        differs = (la[shard_a[:n]] != lb[shard_b[:n]]) | (row_a[:n] != row_b[:n])
        if differs.any() or len(shard_a) != len(shard_b):
            i = int(np.argmax(differs)) if differs.any() else n
            return FirstDifference(
                position=start + i,
                step_a=None,
                step_b=None,
                a=_ref(sa, shard_a, row_a, i),
                b=_ref(sb, shard_b, row_b, i),
            )
        start += n
    rest = next(chunks_b, None)
    if rest is not None:
        return FirstDifference(position=start, step_a=None, step_b=None, a=None, b=_ref(sb, *rest, 0))
    return None


def _ref(shards: dict[int, ShardRef], shard_ids: np.ndarray, rows: np.ndarray, i: int) -> DocumentRef | None:
    if i >= len(shard_ids):
        return None
    s = shards[int(shard_ids[i])]
    return DocumentRef(dataset=s.dataset, uri=s.uri, fingerprint=s.fingerprint, row=int(rows[i]))


def _step_of(plan: CheckedBundle, position: int, batch_size: int, max_length: int | None) -> int | None:
    layout = resolve_layout(plan.manifest, batch_size=batch_size, max_length=max_length)
    con = connect_with_steps(plan, batch_size, max_length=max_length)
    try:
        found = con.execute(f"SELECT step FROM ({document_steps_sql(layout)}) WHERE position = $p", {"p": position})
        row = found.fetchone()
    finally:
        con.close()
    return None if row is None else int(row[0])


def _volumes(plan: CheckedBundle) -> dict[str, tuple[int, int | None]]:
    """Documents and tokens per dataset name (tokens ``None`` for a plan without token counts)."""
    has_tokens = plan.manifest.totals.tokens is not None
    con = connect(plan)
    try:
        rows = con.execute(
            "SELECT d.name, count(s.position), sum(s.tokens) FROM datasets d LEFT JOIN samples s USING (dataset_id) "
            "GROUP BY d.dataset_id, d.name ORDER BY d.dataset_id"
        ).fetchall()
    finally:
        con.close()
    return {name: (int(n), int(t or 0) if has_tokens else None) for name, n, t in rows}
