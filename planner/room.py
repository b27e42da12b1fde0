"""Whether a plan bundle can fit before it is written: its size estimated from the documents it will plan.

samples.parquet holds one row per planned document (position, dataset, shard, row, epoch, and per plan kind
tokens, offset, deal), zstd-compressed; ``BYTES_PER_DOCUMENT`` is a lower bound of its size a document, so a
plan that fits is never refused and a budget of 10^12 documents (at least 3.6 TiB) is refused in one line
before any layout, instead of filling the disk from a hidden temporary for days. Every plan kind goes through
``check_room`` (samples and token mixtures, estimated and exact, phased, continued: ``write_bundle``); exact and
packed plans hold more columns, so the same lower bound refuses only what cannot fit. The documents are a lower
bound too (``planned_documents``): the budget, or the epochs times the smallest dataset's (selected) rows.

A partitioned sidecar join (``zephon.planner.selection.join``) first writes both sides' referenced columns to
its spill directory: ``check_spill_room`` refuses, before that copy, a join whose rows cannot fit there at
``SPILL_BYTES_PER_ROW`` each (measured at 10^9: 8.0 bytes per document with an int64 key, positions and a
one-byte score, 9.4 per sidecar row with an int64 key and a float32; the bound is half of that).

Worked example: 10^9 documents joined to 10^9 sidecar rows need ≥ 2·10^9 × 4 B = 7.5 GiB free under ``$TMPDIR``;
with 5 GiB free the plan stops in one line naming the directory, the estimate and what is free.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from zephon.errors import ConfigError
from zephon.recipe.work_source import WorkSource


class PreparedPlan(Protocol):
    """What the estimate reads of ``zephon.planner.prepare.PreparedPlan`` (named here, not imported: the sidecar
    join checks its spill room through this module, and ``prepare`` runs the join)."""

    @property
    def source(self) -> WorkSource: ...

    @property
    def shards(self) -> Sequence[Sequence[object]]: ...

    def dataset_rows(self, index: int) -> int: ...


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
    """A lower bound of the documents ``prepared`` will plan, for every budget: ``num_documents`` itself;
    ``epochs`` E (1 when no budget is given) at least E passes of the smallest dataset — its selected rows when it
    has a selection — since the plan ends no earlier than one dataset's E-th pass; ``num_tokens`` 0 (not known
    before the layout: such a plan is never refused here)."""
    source = prepared.source
    if source.num_documents is not None:
        return int(source.num_documents)
    if source.num_tokens is not None:
        return 0
    return (source.epochs or 1) * min(prepared.dataset_rows(i) for i in range(len(prepared.shards)))


def check_room(prepared: PreparedPlan, out_dir: Path) -> None:
    """Refuse, in one line with the estimate, a plan whose bundle cannot fit on ``out_dir``'s file system."""
    documents = planned_documents(prepared)
    need = documents * BYTES_PER_DOCUMENT
    free = shutil.disk_usage(_existing(out_dir)).free
    if need > free:
        raise ConfigError(
            f"the plan bundle must fit on the disk of {out_dir}, got about {need / 2**30:.1f} GiB needed for "
            f"{documents} documents (≥ {BYTES_PER_DOCUMENT} bytes each) and {free / 2**30:.1f} GiB free — lower "
            "num_documents or epochs, free space, or write the plan to another disk"
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
