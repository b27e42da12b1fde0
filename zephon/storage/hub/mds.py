"""MDS datasets of records on the Hub (``hf://org/name/split`` whose split holds ``index.json`` beside ``*.mds``
shards, as Mosaic's ``MDSWriter`` wrote them): ``index.json`` and each shard's header by range requests.

``resolve_hf_dataset`` lists a split whose data files are one ``index.json`` with ``.mds`` (or compressed
``.mds.zstd`` …) files beside it as that index (format ``json``) and those files; ``mds_split`` then reads
``index.json`` (one request) and gives each entry it lists as a ``RemoteFile`` of format ``mds`` carrying its
entry — the raw shard, else its compressed file. ``scan_hub_mds`` reads a shard's header (one range request of
``4 × (samples + 2)`` bytes; a compressed shard is downloaded whole, in memory) and checks it against the entry
as a local scan does. The fingerprint is the file's ``etag:`` as for every Hub file; at run time the shard goes
through the shard cache (downloaded whole and verified, as every ``hf://`` shard is) and is opened from the
copy's own header and column JSON.

Example: ``org/pairs`` with ``train/index.json``, ``train/shard.00000.mds`` (5 samples) and
``train/shard.00001.mds`` (2): ``hf://org/pairs/train`` plans with 3 file requests — ``index.json``, then 28 and
16 bytes of the two headers.
"""

from __future__ import annotations

import json
from dataclasses import replace

from zephon.errors import DatasetError
from zephon.plan.records import ShardInfo
from zephon.storage.hub.fetch import read_remote_range
from zephon.storage.hub.resolve import RemoteFile
from zephon.storage.mds_compression import check_algorithm, shard_file
from zephon.storage.mds_records import check_shard, is_record_index, parse_index

__all__ = ["mds_split", "scan_hub_mds"]


def mds_split(files: tuple[RemoteFile, ...]) -> tuple[RemoteFile, ...]:
    """The shards of an MDS split as ``resolve_hf_dataset`` lists it (its ``index.json``, format ``json``, and the
    ``mds`` files beside it): ``files`` unchanged when it is not one, else the ``RemoteFile`` of every shard the
    index lists, in its order, each with its entry (``entry``: JSON)."""
    index = next((f for f in files if f.format == "json"), None)
    if index is None:
        return files
    name = f"hf://datasets/{index.repo_id}@{index.revision}/{index.path_in_repo}"
    shards = parse_index(read_remote_range(index, 0, index.size) if index.size else b"", name)
    if not is_record_index(shards):
        raise DatasetError(
            f"{name} must describe MDS records (a column that is not str, no tokens/input_ids column), got a token "
            'store\'s columns — read it as a token store: Dataset.from_path(..., fmt="mds")'
        )
    folder = index.path_in_repo.rpartition("/")[0]
    by_path = {f.path_in_repo: f for f in files}
    out = []
    for entry in shards:
        raw = f"{folder}/{(entry.get('raw_data') or {}).get('basename')}".lstrip("/")
        basename, _, compressed = shard_file(entry)
        path = raw if raw in by_path or compressed is None else f"{folder}/{basename}".lstrip("/")
        where = f"MDS shard hf://datasets/{index.repo_id}@{index.revision}/{path}"
        found = by_path.get(path)
        if found is None:
            raise DatasetError(f"{where} must exist as index.json lists, got no such file — upload every shard")
        if path != raw:
            check_algorithm(entry, where)
        else:
            entry = {**entry, "zip_data": None}
        out.append(replace(found, format="mds", entry=json.dumps(entry)))
    return tuple(out)


def scan_hub_mds(dataset: str, file: RemoteFile) -> ShardInfo:
    """Rows and fingerprint of an MDS shard on the Hub: its header by one range request (a compressed shard: the
    whole file, in memory)."""
    uri = f"hf://datasets/{file.repo_id}@{file.revision}/{file.path_in_repo}"  # the plan's form (storage.remote)
    assert file.entry is not None
    entry = json.loads(file.entry)
    check_shard(entry, lambda s, e: read_remote_range(file, s, e), file.size, f"dataset {dataset!r}: MDS shard {uri}")
    rows = int(entry["samples"])
    return ShardInfo(uri=uri, format="mds", rows=rows, bytes=file.size, row_groups=1, fingerprint=f"etag:{file.etag}")
