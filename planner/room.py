"""Whether a plan bundle can fit before it is written: its size estimated from the documents it will plan.

samples.parquet holds one row per planned document (position, dataset, shard, row, epoch, and per plan kind
tokens, offset, deal), zstd-compressed; ``BYTES_PER_DOCUMENT`` is a lower bound of its size a document, so a
plan that fits is never refused and a budget of 10^12 documents (at least 3.6 TiB) is refused in one line
before any layout, instead of filling the disk from a hidden temporary for days. Every plan kind goes through
``check_room`` (samples, token and cost mixtures, estimated and exact, phased, continued: ``write_bundle``); exact
and packed plans hold more columns, so the same lower bound refuses only what cannot fit.

The documents are a lower bound too (``planned_documents``), for every budget: ``num_documents`` itself; ``epochs``
E (1 when no budget is given) at least E passes of the smallest dataset's (selected) rows; a ``num_tokens`` or
``num_cost`` budget B (tokens below; costs alike) from the passes' counts. The plan ends with the document that
brings its tokens to B. Dataset ``i`` reads its documents in passes of ``R_i`` documents and ``E_i`` tokens (mean
``m_i = E_i / R_i``), each pass a permutation of the same documents; ``C_i = Σ max(0, t − m_i)`` over a pass is the
most any k of its documents exceed ``k·m_i`` by. So ``d`` consecutive documents — full passes plus a partial one at
the end (and, in a continuation, one at the start) — hold at most ``d·m_i + s·C_i`` tokens (s = 1, or 2 for a
continuation), whatever the mixture, phases or order. Summing, ``B ≤ D·max m_i + s·ΣC_i``, so ``D ≥ (B − s·ΣC_i) /
max m_i``. A continuation adds its kept prefix's documents and counts B less the prefix's tokens; with
``on_exhaustion="stop"`` the plan may end at the first dataset's last pass, so the bound is the smaller of that and
the epochs bound. ``E_i`` is computed once here and reused by the layout (``PreparedPlan.epoch_tokens``); ``C_i``
takes one more pass over the counts, only when the bound could exceed the free space (else ``C_i ≤ E_i`` serves,
and nothing is refused).

Worked example: one dataset of 5 documents of 4, 10, 5, 8 and 2 tokens (m = 29 / 5 = 5.8, C = 4.2 + 2.2 = 6.4) and
``num_tokens: 10^15`` → D ≥ (10^15 − 6.4) / 5.8 → 172,413,793,103,448 documents, ≥ 627.2 TiB: refused on any disk,
before the layout; ``num_tokens: 29`` (one pass) → D ≥ (29 − 6.4) / 5.8 → 4 (the plan holds 5 or more).

A partitioned sidecar join (``zephon.planner.selection.join``) first writes both sides' referenced columns to
its spill directory: ``check_spill_room`` refuses, before that copy, a join whose rows cannot fit there at
``SPILL_BYTES_PER_ROW`` each (measured at 10^9: 8.0 bytes per document with an int64 key, positions and a
one-byte score, 9.4 per sidecar row with an int64 key and a float32; the bound is half of that).

Worked example: 10^9 documents joined to 10^9 sidecar rows need ≥ 2·10^9 × 4 B = 7.5 GiB free under ``$TMPDIR``;
with 5 GiB free the plan stops in one line naming the directory, the estimate and what is free.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Protocol

import numpy as np

from zephon.errors import ConfigError
from zephon.planner.segment import SegmentStart
from zephon.recipe.work_source import WorkSource


class PreparedPlan(Protocol):
    """What the estimate reads of ``zephon.planner.prepare.PreparedPlan`` (named here, not imported: the sidecar
    join checks its spill room through this module, and ``prepare`` runs the join)."""

    @property
    def source(self) -> WorkSource: ...

    @property
    def shards(self) -> Sequence[Sequence[object]]: ...

    @property
    def segment(self) -> SegmentStart | None: ...

    @property
    def unit(self) -> str: ...

    def selection(self, index: int) -> SelectedRowsView | None: ...

    def dataset_rows(self, index: int) -> int: ...

    @property
    def tokens(self) -> Sequence[Sequence[np.ndarray]] | None: ...

    def epoch_tokens(self, index: int) -> int: ...


class SelectedRowsView(Protocol):
    """What the estimate reads of a selection (``zephon.planner.selection.evaluate.SelectedRows``)."""

    def by_shard(self) -> Iterator[tuple[int, np.ndarray]]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Documents:
    """A lower bound of a plan's documents and where it comes from."""

    #: The documents the plan holds at least.
    count: int
    #: What bounds it, for the message ("" for a document or epochs budget).
    why: str = ""
    #: The budget to lower.
    budget: str = "num_documents or epochs"


#: A lower bound of samples.parquet's bytes a planned document (its columns compress to more).
BYTES_PER_DOCUMENT = 4
#: A lower bound of a partitioned join's spill bytes a row (document or sidecar row), half of what was measured.
SPILL_BYTES_PER_ROW = 4


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor: the file system the bundle will be written to."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def planned_documents(prepared: PreparedPlan) -> int:
    """A lower bound of the documents ``prepared`` will plan, for every budget (the module's docstring)."""
    return _documents(prepared, free=None).count


