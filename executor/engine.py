"""The executor's settings and shared pieces: pack/batch specs, run statistics, exact-plan checks, remote
shard access. The loop itself is ``zephon.executor.runner``.

The executor follows the plan and decides nothing about *what* is read: the documents, their order and
therefore every batch are fixed by the plan bundle and the tokenize/pack settings. ``read_chunk`` (documents
read and tokenized together) and the tokenizer's thread count change speed only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zephon.errors import ConfigError, DatasetError
from zephon.executor.plan_reader import PlanBundle, ShardRef
from zephon.executor.shard_reader import ON_BAD_DOCUMENT, ShardReader, remote_spec
from zephon.executor.shard_schedule import ShardSchedule
from zephon.executor.tokenize import Encoder, TokenizeSpec
from zephon.io import StoreOptions
from zephon.remote import is_remote_uri
from zephon.shard_cache import ShardCache


@dataclass(frozen=True, kw_only=True, slots=True)
class PackSpec:
    """Settings of ``Pipeline.pack_flat``.

    Attributes:
        max_length: tokens per packed row: context length + 1 (labels are shifted by one).
        algorithm: ``"wrap"`` concatenates documents and cuts rows, splitting documents at row ends;
            ``"best_fit"`` (exact plans only) places whole documents into rows planned offline, minimizing
            padding.
        pad_token_id: pads short rows; None uses the tokenizer's pad token, else EOS.
        oversize: best_fit only: a document longer than ``max_length`` is ``"split"`` into pieces of at most
            ``max_length`` tokens or ``"drop"``ped; either way it is counted in plan.json.
    """

    max_length: int
    algorithm: str = "wrap"
    pad_token_id: int | None = None
    oversize: str = "split"

    def __post_init__(self) -> None:
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise ConfigError(f"max_length must be an integer ≥ 2, got {self.max_length!r} — use context + 1")
        if self.algorithm not in ("wrap", "best_fit"):
            raise ConfigError(f'pack_flat algorithm must be "wrap" or "best_fit", got {self.algorithm!r}')
        if self.oversize not in ("split", "drop"):
            raise ConfigError(f'pack_flat oversize must be "split" or "drop", got {self.oversize!r}')


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchSpec:
    """Settings of ``Pipeline.batch``.

    Attributes:
        microbatch_size: packed rows per batch (per rank).
        global_batch_size: rows per optimizer step over all data-parallel ranks; None means
            microbatch_size × dp_size (no gradient accumulation). Keep it fixed to change dp_size mid-run.
        drop_last: stop before the plan's final, incomplete step (default keeps it, padded: no data lost).
    """

    microbatch_size: int
    global_batch_size: int | None = None
    drop_last: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.microbatch_size, int) or self.microbatch_size < 1:
            raise ConfigError(f"microbatch_size must be an integer ≥ 1, got {self.microbatch_size!r}")
        g = self.global_batch_size
        if g is not None and (not isinstance(g, int) or g < self.microbatch_size):
            raise ConfigError(f"global_batch_size must be an integer ≥ microbatch_size, got {g!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutorSpec:
    """Everything the executor needs besides the plan.

    Attributes:
        on_bad_document: ``"raise"`` (default) stops at a bad document with an error naming dataset, shard and
            row; ``"skip"`` (estimated plans only) skips it — no tokens — and counts it in ``RunStats.skipped``.
            See docs/reliability.md.
    """

    tokenize: TokenizeSpec
    pack: PackSpec
    batch: BatchSpec
    io: StoreOptions = field(default_factory=StoreOptions)
    read_chunk: int = 1024
    on_bad_document: str = "raise"

    def __post_init__(self) -> None:
        if self.on_bad_document not in ON_BAD_DOCUMENT:
            raise ConfigError(f'on_bad_document must be "raise" or "skip", got {self.on_bad_document!r}')


@dataclass(slots=True)
class RunStats:
    """What an executor run has read so far, per dataset name: documents and (realized) tokens.

    Under ``on_bad_document="skip"``, ``skipped`` counts skipped documents by reason (``SKIP_REASONS``) and
    ``skipped_by_shard`` by shard URI, then reason; a skipped document is in neither ``documents`` nor
    ``tokens``.
    """

    documents: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_by_shard: dict[str, dict[str, int]] = field(default_factory=dict)

    def skip(self, ref: ShardRef, row: int, reason: str) -> None:
        """Count one skipped document (the ``on_skip`` callback of ``ShardReader``)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        shard = self.skipped_by_shard.setdefault(ref.uri, {})
        shard[reason] = shard.get(reason, 0) + 1

    def add(self, names: list[str], dataset_ids: np.ndarray, lengths: np.ndarray) -> None:
        docs = np.bincount(dataset_ids, minlength=len(names))
        toks = np.bincount(dataset_ids, weights=lengths, minlength=len(names))
        for i, name in enumerate(names):
            self.documents[name] = self.documents.get(name, 0) + int(docs[i])
            self.tokens[name] = self.tokens.get(name, 0) + int(toks[i])

    def token_shares(self) -> dict[str, float]:
        total = sum(self.tokens.values())
        return {k: v / total for k, v in self.tokens.items()} if total else {}


