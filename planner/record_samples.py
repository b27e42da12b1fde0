"""A record dataset's samples read at planning, as a record pipeline reads them before operators.

Planning reads samples where a value lives inside them: the computed cost pass (``zephon.planner.counts.computed``)
calls a function on each, and a selection over an MDS dataset's own columns keeps the columns it names
(``zephon.planner.selection.tables``). Both read a shard in row order, ``CHUNK`` samples at a time: a local tar or
MDS shard checked against the plan (``zephon.executor.records``), a remote one read whole with one request (one
GET a shard rather than one a sample), a compressed one decompressed; Parquet and JSONL rows through the
executor's shard reader.

Invariant: ``[s for chunk in shard_samples(ref) for s in chunk]`` has ``ref.rows`` samples, sample ``k`` being the
record a run reads at row ``k`` of that shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from zephon.executor.records import mds
from zephon.executor.records.mds import MdsRecords
from zephon.executor.records.tar import TarShard, open_bytes, open_local
from zephon.plan.records import ShardRef
from zephon.storage.remote import is_hub_uri, is_remote_uri
from zephon.storage.tar_index import TAR_FORMATS

__all__ = ["CHUNK", "shard_samples"]

#: Samples read at a time from a tar or MDS shard.
CHUNK = 256


def _remote_bytes(ref: ShardRef) -> bytes:
    """A remote shard's bytes, read whole with one request (a Hub file, or an object carrying its pin)."""
    if is_hub_uri(ref.uri):
        from zephon.storage.hub.client import read_remote_range
        from zephon.storage.remote import remote_file

        hub = remote_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format)
        return read_remote_range(hub, 0, ref.bytes) if ref.bytes else b""
    from zephon.storage.objects.reads import object_file, read_whole

    return read_whole(object_file(ref.uri, size=ref.bytes, fingerprint=ref.fingerprint, fmt=ref.format))


def _tar(ref: ShardRef) -> TarShard:
    return open_local(ref) if not is_remote_uri(ref.uri) else open_bytes(ref, _remote_bytes(ref))


def _mds(ref: ShardRef) -> MdsRecords:
    return mds.open_local(ref) if not is_remote_uri(ref.uri) else mds.open_bytes(ref, _remote_bytes(ref))


def shard_samples(ref: ShardRef) -> Iterator[list[Any]]:
    """Every sample of ``ref`` in row order, a chunk at a time, as a record pipeline reads it before operators."""
    if ref.format in TAR_FORMATS or ref.format == "mds":
        shard: TarShard | MdsRecords = _mds(ref) if ref.format == "mds" else _tar(ref)
        try:
            for start in range(0, ref.rows, CHUNK):
                yield shard.read(np.arange(start, min(start + CHUNK, ref.rows), dtype=np.int64))
        finally:
            shard.close()
        return
    # Imported here: a worker of tar or MDS shards starts without the text reader's modules (measured: half of
    # its start-up on a loaded machine; benchmarks/bench_costs.py).
    from zephon.executor.read.shard_reader import ShardReader, planning_cache
    from zephon.executor.records.source import WholeRecords

    reader = ShardReader([ref], "", capacity=1, cache=planning_cache(), convert=WholeRecords())
    yield from reader.iter_shard(ref.shard_id)
