"""The plan bundle: the one place that defines its files, columns, Arrow types and format version.

A plan bundle is a directory that the planner writes and the executor reads; nothing else joins them.

```
PLAN_DIR/
  plan.json        manifest: format version, normalized config and its hash, datasets, mixture, totals
  shards.parquet   one row per shard (SHARDS_SCHEMA)
  samples.parquet  one row per scheduled document in global order (SAMPLES_SCHEMA); a plan of more than
  samples/         SAMPLES_PART_ROWS documents has parts instead: samples/part-00000.parquet, ... (samples_part)
  bins.parquet     best-fit exact plans only: the planned rows (BINS_SCHEMA)
  selected.parquet plans written with materialize_selections only: one row per copied shard (COPIES_SCHEMA)
  selected/        those copies, COPY_NAME each (zephon.planner.copies)
```

Version rule: ``FORMAT_VERSION`` is a single integer. A change that a reader of the previous version would
misread (a column renamed, retyped or given a new meaning) bumps it; adding an optional ``plan.json`` key
does not. Readers refuse any version they do not know, with a message naming both versions.

This module imports only pyarrow and the standard library, so the executor can use it on training nodes.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from zephon.errors import PlanFormatError

FORMAT_VERSION = 2
#: Format 1 held a fixed ``lane`` (int16: the deal modulo the plan's ``lanes``, 8 by default) where format 2 holds
#: the ``deal``; everything else is the same. Readers read format 1 too (``deal_column``).
#: The versions a reader reads.
READABLE_VERSIONS = (1, FORMAT_VERSION)
PLAN_JSON = "plan.json"
SHARDS_FILE = "shards.parquet"
SAMPLES_FILE = "samples.parquet"
#: The directory of a big plan's samples parts (``samples_part``).
SAMPLES_DIR = "samples"
BINS_FILE = "bins.parquet"
COPIES_FILE = "selected.parquet"
COPIES_DIR = "selected"
#: Every file a bundle may hold (besides SAMPLES_DIR's parts and COPIES_DIR's copies): a directory with anything else
#: in it is not (only) a plan bundle.
BUNDLE_FILES = frozenset({PLAN_JSON, SHARDS_FILE, SAMPLES_FILE, BINS_FILE, COPIES_FILE})

#: What marks a directory (or an object-store prefix) as a plan bundle when a dataset folder is listed: its
#: plan.json beside the two files every bundle has. Shard discovery skips such a directory, and names it
#: (``zephon.storage.local``): a plan written inside a dataset's folder never becomes that dataset's data.
BUNDLE_MARKER = frozenset({PLAN_JSON, SHARDS_FILE, SAMPLES_FILE})


def looks_like_bundle(names: set[str] | frozenset[str]) -> bool:
    """Whether a directory whose entries are ``names`` has a plan bundle's files (``BUNDLE_MARKER``; a big plan's
    SAMPLES_DIR of parts in place of SAMPLES_FILE)."""
    return names >= BUNDLE_MARKER or names >= (BUNDLE_MARKER - {SAMPLES_FILE}) | {SAMPLES_DIR}


#: Documents per Parquet row group of samples.parquet: seeking to any position decodes one row group.
SAMPLES_ROW_GROUP = 65_536

#: Documents per part of a big plan's samples (2,048 row groups): a plan of at most this many documents is one
#: samples.parquet; a bigger one is ``samples_part(k)`` for k = 0, 1, ..., each of exactly this many documents
#: but the last (positions ``[k * SAMPLES_PART_ROWS, (k + 1) * SAMPLES_PART_ROWS)``), so a reader finds the part of
#: a position by a division and opens one footer of ~2,048 row groups, not one of 152,588 (10^10 documents).
SAMPLES_PART_ROWS = 1 << 27


def samples_part(k: int) -> str:
    """The bundle-relative name of part ``k`` of a big plan's samples: ``samples/part-00003.parquet``."""
    return f"{SAMPLES_DIR}/part-{k:05d}.parquet"


def is_samples_part(name: str) -> bool:
    """Whether ``name`` (an entry of SAMPLES_DIR) is a name ``samples_part`` gives."""
    return (
        len(name) == 18
        and name.startswith("part-")
        and name.endswith(".parquet")
        and name[5:10].isdigit()
        and name.isascii()
    )


#: shards.parquet ``format`` of a token store's part is this prefix and the store's format (``tokens:megatron``,
#: ``tokens:parquet``: ``zephon.planner.counts.stores``); raw text shards are ``parquet``, ``jsonl``, ``jsonl.gz``,
#: ``jsonl.zst``. Its ``rows`` are the part's documents and its ``fingerprint`` is ``index:`` + its index's digest.
STORE_SHARD_PREFIX = "tokens:"

