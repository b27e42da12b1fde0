"""Finding the shards of a local dataset path: a directory, a glob or a single file.

Formats are detected from file names: ``.parquet``/``.pq`` → parquet; ``.jsonl``/``.ndjson`` → jsonl;
``.jsonl.gz``/``.ndjson.gz`` → jsonl.gz; ``.jsonl.zst``/``.jsonl.zstd`` → jsonl.zst. A directory is listed
recursively (hidden files and names starting with ``_`` or ``.`` are skipped, as Spark and Hive writers
use them for markers); shards are sorted by path, so the shard order never depends on the file system.
Parquet and JSONL cannot be mixed in one dataset; JSONL files may mix compressions. In a directory, files
of other formats (README.md, checksums) are ignored when shards are present; a file named directly or
matched by a glob must be a shard.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from zephon.errors import DatasetError

_SUFFIXES: tuple[tuple[str, str], ...] = (
    (".jsonl.gz", "jsonl.gz"),
    (".ndjson.gz", "jsonl.gz"),
    (".jsonl.zst", "jsonl.zst"),
    (".jsonl.zstd", "jsonl.zst"),
    (".parquet", "parquet"),
    (".pq", "parquet"),
    (".jsonl", "jsonl"),
    (".ndjson", "jsonl"),
)
SUPPORTED_SUFFIXES = tuple(s for s, _ in _SUFFIXES)


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFile:
    """One shard file as found on disk (or, for hf://, as listed by the Hub)."""

    uri: str
    format: str
    size: int
    #: Remote shards only: the ``zephon.storage.hub.client.RemoteFile`` it stands for.
    remote: object | None = None


def detect_format(name: str) -> str | None:
    """Return the shard format implied by a file name, or None when it is not a supported format."""
    lower = name.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    return None


def family(fmt: str) -> str:
    return "parquet" if fmt == "parquet" else "jsonl"


def discover_local_files(dataset: str, path: str) -> tuple[SourceFile, ...]:
    """List the shards of a local dataset path, with clear errors for empty, unknown or mixed inputs.

    Symbolic links to files are followed (a Hugging Face cache snapshot is a directory of links into its blob
    store); listing a directory does not descend into links to directories, so a link loop cannot hang it (a
    glob follows Python's ``glob`` rules). Zephon only reads through links; nothing is written under a dataset
    path.
    """
    if "\0" in path:
        raise DatasetError(
            f"dataset {dataset!r}: path {path!r} must not contain a NUL character, got one — fix the path"
        )
    try:
        return _discover(dataset, path)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else path
        raise DatasetError(
            f"dataset {dataset!r}: path {path!r} must be readable, got {exc.strerror or exc} for {where!s} — fix the "
            "path or its permissions"
        ) from exc


def _discover(dataset: str, path: str) -> tuple[SourceFile, ...]:
    expanded = os.path.expanduser(path)
    if any(ch in expanded for ch in "*?["):
        candidates = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
        if not candidates:
            raise DatasetError(
                f"dataset {dataset!r}: glob {path!r} must match at least one file, got none — check the pattern"
            )
    elif os.path.isdir(expanded):
        candidates = sorted(
            str(p)
            for p in Path(expanded).rglob("*")
            if p.is_file() and not any(part.startswith((".", "_")) for part in p.relative_to(expanded).parts)
        )
        if not candidates:
            raise DatasetError(
                f"dataset {dataset!r}: directory {path!r} must contain shard files, got an empty directory — "
                f"put {', '.join(SUPPORTED_SUFFIXES)} files there or fix the path"
            )
    elif os.path.isfile(expanded):
        candidates = [expanded]
    else:
        raise DatasetError(f"dataset {dataset!r}: path {path!r} must exist, got nothing there — fix the path")

    found: list[SourceFile] = []
    unknown: list[str] = []
    for candidate in candidates:
        fmt = detect_format(candidate)
        if fmt is None:
            unknown.append(candidate)
            continue
        found.append(SourceFile(uri=os.path.abspath(candidate), format=fmt, size=os.path.getsize(candidate)))
    # In a directory, side files (README.md, dataset_info.json, checksums) are common beside shards and
    # are ignored; a file named explicitly or matched by a glob must be a shard.
    if unknown and (not found or not os.path.isdir(expanded)):
        raise DatasetError(
            f"dataset {dataset!r}: files must be Parquet or JSONL ({', '.join(SUPPORTED_SUFFIXES)}), "
            f"got unknown format for {unknown[0]!r}"
            + (f" and {len(unknown) - 1} more" if len(unknown) > 1 else "")
            + " — convert them or point the path at the data files"
        )
    families = sorted({family(f.format) for f in found})
    if len(families) > 1:
        first = {fam: next(f.uri for f in found if family(f.format) == fam) for fam in families}
        raise DatasetError(
            f"dataset {dataset!r}: shards must share one format, got mixed {' and '.join(families)} "
            f"(e.g. {first['parquet']!r} and {first['jsonl']!r}) — split them into two datasets"
        )
    return tuple(found)
