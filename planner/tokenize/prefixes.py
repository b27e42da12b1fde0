"""Where each shard's store goes, and what a rerun does with what it finds there (``zephon tokenize`` resumes).

Naming: a dataset's shards become prefixes under ``OUT_DIR/<dataset>/``, each the shard's path below the folder
all the dataset's shards share, its format suffix dropped: ``data/web/part-00000.parquet`` →
``OUT_DIR/web/part-00000`` (``.bin`` + ``.idx`` + ``.zephon.json``); ``data/web/a/x.jsonl.zst`` and
``data/web/b/x.jsonl.zst`` → ``OUT_DIR/web/a/x`` and ``OUT_DIR/web/b/x``. Two shards that would share a prefix
(``x.jsonl`` beside ``x.jsonl.gz``) are refused in one line.

What a rerun finds at a prefix (:func:`resume_state`), by its record ``PREFIX.zephon.json``
(``zephon.planner.tokenize.records``):

=====================================  =====================================================================
nothing                                written
a complete record of this very input   *kept*, after checking the files against it: the ``.idx`` parses and
(shard content, rows, field, tokenizer matches the ``.bin``'s size (``zephon.executor.token_stores.megatron``), its
fingerprint, dtype)                    SHA-256 and the ``.bin``'s size are the record's, one document a row
                                       (the ``.bin`` is not hashed again: it was renamed whole into place)
a complete record whose files fail     written again (they are ours: the record says so)
those checks
an incomplete record (a kill between   its files removed, written again
the renames)
a complete record of other input       refused, unless ``overwrite``: then removed and written again
(the shard or the tokenizer changed)
``.bin`` or ``.idx`` without a record  refused, always: ``zephon tokenize`` did not write them
=====================================  =====================================================================

Worked example: a run over 3 shards is killed while writing the second → ``part-00000`` is complete,
``.part-00001.bin.zephon-tmp-4242-9f3e01c7`` is a temporary (swept, ``sweep_temporaries``), ``part-00002`` does
not exist. The rerun keeps ``part-00000`` and writes ``part-00001`` and ``part-00002``: the same bytes as one
uninterrupted run.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zephon.errors import DatasetError, StorageError
from zephon.executor.token_stores.files import LocalBlob
from zephon.executor.token_stores.megatron import MegatronPart
from zephon.plan.records import ShardRef
from zephon.planner.tokenize.records import RECORD_SUFFIX, StoreRecord, read_record
from zephon.storage.local import SUPPORTED_SUFFIXES

__all__ = ["Expected", "prefix_files", "prefix_names", "resume_state"]


def prefix_names(uris: Sequence[str], dataset: str) -> list[str]:
    """Each shard's prefix below ``OUT_DIR/<dataset>/`` (see the module docstring), in the given order."""
    parts = [uri.split("/") for uri in uris]
    common = posixpath.commonprefix([p[:-1] for p in parts])
    names = []
    for p in parts:
        rel = "/".join(p[len(common) :])
        lower = rel.lower()
        suffix = next((s for s in SUPPORTED_SUFFIXES if lower.endswith(s)), "")
        names.append(rel[: len(rel) - len(suffix)] if suffix else rel)
    seen: dict[str, str] = {}
    for uri, name in zip(uris, names, strict=True):
        if name in seen:
            raise DatasetError(
                f"dataset {dataset!r}: shards {seen[name]} and {uri} must have distinct names without their format "
                f"suffix to get a store each, got both {name!r} — rename one, or tokenize them as two datasets"
            )
        seen[name] = uri
    return names


def prefix_files(prefix: Path) -> tuple[Path, Path, Path]:
    """``PREFIX.bin``, ``PREFIX.idx`` and ``PREFIX.zephon.json`` (a prefix may hold dots: never ``with_suffix``)."""
    return tuple(prefix.with_name(prefix.name + s) for s in (".bin", ".idx", RECORD_SUFFIX))  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True, slots=True)
class Expected:
    """What a finished store of this run's input must say: the shard, the text field, the encoder, the dtype."""

    ref: ShardRef
    field: str
    tokenizer_fingerprint: str
    dtype: str

    def mismatch(self, record: StoreRecord) -> str | None:
        """How ``record`` differs from this input, or None when it is a store of it."""
        checks = (
            ("shard content", record.shard_fingerprint, self.ref.fingerprint),
            ("rows", record.rows, self.ref.rows),
            ("text field", record.field, self.field),
            ("tokenizer fingerprint", record.tokenizer_fingerprint, self.tokenizer_fingerprint),
            ("dtype", record.dtype, self.dtype),
        )
        for what, got, want in checks:
            if got != want:
                return f"its {what} {str(got)[:16]!r} is not this run's {str(want)[:16]!r}"
        return None


def _files_agree(prefix: Path, record: StoreRecord) -> bool:
    """Whether the ``.bin``/``.idx`` at ``prefix`` are the ones ``record`` describes (see the module docstring)."""
    bin_, idx, _ = prefix_files(prefix)
    if not (bin_.is_file() and idx.is_file()) or bin_.stat().st_size != record.bin_bytes:
        return False
    data = idx.read_bytes()
    if hashlib.sha256(data).hexdigest() != record.idx_sha256:
        return False
    try:
        part = MegatronPart(LocalBlob(idx, len(data)), LocalBlob(bin_, record.bin_bytes), str(prefix))
    except DatasetError:
        return False
    return part.dtype == np.dtype(record.dtype) and len(part.doc_starts) - 1 == record.rows


def _remove(prefix: Path) -> None:
    bin_, idx, record = prefix_files(prefix)
    for path in (bin_, idx, record):  # the record last: until it goes, a kill here leaves files it claims
        path.unlink(missing_ok=True)


def resume_state(prefix: Path, expected: Expected, *, overwrite: bool) -> StoreRecord | None:
    """The record of a finished store of ``expected``'s input at ``prefix`` (kept), else None once nothing of
    ours is left there (to write); refuses files ``zephon tokenize`` did not write (see the module docstring)."""
    bin_, idx, record_path = prefix_files(prefix)
    record = read_record(record_path) if record_path.exists() else None
    if record is None:
        present = [p for p in (bin_, idx, record_path) if p.exists() or p.is_symlink()]
        if present:
            raise StorageError(
                f"{present[0]} must not be there for zephon tokenize to write {prefix}, got a file it did not "
                f"write (no zephon record {record_path.name} of its own beside it) — move it away, or choose "
                "another -o"
            )
        return None
    if not record.complete:
        _remove(prefix)
        return None
    differs = expected.mismatch(record)
    if differs is not None:
        if not overwrite:
            raise StorageError(
                f"{prefix} must be a store of this run's input to be kept, got one zephon tokenize wrote from other "
                f"input: {differs} — pass --overwrite (overwrite=True) to write it again, or choose another -o"
            )
        _remove(prefix)
        return None
    if not _files_agree(prefix, record):
        _remove(prefix)
        return None
    return record
