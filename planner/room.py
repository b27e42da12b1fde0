"""Whether a plan bundle can fit before it is written: its size estimated from the documents it will plan.

samples.parquet holds one row per planned document (position, dataset, shard, row, epoch, and per plan kind
tokens, offset, deal), zstd-compressed; ``BYTES_PER_DOCUMENT`` is a lower bound of its size a document, so a
plan that fits is never refused and a budget of 10^12 documents (at least 3.6 TiB) is refused in one line
before any layout, instead of filling the disk from a hidden temporary for days.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.planner.prepare import PreparedPlan

#: A lower bound of samples.parquet's bytes a planned document (its columns compress to more).
BYTES_PER_DOCUMENT = 4


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor: the file system the bundle will be written to."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_room(prepared: PreparedPlan, out_dir: Path) -> None:
    """Refuse, in one line with the estimate, a plan whose bundle cannot fit on ``out_dir``'s file system."""
    documents = prepared.source.num_documents
    if documents is None:
        documents = sum(ref.rows for group in prepared.shards for ref in group)  # no budget: about one pass
    need = documents * BYTES_PER_DOCUMENT
    free = shutil.disk_usage(_existing(out_dir)).free
    if need > free:
        raise ConfigError(
            f"the plan bundle must fit on the disk of {out_dir}, got about {need / 2**30:.1f} GiB needed for "
            f"{documents} documents (≥ {BYTES_PER_DOCUMENT} bytes each) and {free / 2**30:.1f} GiB free — lower "
            "num_documents, free space, or write the plan to another disk"
        )
