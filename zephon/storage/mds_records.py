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
the shard. A compressed shard (``zip_data``: ``shard.NNNNN.mds.zstd`` …, ``zephon.storage.mds_compression``) is
read whole and decompressed, at planning and when a run opens it; its fingerprint digests the compressed file's
size, the entry, the decompressed header and the compressed bytes (all read anyway). The raw shard wins when
both files are there (range reads). On object stores and the Hub: ``zephon.storage.objects.mds`` and
``zephon.storage.hub.mds`` (the fingerprint there is the file's pin, ``etag:``).

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
from zephon.storage.mds_compression import check_algorithm, decompress_shard, shard_file

__all__ = [
    "MDS_FINGERPRINT",
    "check_shard",
    "embedded_entry",
    "is_record_index",
    "is_record_mds",
    "mds_entry",
    "mds_files",
    "mds_fingerprint",
    "parse_index",
    "read_offsets",
    "scan_mds",
]

MDS_FINGERPRINT = "mdsindex:"
TOKEN_COLUMNS = ("tokens", "input_ids")


def parse_index(raw: bytes, name: str) -> list[dict]:
    """The shard entries of the ``index.json`` bytes ``raw`` (``name`` in errors), or one line saying why not."""
    try:
        shards = json.loads(raw)["shards"]
    except (ValueError, KeyError, TypeError) as exc:
        got = f"{type(exc).__name__}: {exc}" if not isinstance(exc, KeyError) else "no 'shards' key"
        raise DatasetError(
            f"{name} must be an MDS index (JSON with a list of shards), got {got} — write it again with MDSWriter"
        ) from None
    if not isinstance(shards, list) or not shards or not all(isinstance(s, dict) for s in shards):
        raise DatasetError(
            f"{name} must be an MDS index (JSON with a list of shards), got shards={str(shards)[:60]} — write it "
            "again with MDSWriter"
        )
    return shards


def _index(folder: str, who: str = "") -> list[dict]:
    """The shard entries of ``folder``'s ``index.json``; a missing, unreadable or malformed one is one line
    (``who``: what the error names first, e.g. ``"dataset 'pairs': "``)."""
    path = os.path.join(folder, "index.json")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise DatasetError(f"{who}{path} must be readable, got {exc.strerror or exc} — restore it") from None
    return parse_index(raw, f"{who}{path}")


def is_record_index(shards: list[dict]) -> bool:
    """Whether ``index.json``'s ``shards`` describe records (see the module docstring), not a token store."""
    if any(s.get("format") != "mds" for s in shards):
        return False
    names = {n for s in shards for n in s.get("column_names", ())}
    encodings = {e for s in shards for e in s.get("column_encodings", ())}
    return not names & set(TOKEN_COLUMNS) and bool(encodings - {"str"})


def is_record_mds(folder: str) -> bool:
    """Whether ``folder`` is an MDS dataset of records (see the module docstring). An ``index.json`` that does
    not parse counts as one: the records reader then says what is wrong with it, in one line (as a token store
    it would only be "a format its files do not tell")."""
    if not os.path.isfile(os.path.join(folder, "index.json")):
        return False
    try:
        return is_record_index(_index(folder))
    except DatasetError:
        return True


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
    """The ``index.json`` entry of the MDS shard at ``uri`` (the index beside it), raw or compressed."""
    folder, name = os.path.split(uri)
    for entry in _index(folder, f"{where}: "):
        if name in (entry.get("raw_data", {}).get("basename"), (entry.get("zip_data") or {}).get("basename")):
            return entry
    raise DatasetError(f"{where} must be listed in {os.path.join(folder, 'index.json')}, got no entry — re-plan")


def mds_files(dataset: str, folder: str) -> list[tuple[str, int]]:
    """``(path, size)`` of every shard ``index.json`` lists, in its order: the raw shard, else its compressed file
    (an algorithm Zephon cannot decode is refused here, at planning)."""
    out = []
    for entry in _index(folder, f"dataset {dataset!r}: "):
        raw = os.path.abspath(os.path.join(folder, str((entry.get("raw_data") or {}).get("basename"))))
        if os.path.isfile(raw):
            out.append((raw, os.path.getsize(raw)))
            continue
        name, _, compressed = shard_file(entry)
        uri = os.path.abspath(os.path.join(folder, name))
        if compressed is None or not os.path.isfile(uri):
            raise DatasetError(
                f"dataset {dataset!r}: MDS shard {uri} must exist as index.json lists, got no such file — copy every "
                "shard index.json lists"
            )
        check_algorithm(entry, f"dataset {dataset!r}: MDS shard {uri}")
        out.append((uri, os.path.getsize(uri)))
    return out


def check_shard(
    entry: dict, read: Callable[[int, int], bytes], size: int, where: str
) -> tuple[np.ndarray, bytes, Callable[[int, int], bytes]]:
    """``(offsets, digested, read_shard)`` of the shard of ``entry`` whose file (``size`` bytes) ``read`` reads:
    its size as ``index.json`` says, then its header (``read_offsets``). A raw shard is read by range
    (``read_shard`` is ``read``; ``digested`` is its header); a compressed one is read whole and decompressed
    (``read_shard`` slices the decompressed bytes, which the offsets index), and since every byte of it is read
    anyway, ``digested`` is the header followed by a digest of the compressed bytes: any change to the file
    changes its fingerprint."""
    _, want, compressed = shard_file(entry)
    if size != want:
        raise DatasetError(f"{where} must be {want} bytes as index.json says, got {size} — copy it again")
    samples = int(entry["samples"])
    whole = b""
    if compressed is not None:
        packed = read(0, size) if size else b""
        whole = hashlib.blake2b(packed, digest_size=16).digest()
        data = decompress_shard(packed, entry, where)
        read, size = (lambda s, e: data[s:e]), len(data)
    kept: list[bytes] = []

    def header(start: int, end: int) -> bytes:  # read_offsets' one read, kept for the fingerprint
        kept.append(read(start, end))
        return kept[-1]

    offsets = read_offsets(header, size, samples, where)
    return offsets, kept[-1] + whole, read


def embedded_entry(read: Callable[[int, int], bytes], offsets: np.ndarray, where: str) -> dict:
    """The columns an MDS shard states itself: the writer's JSON between the header and the first sample
    (``column_names``, ``column_encodings``, ``column_sizes``, ``compression``, ...), for a shard read without its
    ``index.json`` (a pinned remote object: its bytes are the planned ones)."""
    start = 4 * (len(offsets) + 1)
    try:
        entry = json.loads(read(start, int(offsets[0])))
        for key in ("column_names", "column_encodings", "column_sizes"):
            if not isinstance(entry[key], list):
                raise TypeError(key)
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(
            f"{where} must state its columns as JSON after its header, got {type(exc).__name__}: {exc} — the shard "
            "is damaged; copy it again"
        ) from None
    return entry


def scan_mds(dataset: str, uri: str, size: int) -> ShardInfo:
    """Rows and fingerprint of the local MDS shard at ``uri``, from its ``index.json`` entry and its header."""
    where = f"dataset {dataset!r}: MDS shard {uri}"
    entry = mds_entry(uri, where)
    fd = os.open(uri, os.O_RDONLY)
    try:
        _, header, _ = check_shard(entry, lambda s, e: os.pread(fd, e - s, s), size, where)
    finally:
        os.close(fd)
    fingerprint = mds_fingerprint(size, entry, header)
    return ShardInfo(
        uri=uri, format="mds", rows=int(entry["samples"]), bytes=size, row_groups=1, fingerprint=fingerprint
    )
