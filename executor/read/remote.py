"""Remote shards of a plan on a training rank: the shard cache, checked at start, fed with future accesses.

Object-store shards (``s3://``, ``gs://``, ``az://``) go through the same cache when it is enabled (or asked for:
``remote_read="cache"``), else they are read by ranges (``StoreOptions.remote_read``, ``"auto"`` by default):
then they are never staged on disk, and the shard reader
fetches the row groups each chunk needs (``zephon.storage.objects.range_file``). ``hf://`` shards always use the
cache. A token store's parts, wherever they are, are read by ranges by the plan's stores
(``zephon.executor.token_stores.shards``), never through the cache. The run's ``StoreOptions.credentials`` come
first for its object-store reads.
"""

from __future__ import annotations

from zephon.errors import ConfigError, DatasetError
from zephon.executor.plan_reader import PlanBundle
from zephon.executor.read.schedule import ShardSchedule
from zephon.executor.read.shard_reader import ShardReader, remote_spec
from zephon.executor.token_stores.shards import is_store_shard
from zephon.specs import StoreOptions
from zephon.storage.objects.paths import is_object_uri
from zephon.storage.remote import is_remote_uri
from zephon.storage.shard_cache import ShardCache


class RemoteAccess:
    """Remote shards of a plan: the shard cache, checked at start, fed with the plan's future accesses.

    Before the first batch every remote shard must fit in the cache (a shard larger than ``limit_bytes`` is
    an error now, not mid-run). As the run advances, ``advance(position)`` tells the reader each shard's next
    use (for eviction: the shard needed farthest in the future goes first) and prefetches the next shards
    in plan order.
    """

    PREFETCH = 4

    def __init__(self, plan: PlanBundle, io: StoreOptions, reader: ShardReader) -> None:
        ranged = io.ranged()
        self.remote = {  # a shard the plan holds a copy of is read from the copy (zephon.executor.read.selected_copy)
            s.shard_id: s
            for s in plan.shards
            if is_remote_uri(s.uri)
            and not (ranged and is_object_uri(s.uri))
            and s.shard_id not in plan.copies
            and not is_store_shard(s)  # a token store's parts are read by ranges (token_stores.shards), never cached
        }
        self.reader = reader
        self.cache: ShardCache | None = None
        reader.attach_credentials(io.credentials)
        if ranged:
            reader.attach_ranges(io.read_ahead_bytes)
        if not self.remote:
            return
        if not io.cache.enabled:
            first = next(iter(self.remote.values()))
            raise ConfigError(
                f"dataset {first.dataset!r}: remote shards must be read through the shard cache, got "
                "CacheOptions(enabled=False) — pass .options(io_options=StoreOptions(cache=CacheOptions("
                "enabled=True, root=..., limit_bytes=...)))"
                + (
                    ', or read object-store shards by ranges: StoreOptions(remote_read="range")'
                    if is_object_uri(first.uri)
                    else ""
                )
            )
        self.cache = ShardCache.from_options(io.cache)
        self.specs = {sid: remote_spec(ref, io.credentials) for sid, ref in self.remote.items()}
        self.cache.check_fits(list(self.specs.values()))
        largest = sorted((ref.bytes for ref in self.remote.values()), reverse=True)[: reader.capacity]
        limit = io.cache.limit_bytes
        if limit is not None and sum(largest) > limit:
            raise DatasetError(
                f"CacheOptions.limit_bytes must hold the {len(largest)} shards the executor keeps open at once "
                f"(shuffle window + 1 per dataset), {sum(largest)} bytes, got {limit} — raise limit_bytes or "
                "plan with a smaller ShuffleSpec.window_shards"
            )
        self.schedule = ShardSchedule(plan.sample_files, set(self.remote))
        reader.attach_cache(self.cache)

    def advance(self, position: int) -> None:
        if self.cache is None:
            return
        self.reader.next_use = {sid: self.schedule.next_use(sid, position) for sid in self.remote}
        keys = {self.specs[s].key: p for s, p in self.reader.next_use.items() if p is not None}
        upcoming = self.schedule.upcoming(position, self.PREFETCH)
        self.cache.prefetch([self.specs[s] for s in upcoming], next_use=keys)

    def close(self) -> None:
        self.reader.close()
        if self.cache is not None:
            self.cache.close()
