"""MDS datasets of records on the Hub (``hf://org/name/split`` whose split holds ``index.json`` beside ``*.mds``
shards, as Mosaic's ``MDSWriter`` wrote them): ``index.json`` and each shard's header by range requests.

``mds_split`` turns a split's listing into its MDS shards: when the split's data files are one ``index.json`` and
its folder holds ``.mds`` (or compressed ``.mds.zstd`` …) files, ``index.json`` is read (one request) and each
entry it lists becomes a ``RemoteFile`` of format ``mds`` carrying its entry — the raw shard, else its compressed
file. ``scan_hub_mds`` reads a shard's header (one range request of ``4 × (samples + 2)`` bytes; a compressed
shard is downloaded whole, in memory) and checks it against the entry as a local scan does. The fingerprint is
the file's ``etag:`` as for every Hub file; at run time the shard goes through the shard cache (downloaded whole
and verified, as every ``hf://`` shard is) and is opened from the copy's own header and column JSON.

Example: ``org/pairs`` with ``train/index.json``, ``train/shard.00000.mds`` (5 samples) and
``train/shard.00001.mds`` (2): ``hf://org/pairs/train`` plans with 3 file requests — ``index.json``, then 28 and
16 bytes of the two headers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace

from zephon.errors import DatasetError
from zephon.plan.records import ShardInfo
from zephon.storage.mds_compression import check_algorithm, compression_of, shard_file
from zephon.storage.mds_records import check_shard, is_record_index, parse_index

__all__ = ["mds_split", "scan_hub_mds"]


def _folder(path: str) -> str:
    return path.rpartition("/")[0]


def is_mds_split(paths: list[str], entries: Mapping[str, object]) -> bool:
    """A split whose data files are one ``index.json`` with MDS shards beside it."""
    if len(paths) != 1 or paths[0].rpartition("/")[2] != "index.json":
        return False
    folder = _folder(paths[0])
    return any(
        _folder(p) == folder and (p.endswith(".mds") or compression_of(p.rpartition("/")[2]) is not None)
        for p in entries
    )


def mds_split(index: object, entries: Mapping[str, object], read: Callable[[object], bytes]) -> list[object]:
    """The ``RemoteFile`` of every shard the split's ``index.json`` (the ``RemoteFile`` ``index``, read by
    ``read``) lists, in its order, each with its entry (``entry``: JSON)."""
    name = f"hf://datasets/{index.repo_id}@{index.revision}/{index.path_in_repo}"  # type: ignore[attr-defined]
    shards = parse_index(read(index), name)
    if not is_record_index(shards):
        raise DatasetError(
            f"{name} must describe MDS records (a column that is not str, no tokens/input_ids column), got a token "
            'store\'s columns — read it as a token store: Dataset.from_path(..., fmt="mds")'
        )
    folder = _folder(index.path_in_repo)  # type: ignore[attr-defined]
    out = []
    for entry in shards:
        raw = f"{folder}/{(entry.get('raw_data') or {}).get('basename')}"
        basename, _, compressed = shard_file(entry)
        path = raw if raw in entries or compressed is None else f"{folder}/{basename}"
        where = f"MDS shard hf://datasets/{index.repo_id}@{index.revision}/{path}"  # type: ignore[attr-defined]
        found = entries.get(path)
        if found is None:
            raise DatasetError(f"{where} must exist as index.json lists, got no such file — upload every shard")
        if path != raw:
            check_algorithm(entry, where)
        else:
            entry = {**entry, "zip_data": None}
        etag = found.lfs.sha256 if found.lfs is not None else found.blob_id  # type: ignore[attr-defined]
        out.append(
            replace(
                index, path_in_repo=path, size=int(found.size), etag=str(etag), format="mds", entry=json.dumps(entry)
            )  # type: ignore[attr-defined]
        )
    return out


def scan_hub_mds(dataset: str, file: object, read: Callable[[int, int], bytes]) -> ShardInfo:
    """Rows and fingerprint of an MDS shard on the Hub: its header by one range request (``read``)."""
    from zephon.storage.remote import remote_uri

    uri = remote_uri(file)
    entry = json.loads(file.entry)  # type: ignore[attr-defined]
    size = int(file.size)  # type: ignore[attr-defined]
    check_shard(entry, read, size, f"dataset {dataset!r}: MDS shard {uri}")
    etag = file.etag  # type: ignore[attr-defined]
    return ShardInfo(
        uri=uri, format="mds", rows=int(entry["samples"]), bytes=size, row_groups=1, fingerprint=f"etag:{etag}"
    )
