"""MDS datasets as records: a local folder of ``index.json`` + ``shard.NNNNN.mds`` (Mosaic's ``MDSWriter``) whose
samples are images, bytes, strings and numbers — each MDS shard one shard of the plan, each sample one row.

Which folders: one holding an ``index.json`` of ``mds`` shards with no token column (``tokens``, ``input_ids``)
and at least one column that is not ``str``. A folder with a token column, or of ``str`` columns only, is a
token store (``zephon.recipe.token_store``, docs/token-stores.md), as before.

The layout (streaming's ``MDSWriter``; the token-store reader ``zephon.executor.token_stores.mds`` reads the
same), little-endian: a shard is ``N uint32 | N + 1 uint32 sample offsets | the index entry as JSON | samples``,
and a sample is one uint32 size per column of no fixed size, in column order, then every column's bytes.
``read_offsets`` reads the header; both readers use it.

Planning reads ``index.json`` and each shard's header (``4 × (N + 2)`` bytes), nothing else. Fingerprint of a
shard: ``mdsindex:`` + BLAKE2b of its size, its ``index.json`` entry (canonical JSON) and its header — a shard
rewritten with other samples, or other sample sizes, has another one; the executor recomputes it when it opens
the shard. Compressed shards (``zip_data`` without the raw shard) are refused: write with ``compression=None``.

Example: ``data/pairs/`` with ``index.json`` listing ``shard.00000.mds`` (3 samples, columns ``caption: str``,
``image: jpeg``, ``label: int``) → one shard ``ShardInfo(uri=".../shard.00000.mds", format="mds", rows=3, ...)``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

import numpy as np

from zephon.errors import DatasetError
from zephon.plan.records import ShardInfo

__all__ = ["MDS_FINGERPRINT", "is_record_mds", "mds_entry", "mds_files", "mds_fingerprint", "read_offsets", "scan_mds"]

MDS_FINGERPRINT = "mdsindex:"
TOKEN_COLUMNS = ("tokens", "input_ids")


def _index(folder: str) -> list[dict] | None:
    try:
        with open(os.path.join(folder, "index.json"), "rb") as f:
            shards = json.loads(f.read())["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(shards, list) or not shards or not all(isinstance(s, dict) for s in shards):
        return None
    return shards


def is_record_mds(folder: str) -> bool:
    """Whether ``folder`` is an MDS dataset of records (see the module docstring)."""
    shards = _index(folder)
    if shards is None or any(s.get("format") != "mds" for s in shards):
        return False
    names = {n for s in shards for n in s.get("column_names", ())}
    encodings = {e for s in shards for e in s.get("column_encodings", ())}
    return not names & set(TOKEN_COLUMNS) and bool(encodings - {"str"})


def read_offsets(read: Callable[[int, int], bytes], size: int, samples: int, name: str) -> np.ndarray:
    """The ``samples + 1`` sample offsets of an MDS shard of ``size`` bytes (its header), checked."""
    if size < 4 * (samples + 2):
        raise DatasetError(f"{name} must hold the header of its {samples} samples, got {size} bytes — copy it again")
    head = np.frombuffer(read(0, 4 * (samples + 2)), dtype="<u4").astype(np.int64)
    offsets = head[1:]
    if head[0] != samples or offsets[-1] != size or (np.diff(offsets) < 0).any():
        raise DatasetError(
            f"{name} must hold {samples} samples ending at its {size} bytes as index.json says, got "
            f"{int(head[0])} samples ending at {int(offsets[-1])} — the shard is damaged; copy it again"
        )
    return offsets


def mds_fingerprint(size: int, entry: dict, header: bytes) -> str:
    digest = hashlib.blake2b(f"{size}\0".encode(), digest_size=16)
    digest.update(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode())
    digest.update(header)
    return MDS_FINGERPRINT + digest.hexdigest()


def mds_entry(uri: str, where: str) -> dict:
    """The ``index.json`` entry of the MDS shard at ``uri`` (the index beside it)."""
    folder, name = os.path.split(uri)
    for entry in _index(folder) or ():
        if entry.get("raw_data", {}).get("basename") == name:
            return entry
    raise DatasetError(f"{where} must be listed in {os.path.join(folder, 'index.json')}, got no entry — re-plan")


def mds_files(dataset: str, folder: str) -> list[tuple[str, int]]:
    """``(path, size)`` of every shard ``index.json`` lists, in its order (shard files of format ``mds``)."""
    out = []
    for entry in _index(folder) or ():
        raw = entry.get("raw_data") or {}
        uri = os.path.abspath(os.path.join(folder, str(raw.get("basename"))))
        if not os.path.isfile(uri):
            fix = "write it with compression=None" if entry.get("zip_data") else "copy every shard index.json lists"
            raise DatasetError(
                f"dataset {dataset!r}: MDS shard {uri} must exist uncompressed, got no such file — {fix}"
            )
        out.append((uri, os.path.getsize(uri)))
    return out


def scan_mds(dataset: str, uri: str, size: int) -> ShardInfo:
    """Rows and fingerprint of the MDS shard at ``uri``, from its ``index.json`` entry and its header."""
    where = f"dataset {dataset!r}: MDS shard {uri}"
    entry = mds_entry(uri, where)
    if size != int(entry["raw_data"].get("bytes", -1)):
        raise DatasetError(
            f"{where} must be {entry['raw_data'].get('bytes')} bytes as index.json says, got {size} — copy it again"
        )
    samples = int(entry["samples"])
    fd = os.open(uri, os.O_RDONLY)
    try:
        read_offsets(lambda s, e: os.pread(fd, e - s, s), size, samples, where)
        header = os.pread(fd, 4 * (samples + 2), 0)
    finally:
        os.close(fd)
    fingerprint = mds_fingerprint(size, entry, header)
    return ShardInfo(uri=uri, format="mds", rows=samples, bytes=size, row_groups=1, fingerprint=fingerprint)
