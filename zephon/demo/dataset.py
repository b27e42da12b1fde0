"""The demo dataset on disk: Parquet shards of the generated documents, written once and found by glob.

* ``write_demo_dataset(root, seed=0)`` writes the shards under ``root/demo/`` (byte-identical for a given
  seed and pyarrow version), skipping files that are already present and complete.
* ``demo_dataset_paths()`` / ``demo_dataset_path()`` return glob patterns for the shards, writing them first
  when needed, under ``$ZEPHON_DEMO_DIR`` or ``~/.cache/zephon/demo-data``.

Each shard is written with :func:`zephon.storage.files.atomic_file` (a temporary in the same directory, then
one rename), so a shard file is either absent or whole; a full or read-only disk raises a
:class:`~zephon.errors.StorageError` naming the shard. The temporary is ``.<shard name>.<pid>-<hex>.tmp``:
hidden and not ending in ``.parquet``, so neither the shard globs (``prose-*.parquet``) nor a directory listing
of the dataset ever picks up a shard being written, or one a killed writer left behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.demo.generator import DEMO_KINDS, generate_demo_documents
from zephon.storage.files import atomic_file

__all__ = ["DEMO_SHARDS", "demo_dataset_path", "demo_dataset_paths", "write_demo_dataset"]

#: Layout of the demo dataset: kind -> (number of shards, documents per shard).
DEMO_SHARDS: dict[str, tuple[int, int]] = {"prose": (4, 300), "code": (2, 300), "short": (1, 2000)}


@dataclass(frozen=True, slots=True)
class _ShardFormat:
    """How a shard is written; ``version`` and the seed are stored in the schema metadata and checked on reuse."""

    version: str = "1"
    row_group_size: int = 100
    compression: str = "zstd"
    version_key: bytes = b"zephon.demo.version"
    seed_key: bytes = b"zephon.demo.seed"


_FORMAT = _ShardFormat()
_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("text", pa.string())])
_DIR_FIX = "or pass another root (or set ZEPHON_DEMO_DIR) to a writable directory with free space"


def _shard_name(kind: str, shard: int) -> str:
    return f"{kind}-{shard:05d}.parquet"


def _shard_complete(path: Path, rows: int, seed: int) -> bool:
    """Whether ``path`` is a whole shard of this format, ``seed`` and row count (else it is rewritten)."""
    try:
        meta = pq.read_metadata(path)
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException):
        return False
    kv = schema.metadata or {}
    return (
        meta.num_rows == rows
        and schema.names == _SCHEMA.names
        and kv.get(_FORMAT.version_key) == _FORMAT.version.encode()
        and kv.get(_FORMAT.seed_key) == str(seed).encode()
    )


def _temporary(path: Path) -> Path:
    """A hidden name beside ``path`` that no shard glob matches (the default temporary keeps ``.parquet``)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")


def _write_shard(table: pa.Table, path: Path) -> None:
    with atomic_file(path, f"the demo shard {path.name}", _DIR_FIX, temporary=_temporary(path)) as tmp:
        pq.write_table(table, tmp, row_group_size=_FORMAT.row_group_size, compression=_FORMAT.compression)


def write_demo_dataset(root: str | os.PathLike[str], *, seed: int = 0) -> str:
    """Write the demo Parquet shards under ``root/demo/`` unless they are already present and complete.

    Layout: ``prose-00000..00003.parquet`` (4 x 300 documents), ``code-00000..00001.parquet``
    (2 x 300) and ``short-00000.parquet`` (1 x 2000), each with string columns ``id``
    (``"<kind>-<shard>-<row>"``) and ``text``, zstd-compressed, 100 rows per row group. Every file is
    written under a hidden temporary name in the same directory and moved into place with one rename
    (:func:`zephon.storage.files.atomic_file`), so no shard file is ever partial and no glob of the shards
    matches a file being written. The output is
    byte-identical across calls with the same ``seed``. Returns ``str(root / "demo")``.
    """
    out = Path(os.path.expanduser(os.fspath(root))) / "demo"
    out.mkdir(parents=True, exist_ok=True)
    schema = _SCHEMA.with_metadata(
        {_FORMAT.version_key: _FORMAT.version.encode(), _FORMAT.seed_key: str(seed).encode()}
    )
    for kind in DEMO_KINDS:
        shards, per_shard = DEMO_SHARDS[kind]
        paths = [out / _shard_name(kind, s) for s in range(shards)]
        missing = [s for s, p in enumerate(paths) if not _shard_complete(p, per_shard, seed)]
        if not missing:
            continue
        docs = generate_demo_documents(kind, shards * per_shard, seed)
        for s in missing:
            ids = [f"{kind}-{s}-{r}" for r in range(per_shard)]
            texts = docs[s * per_shard : (s + 1) * per_shard]
            columns = [pa.array(ids, pa.string()), pa.array(texts, pa.string())]
            _write_shard(pa.Table.from_arrays(columns, schema=schema), paths[s])
    return str(out)


def _default_root() -> str:
    env = os.environ.get("ZEPHON_DEMO_DIR")
    return env or os.path.join(os.path.expanduser("~"), ".cache", "zephon", "demo-data")


def demo_dataset_paths(root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Glob patterns of the demo shards by kind, writing the dataset first when needed.

    ``root`` defaults to ``$ZEPHON_DEMO_DIR`` when set, else ``~/.cache/zephon/demo-data``.
    Returns ``{"prose": "<root>/demo/prose-*.parquet", "code": ..., "short": ...}``.
    """
    out = write_demo_dataset(_default_root() if root is None else root)
    return {kind: os.path.join(out, f"{kind}-*.parquet") for kind in DEMO_KINDS}


def demo_dataset_path(root: str | os.PathLike[str] | None = None) -> str:
    """Glob pattern of the prose shards, ``<root>/demo/prose-*.parquet``, writing the dataset first if needed.

    ``root`` defaults to ``$ZEPHON_DEMO_DIR`` when set, else ``~/.cache/zephon/demo-data``.
    """
    return demo_dataset_paths(root)["prose"]
