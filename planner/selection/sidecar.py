"""A selection's sidecar when it is remote: read whole through zephon's storage layer, pinned, fingerprinted.

Sidecars on ``s3://``/``gs://``/``az://`` (an object, a prefix or a glob) or ``hf://`` (a dataset path) are
read whole, pinned, and fingerprinted by content exactly like a local sidecar (SHA-256 over each file's name
and bytes, ``sidecar_digest``): a sidecar copied to a bucket gives the same fingerprint, and a changed value a
different one.

Example: ``metadata="s3://b/meta/"`` holding ``a.parquet`` and ``b.parquet`` → both read whole, in name order,
concatenated into one table; fingerprint ``sha256:`` of ("a.parquet", sha256(a)), ("b.parquet", sha256(b)).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import DatasetError, one_line
from zephon.recipe.selection import Selection

__all__ = ["RemoteSidecar", "is_remote_sidecar", "read_sidecar", "sidecar_digest"]


def is_remote_sidecar(text: str) -> bool:
    return text.startswith(("hf://", "s3://", "gs://", "gcs://", "az://", "abfs://"))


@dataclass(frozen=True, kw_only=True, slots=True)
class RemoteSidecar:
    """A remote sidecar read whole: its table, content fingerprint and file names."""

    table: pa.Table
    fingerprint: str
    files: tuple[str, ...]


def read_sidecar(selection: Selection) -> RemoteSidecar:
    """The remote sidecar of ``selection``: every Parquet file of the path, read whole and pinned, in name order."""
    assert selection.metadata is not None
    name, text = selection.dataset, selection.metadata
    files: list[tuple[str, Callable[[], bytes]]] = []
    if text.startswith("hf://"):
        from zephon.storage.hub.client import read_remote_range, resolve_hf_dataset

        resolved = resolve_hf_dataset(text)
        for hub in sorted(resolved.files, key=lambda f: f.path_in_repo):
            _check_parquet(name, text, hub.path_in_repo, hub.format)
            files.append((hub.path_in_repo, lambda f=hub: read_remote_range(f, 0, f.size)))
    else:
        from zephon.storage.objects.listing import discover_objects
        from zephon.storage.objects.reads import ObjectFile, read_whole

        for found in discover_objects(name, text):
            assert isinstance(found.remote, ObjectFile)
            _check_parquet(name, text, found.uri, found.format)
            files.append((found.uri, lambda f=found.remote: read_whole(f)))
    digests, tables = [], []
    for path, read in files:
        data = read()
        digests.append((path, hashlib.sha256(data).digest()))
        try:
            tables.append(pq.read_table(pa.BufferReader(data)))
        except (OSError, ValueError) as exc:
            raise DatasetError(
                f"dataset {name!r}: sidecar file {path} must be readable Parquet, got {one_line(exc)} — re-export it"
            ) from exc
    return RemoteSidecar(
        table=pa.concat_tables(tables, promote_options="default"),
        fingerprint=sidecar_digest(digests),
        files=tuple(p for p, _ in files),
    )


def _check_parquet(name: str, text: str, path: str, fmt: str) -> None:
    if fmt != "parquet":
        raise DatasetError(
            f"dataset {name!r}: sidecar {text!r} must hold Parquet files only, got {path} ({fmt or 'unknown'}) — "
            "convert it to Parquet or narrow the path"
        )


def sidecar_digest(items: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over each file's base name and content digest (the local sidecar's fingerprint, too)."""
    digest = hashlib.sha256()
    for path, content_digest in items:
        digest.update(path.rpartition("/")[2].encode() + b"\0")
        digest.update(content_digest)
    return "sha256:" + digest.hexdigest()
