"""The demo dataset on disk: Parquet shards of the shipped corpus, written once and found by glob.

* ``write_demo_dataset(root)`` writes the shards under ``root/demo/`` from the shipped texts
  (:mod:`zephon.demo.corpus`; byte-identical for a pyarrow version), skipping files already present and complete.
* ``demo_dataset_paths()`` / ``demo_dataset_path()``: the shards' glob patterns, writing them first when needed,
  under ``$ZEPHON_DEMO_DIR`` or ``~/.cache/zephon/demo-data``.

Each shard is written with :func:`zephon.storage.files.atomic_file` (a temporary in the same directory, then
one rename), so a shard file is either absent or whole; a full or read-only disk raises a
:class:`~zephon.errors.StorageError` naming the shard. The temporary is ``.<shard name>.<pid>-<hex>.tmp``:
hidden and not ending in ``.parquet``, so neither the shard globs (``prose-*.parquet``) nor a directory listing
of the dataset ever picks up a shard being written, or one a killed writer left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.demo.corpus import DEMO_KINDS, DEMO_SHARDS, generate_demo_documents, shard_ids
from zephon.storage.files import atomic_file

__all__ = ["demo_dataset_path", "demo_dataset_paths", "write_demo_dataset", "write_shards"]

# The shards' schema metadata (format version, seed: checked on reuse) and layout.
_VERSION_KEY, _VERSION, _SEED_KEY = b"zephon.demo.version", b"1", b"zephon.demo.seed"
_ROW_GROUP_SIZE, _COMPRESSION = 100, "zstd"
_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("text", pa.string())])
_DIR_FIX = "or pass another root (or set ZEPHON_DEMO_DIR) to a writable directory with free space"


def _shard_complete(path: Path, rows: int, seed: int) -> bool:
    """Whether ``path`` is a whole shard of this format, ``seed`` and row count (else it is rewritten)."""
    try:
        meta, schema = pq.read_metadata(path), pq.read_schema(path)
    except (OSError, pa.ArrowException):
        return False
    kv = schema.metadata or {}
    return (
        meta.num_rows == rows
        and schema.names == _SCHEMA.names
        and kv.get(_VERSION_KEY) == _VERSION
        and kv.get(_SEED_KEY) == str(seed).encode()
    )


def _write_shard(table: pa.Table, path: Path) -> None:
    # The temporary is hidden and ends in .tmp, so no shard glob matches it (atomic_file's default keeps .parquet).
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    with atomic_file(path, f"the demo shard {path.name}", _DIR_FIX, temporary=temporary) as tmp:
        pq.write_table(table, tmp, row_group_size=_ROW_GROUP_SIZE, compression=_COMPRESSION)


def write_shards(root: str | os.PathLike[str], *, seed: int, documents: Callable[[str, int], Sequence[str]]) -> str:
    """Write the shards of ``documents(kind, count)`` (texts, in order) under ``root/demo/``, tagged with ``seed``.

    The one writer of demo shards: :func:`write_demo_dataset` passes the shipped texts, the checkout's grammar
    (``scripts/demo_grammar``) those of any seed. Missing or incomplete shards only; returns ``str(root / "demo")``.
    """
    out = Path(os.path.expanduser(os.fspath(root))) / "demo"
    out.mkdir(parents=True, exist_ok=True)
    schema = _SCHEMA.with_metadata({_VERSION_KEY: _VERSION, _SEED_KEY: str(seed).encode()})
    for kind in DEMO_KINDS:
        shards, per_shard = DEMO_SHARDS[kind]
        paths = [out / f"{kind}-{s:05d}.parquet" for s in range(shards)]
        missing = [s for s, p in enumerate(paths) if not _shard_complete(p, per_shard, seed)]
        texts = documents(kind, shards * per_shard) if missing else []
        for s in missing:
            rows = texts[s * per_shard : (s + 1) * per_shard]
            columns = [pa.array(shard_ids(kind, s), pa.string()), pa.array(rows, pa.string())]
            _write_shard(pa.Table.from_arrays(columns, schema=schema), paths[s])
    return str(out)


def write_demo_dataset(root: str | os.PathLike[str], *, seed: int = 0) -> str:
    """Write the demo Parquet shards under ``root/demo/`` unless they are already present and complete.

    Layout: ``prose-00000..00003.parquet`` (4 x 300 documents), ``code-00000..00001.parquet`` (2 x 300) and
    ``short-00000.parquet`` (1 x 2000), string columns ``id`` (``"<kind>-<shard>-<row>"``) and ``text``, zstd,
    100 rows per row group; byte-identical across calls. Only ``seed=0`` ships (any seed: ``scripts/demo_grammar``
    in a checkout). Returns ``str(root / "demo")``.
    """
    return write_shards(root, seed=seed, documents=lambda kind, count: generate_demo_documents(kind, count, seed))


def _default_root() -> str:
    env = os.environ.get("ZEPHON_DEMO_DIR")
    return env or os.path.join(os.path.expanduser("~"), ".cache", "zephon", "demo-data")


def demo_dataset_paths(root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Glob patterns of the demo shards by kind, ``{"prose": "<root>/demo/prose-*.parquet", "code": ...}``, writing
    the dataset first when needed; ``root`` defaults to ``$ZEPHON_DEMO_DIR``, else ``~/.cache/zephon/demo-data``."""
    out = write_demo_dataset(_default_root() if root is None else root)
    return {kind: os.path.join(out, f"{kind}-*.parquet") for kind in DEMO_KINDS}


def demo_dataset_path(root: str | os.PathLike[str] | None = None) -> str:
    """Glob pattern of the prose shards, ``<root>/demo/prose-*.parquet`` (see :func:`demo_dataset_paths`)."""
    return demo_dataset_paths(root)["prose"]