SHARDS_SCHEMA = pa.schema(
    [
        pa.field("shard_id", pa.int32(), nullable=False),
        pa.field("dataset_id", pa.int16(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("uri", pa.string(), nullable=False),
        pa.field("format", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("row_groups", pa.int32(), nullable=False),
        pa.field("fingerprint", pa.string(), nullable=False),
    ]
)

SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("position", pa.int64(), nullable=False),
        pa.field("dataset_id", pa.int16(), nullable=False),
        pa.field("shard_id", pa.int32(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
        pa.field("epoch", pa.int32(), nullable=False),
        # Tokens of the document (EOS and BOS included) when the plan knows them; null otherwise.
        pa.field("tokens", pa.int32(), nullable=True),
        # Offset of the document's first token in the global token stream, for exact plans only.
        pa.field("token_offset", pa.int64(), nullable=True),
        # Estimated plans only: the deal (chunk of the plan's unit stream) the document belongs to; its packing
        # lane is ``deal mod L`` for the run's L lanes (see zephon.planner.lane_dealing).
        pa.field("deal", pa.int64(), nullable=True),
    ]
)

#: Format 1's samples.parquet: ``lane`` (int16) where format 2 has ``deal``.
SAMPLES_SCHEMA_V1 = pa.schema(
    [f if f.name != "deal" else pa.field("lane", pa.int16(), nullable=True) for f in SAMPLES_SCHEMA]
)


def samples_schema(format_version: int) -> pa.Schema:
    """The samples.parquet schema of a bundle of ``format_version`` (one of ``READABLE_VERSIONS``)."""
    return SAMPLES_SCHEMA_V1 if format_version == 1 else SAMPLES_SCHEMA


def deal_column(format_version: int) -> str:
    """The column whose value modulo the run's lanes is a document's packing lane: format 2's ``deal``; format
    1's ``lane``, already the deal modulo the plan's fixed lanes (which a format-1 run packs: ``lane mod L`` is
    ``lane``), so a format-1 bundle packs exactly as the format-1 executor packed it."""
    return "lane" if format_version == 1 else "deal"


# Best-fit exact plans only: row ``sequence`` holds ``length`` tokens of the document at ``position``, from its
# token ``doc_start``, placed at ``offset``; sorted by (sequence, offset).
BINS_SCHEMA = pa.schema(
    [
        pa.field("sequence", pa.int64(), nullable=False),
        pa.field("offset", pa.int32(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("doc_start", pa.int32(), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
    ]
)
BINS_ROW_GROUP = 65_536

SHARD_FORMATS = ("parquet", "jsonl", "jsonl.gz", "jsonl.zst", "tar", "tar.gz", "mds")

# Plans written with ``materialize_selections`` only: a compact copy of the rows the plan reads from shard
# ``shard_id`` (of a dataset with a selection) is ``selected/<file>``: the source's columns and, last, the source row
# of each copied row (COPY_ROW_COLUMN), in row order. ``rows``, ``bytes``, ``row_groups`` and ``fingerprint`` are the
# copy's, checked when the executor opens it, as it checks a local shard (zephon.planner.copies).
COPIES_SCHEMA = pa.schema(
    [
        pa.field("shard_id", pa.int32(), nullable=False),
        pa.field("file", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("row_groups", pa.int32(), nullable=False),
        pa.field("fingerprint", pa.string(), nullable=False),
    ]
)
#: The source row of each row of a copy (int64); a source shard with a column of that name is not copied.
COPY_ROW_COLUMN = "__zephon_source_row"


def copy_name(shard_id: int) -> str:
    """The file name of shard ``shard_id``'s copy under ``COPIES_DIR``."""
    return f"{shard_id:010d}.parquet"


def is_copy_name(name: str) -> bool:
    """Whether ``name`` is one ``copy_name`` gives (what a plan writer may have written under ``COPIES_DIR``)."""
    return len(name) == 18 and name.endswith(".parquet") and name[:10].isdigit() and name[:10].isascii()


def _same_type(got: pa.DataType | None, want: pa.DataType) -> bool:
    # Polars writes strings as large_string; both read the same.
    if pa.types.is_string(want):
        return got is not None and (pa.types.is_string(got) or pa.types.is_large_string(got))
    return got == want


def check_schema(table_schema: pa.Schema, expected: pa.Schema, file: Path) -> None:
    """Refuse a Parquet file whose columns or types differ from the format's schema."""
    got = {f.name: f.type for f in table_schema}
    for field in expected:
        if field.name not in got:
            shown = ", ".join(list(got)[:8]) + (", ..." if len(got) > 8 else "")
            raise PlanFormatError(
                f"{file} must have the column {field.name!r} ({field.type}), got a file with columns [{shown}] — "
                "it is not a file of this plan format; restore the bundle's own file or re-plan"
            )
        if not _same_type(got[field.name], field.type):
            raise PlanFormatError(
                f"{file} column {field.name!r} must be {field.type}, got {got[field.name]} — "
                "the bundle was not written by this plan format; re-plan"
            )
