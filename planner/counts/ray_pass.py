"""The count pass on Ray: ``zephon count --engine ray`` (optional extra ``zephon[ray]``).

Tokenizing every document is the one part of planning that outgrows a machine. With ``engine="ray"`` each
shard to count becomes a Ray task that runs exactly what a local count worker runs
(``zephon.planner.counts.worker.count_shard``) and returns the per-row counts to the driver, which saves them
in the same cache (``$ZEPHON_CACHE_DIR/token-counts``) with the same atomic write. The cached arrays are
therefore byte-identical to the local process pool's, and plans cannot tell which engine counted.

``ray.init()`` joins the cluster named by ``RAY_ADDRESS`` when set, else starts a local instance with
``workers`` CPUs. Each task encodes on one thread with the fastest engine verified for the tokenizer
(``zephon.executor.engines``; verdicts are cached per worker machine). Workers must see the shards at the
same paths (shared storage) or reach the Hub; the driver's tokenizer spec travels with each task and each
worker loads the tokenizer once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.plan.records import ShardRef
from zephon.specs import TokenizeSpec


def _import_ray():  # -> module
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "engine 'ray' must have Ray installed, got no `ray` module — pip install 'zephon[ray]', or use the "
            "local engine"
        ) from exc
    return ray


@contextlib.contextmanager
def ray_session(workers: int | None) -> Iterator[Any]:
    """The ``ray`` module, joined to the cluster of ``RAY_ADDRESS`` or a local instance of ``workers`` CPUs when Ray
    is not running yet (and shut down after); the Ray passes of the planner (counting, ``zephon tokenize``) share it."""
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        kwargs = {"address": address} if address else {"num_cpus": workers or os.cpu_count() or 1}
        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", **kwargs)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


#: Encoders of this Ray worker process, by their spec: each worker loads a tokenizer once.
_ENCODERS: dict[str, object] = {}


def worker_encoder(spec: dict[str, Any]) -> object:
    """This Ray worker's encoder for ``spec`` (a ``TokenizeSpec`` as a dict), on one thread: Ray runs a task per CPU."""
    from zephon.executor.encode.encoders import make_encoder

    key = repr(sorted(spec.items()))
    encoder = _ENCODERS.get(key)
    if encoder is None:
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
    """Count ``shards`` as Ray tasks and save each result to its path; returns the tokens counted."""
    with ray_session(workers) as ray:
        task = ray.remote(_count_remote)
        spec_dict = asdict(spec)
        pending = {task.remote(asdict(ref), spec_dict): i for i, ref in enumerate(shards)}
        tokens = 0
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            counts = ray.get(done[0])
            save(paths[i], counts)
            tokens += int(counts.sum())
            if on_done is not None:
                on_done(tokens)
        return tokens


def _count_remote(ref: dict, spec: dict) -> np.ndarray:
    """Runs in a Ray worker: the local worker's counting function, with the tokenizer loaded once."""
    from zephon.planner.counts.worker import count_shard

    return count_shard(ShardRef(**ref), spec["field"], worker_encoder(spec))  # type: ignore[arg-type]