def check_exact_plan(plan: PlanBundle, spec: ExecutorSpec, encoder: Encoder) -> None:
    """Refuse to run an exact plan with a tokenizer or packing other than the ones it was planned with."""
    if spec.on_bad_document != "raise":
        raise ConfigError(
            f'on_bad_document must be "raise" for an exact plan, got {spec.on_bad_document!r} — its token counts, '
            "offsets and packing include every document, so none can be skipped: fix or remove the bad documents "
            "and re-plan, or plan without exact_tokens to skip them"
        )
    tok = plan.manifest["tokenizer"]
    packing = plan.manifest["packing"]
    differences = []
    if tok["fingerprint"] != encoder.fingerprint:
        differences.append(
            f"tokenizer {spec.tokenize.tokenizer_id!r} (planned with {tok['id']!r}; fingerprints differ)"
        )
    if tok["field"] != spec.tokenize.field:
        differences.append(f"field {spec.tokenize.field!r} (planned {tok['field']!r})")
    if packing["max_length"] != spec.pack.max_length:
        differences.append(f"max_length {spec.pack.max_length} (planned {packing['max_length']})")
    if packing["algorithm"] != spec.pack.algorithm:
        differences.append(f"algorithm {spec.pack.algorithm!r} (planned {packing['algorithm']!r})")
    if differences:
        raise ConfigError(
            f"an exact plan must run with the settings it was planned with, got {'; '.join(differences)} — "
            "use the planned settings or re-plan"
        )


class RemoteAccess:
    """Remote shards of a plan: the shard cache, checked at start, fed with the plan's future accesses.

    Before the first batch every remote shard must fit in the cache (a shard larger than ``limit_bytes`` is
    an error now, not mid-run). As the run advances, ``advance(position)`` tells the reader each shard's next
    use (for eviction: the shard needed farthest in the future goes first) and prefetches the next shards
    in plan order.
    """

    PREFETCH = 4

    def __init__(self, plan: PlanBundle, io: StoreOptions, reader: ShardReader) -> None:
        self.remote = {s.shard_id: s for s in plan.shards if is_remote_uri(s.uri)}
        self.reader = reader
        self.cache: ShardCache | None = None
        if not self.remote:
            return
        if not io.cache.enabled:
            first = next(iter(self.remote.values()))
            raise ConfigError(
                f"dataset {first.dataset!r}: remote shards must be read through the shard cache, got "
                "CacheOptions(enabled=False) — pass .options(io_options=StoreOptions(cache=CacheOptions("
                "enabled=True, root=..., limit_bytes=...)))"
            )
        self.cache = ShardCache.from_options(io.cache)
        self.specs = {sid: remote_spec(ref) for sid, ref in self.remote.items()}
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