def _documents(prepared: PreparedPlan, *, free: int | None) -> Documents:
    """The bound; with ``free`` (bytes), a token budget's bound is refined only when it could exceed them."""
    source = prepared.source
    if source.num_documents is not None:
        return Documents(count=int(source.num_documents))
    passes = (source.epochs or 1) * min(prepared.dataset_rows(i) for i in range(len(prepared.shards)))
    name = "num_cost" if prepared.unit == "cost" else "num_tokens"
    amount = getattr(source, name)
    if amount is None:
        return Documents(count=passes)
    by_amount = _by_amount(prepared, int(amount), name, free)
    if source.on_exhaustion == "stop" and passes < by_amount.count:
        return Documents(count=passes, why="; on_exhaustion=stop ends it at a dataset's last pass", budget=name)
    return by_amount


def _by_amount(prepared: PreparedPlan, amount: int, name: str, free: int | None) -> Documents:
    """``D ≥ placed + (B − done − s·ΣC_i) / max(E_i / R_i)`` (the module's docstring), rounded up; when even
    ``C_i = 0`` could not exceed ``free``, ``C_i = E_i`` (no second pass over the counts: nothing is refused)."""
    segment = prepared.segment
    placed, done = (segment.position, segment.tokens) if segment is not None else (0, 0)
    passes = [(i, prepared.epoch_tokens(i), prepared.dataset_rows(i)) for i in range(len(prepared.shards))]
    passes = [(i, e, r) for i, e, r in passes if r > 0]
    longest = max((Fraction(e, r) for _, e, r in passes), default=Fraction(0))
    if longest == 0:
        return Documents(count=placed, budget=name)
    most = placed + math.ceil(max(0, amount - done) / longest)
    refine = free is None or most * BYTES_PER_DOCUMENT > free
    excess = sum((_excess(prepared, i, e, r) if refine else Fraction(e) for i, e, r in passes), Fraction(0))
    left = amount - done - (2 if segment is not None else 1) * excess
    count = placed + max(0, math.ceil(left / longest))
    unit = "cost" if name == "num_cost" else "tokens"
    return Documents(count=count, why=f"; {name} {amount} at ≤ {float(longest):.1f} {unit} a document", budget=name)


def _excess(prepared: PreparedPlan, index: int, tokens: int, rows: int) -> Fraction:
    """``C``: the tokens dataset ``index``'s documents longer than its mean ``m = tokens / rows`` hold above it,
    ``Σ max(0, t − m)`` over one pass — the most any ``k`` of its documents exceed ``k·m`` by."""
    floor, total, count = tokens // rows, 0, 0
    for values in pass_counts(prepared, index):
        above = values[values > floor]
        total, count = total + int(above.sum(dtype=np.int64)), count + len(above)
    return total - count * Fraction(tokens, rows)


def check_room(prepared: PreparedPlan, out_dir: Path) -> None:
    """Refuse, in one line with the estimate, a plan whose bundle cannot fit on ``out_dir``'s file system."""
    free = shutil.disk_usage(_existing(out_dir)).free
    documents = _documents(prepared, free=free)
    need = documents.count * BYTES_PER_DOCUMENT
    if need > free:
        raise ConfigError(
            f"the plan bundle must fit on the disk of {out_dir}, got about {need / 2**30:.1f} GiB needed for "
            f"{documents.count} documents (≥ {BYTES_PER_DOCUMENT} bytes each{documents.why}) and "
            f"{free / 2**30:.1f} GiB free — lower {documents.budget}, free space, or write the plan to another disk"
        )


def check_spill_room(spill: str, rows: int, what: str) -> None:
    """Refuse, in one line with the estimate, a partitioned join of ``rows`` rows whose copies cannot fit in
    ``spill`` (``what`` names the join)."""
    need = rows * SPILL_BYTES_PER_ROW
    free = shutil.disk_usage(_existing(Path(spill))).free
    if need > free:
        raise ConfigError(
            f"{what} must fit in the spill directory {spill}, got about {need / 2**30:.1f} GiB needed for {rows} "
            f"rows (≥ {SPILL_BYTES_PER_ROW} bytes each) and {free / 2**30:.1f} GiB free — point TMPDIR at a larger "
            "disk or free space there"
        )


def pass_counts(prepared: PreparedPlan, index: int) -> Iterator[np.ndarray]:
    """Dataset ``index``'s counts (tokens or costs) of one pass, a shard at a time: every row's, or only its
    selection's rows (none without counts) — what ``PreparedPlan.epoch_tokens`` sums and ``_excess`` walks."""
    tokens = prepared.tokens[index] if prepared.tokens is not None else ()
    chosen = prepared.selection(index)
    return iter(tokens) if chosen is None else (tokens[j][rows] for j, rows in chosen.by_shard())
