"""The count pass on Ray: ``zephon count --engine ray`` (optional extra ``zephon[ray]``).

Tokenizing every document is the one part of planning that outgrows a machine. With ``engine="ray"`` each
shard to count becomes a Ray task that runs exactly what a local count worker runs
(``zephon.planner.counts.worker.count_shard``) and returns the per-row counts to the driver, which saves them
in the same cache (``$ZEPHON_CACHE_DIR/token-counts``) with the same atomic write. The cached arrays are
therefore byte-identical to the local process pool's, and plans cannot tell which engine counted.

Ray is joined as every Ray step of the planner joins it (``zephon.planner.ray_cluster``: the running Ray,
``RAY_ADDRESS``, else a local instance of ``workers`` CPUs); a task whose worker dies is run again. Each task
encodes on one thread with the fastest engine verified for the tokenizer (``zephon.executor.engines``;
verdicts are cached per worker machine). Workers must see the shards at the same paths (shared storage) or
reach the Hub (a task refuses a path its node cannot see, naming the node); the driver's tokenizer spec
travels with each task and each worker loads the tokenizer once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from zephon.plan.records import ShardRef
from zephon.planner.ray_cluster import (
    TaskAccess,
    adopt_credentials,
    driver_credentials,
    failpoint,
    ray_session,
    require_visible,
    run_tasks,
)
from zephon.specs import TokenizeSpec

__all__ = ["SHARED_FIX", "count_with_ray", "worker_encoder"]


#: Encoders of this Ray worker process, by their spec: each worker loads a tokenizer once.
_ENCODERS: dict[str, object] = {}


def worker_encoder(spec: dict[str, Any]) -> object:
    """This Ray worker's encoder for ``spec`` (a ``TokenizeSpec`` as a dict), on one thread: Ray runs a task per CPU
    (so fastokens' threads a call are 1 too, unless the user set them: ``encode_on_one_thread``)."""
    from zephon.executor.encode.encoders import make_encoder
    from zephon.executor.encode.text import encode_on_one_thread

    key = repr(sorted(spec.items()))
    encoder = _ENCODERS.get(key)
    if encoder is None:
        encode_on_one_thread()
        encoder = _ENCODERS[key] = make_encoder(TokenizeSpec(**spec), threads=1)
    return encoder


def count_with_ray(
    shards: Sequence[ShardRef],
    spec: TokenizeSpec,
    paths: Sequence[Path],
    save: Callable[[Path, np.ndarray], None],
    *,
    workers: int | None = None,
    on_done: Callable[[int], None] | None = None,
) -> int:
    """Count ``shards`` as Ray tasks (``zephon.planner.ray_cluster.run_tasks``: retried on a lost worker) and save
    each result to its path on the driver as it arrives; returns the tokens counted."""
    spec_dict = asdict(spec)
    tokens = 0

    def saved(i: int, counts: np.ndarray) -> None:
        nonlocal tokens
        save(paths[i], counts)
        tokens += int(counts.sum())
        if on_done is not None:
            on_done(tokens)

    with ray_session(workers) as ray:
        credentials = driver_credentials(ref.uri for ref in shards)
        arguments = [(asdict(ref), spec_dict, credentials) for ref in shards]
        run_tasks(ray, _count_remote, arguments, on_result=saved)
    return tokens


def _count_remote(ref: dict, spec: dict, credentials: TaskAccess) -> np.ndarray:
    """Runs in a Ray worker: the local worker's counting function, with the tokenizer loaded once."""
    from zephon.planner.counts.worker import count_shard

    failpoint()
    shard = ShardRef(**ref)
    require_visible([shard.uri], f"dataset {shard.dataset!r}: shard", SHARED_FIX)
    adopt_credentials(credentials)
    return count_shard(shard, spec["field"], worker_encoder(spec))  # type: ignore[arg-type]


#: How to make a local path visible to every node (one-line refusals).
SHARED_FIX = (
    "put the datasets on storage every node mounts at the same path (NFS, a shared volume) or in an object store"
)
