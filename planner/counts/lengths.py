"""Per-document sizes for token mixtures: byte lengths (cheap) and exact token counts (the count pass).

Both are arrays with one entry per row of a shard, cached under ``$ZEPHON_CACHE_DIR`` and keyed by content,
so reruns and other plans reuse them:

* byte lengths — ``byte-lengths/<key>.npy``, key = (shard fingerprint, field). Parquet: the UTF-8 byte length
  of the text field, computed with Arrow (``pyarrow.compute.binary_length``) a row group at a time, without
  tokenizing. JSONL: the byte length of the whole line (record), read from the line index; the calibration
  ratio of a JSONL dataset is measured in the same unit, so estimates stay consistent.
* token counts — ``token-counts/<key>.npy``, key = (shard fingerprint, field, tokenizer fingerprint). The
  count includes the BOS prefix and the EOS token the executor adds, so it is exactly the number of tokens
  the document contributes to the stream. Computed with the encoder's engine (``zephon.executor.engines``):
  on threads of this process, a shard per thread, when the engine releases the GIL; with ``tokenizers`` by
  worker subprocesses (``zephon.planner.counts.worker``), shards split among them longest first. One worker
  runs in-process. A progress bar follows the shards on a
  terminal (``zephon.storage.progress``).
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.compute as pc

from zephon.errors import ConfigError, ZephonError
from zephon.executor.encode.encoders import AnyEncoder, operators_of
from zephon.executor.read.parquet import as_strings
from zephon.executor.read.shard_reader import ShardReader, planning_cache
from zephon.plan.records import ShardRef
from zephon.planner.counts.shard_tokens import ShardTokens
from zephon.planner.counts.worker import count_shard, save_atomic
from zephon.specs import TokenizeSpec
from zephon.storage.files import cache_dir
from zephon.storage.progress import progress_bar, track

if TYPE_CHECKING:
    from tqdm import tqdm


@dataclass(frozen=True, kw_only=True, slots=True)
class CountReport:
    """What a count pass did: shards counted now, shards found in the cache, tokens in all."""

    counted: int
    cached: int
    tokens: int


def _key(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=20).hexdigest()


def _byte_lengths_path(ref: ShardRef, field: str) -> Path:
    return cache_dir() / "byte-lengths" / f"{_key(ref.fingerprint, field)}.npy"


def byte_lengths(ref: ShardRef, field: str) -> np.ndarray:
    """Per-row byte length (int64) of one shard, cached."""
    path = _byte_lengths_path(ref, field)
    cached = load_cached(path, ref.rows)
    return cached if cached is not None else _compute_byte_lengths(ref, field, path)


def cache_byte_lengths(ref: ShardRef, field: str) -> None:
    """Make sure one shard's byte lengths are cached, without loading them when they already are."""
    path = _byte_lengths_path(ref, field)
    if load_cached(path, ref.rows, header_only=True) is None:
        _compute_byte_lengths(ref, field, path)


def _compute_byte_lengths(ref: ShardRef, field: str, path: Path) -> np.ndarray:
    reader = ShardReader([ref], field, capacity=1, cache=planning_cache())
    shard = reader.open_shard(ref.shard_id, cache=False)  # validates size (local) and the field's presence
    try:
        if shard.parquet is not None:
            pf = shard.parquet
            parts = [
                pc.binary_length(as_strings(pf.read_row_group(g, columns=[field]).column(0).combine_chunks())).to_numpy(
                    zero_copy_only=False
                )
                for g in range(pf.metadata.num_row_groups)
            ]
            lengths = np.nan_to_num(np.concatenate(parts).astype(np.float64), nan=0).astype(np.int64)
        else:
            assert shard.spans is not None
            lengths = (shard.spans[1] - shard.spans[0]).astype(np.int64)
    finally:
        shard.close()
    save_atomic(path, lengths)
    return lengths


def load_cached(
    path: Path, rows: int, *, header_only: bool = False, dtype: np.dtype | None = None
) -> np.ndarray | None:
    """A cached per-row array, or None when absent, unreadable, of the wrong length or (with ``dtype``) of
    another dtype: computed again. ``header_only``: map the file instead of reading it (to check what is cached
    without loading it)."""
    if not path.is_file():
        return None
    try:
        array = np.load(path, mmap_mode="r" if header_only else None)
    except (OSError, ValueError, EOFError):
        return None
    if array.ndim != 1 or len(array) != rows or (dtype is not None and array.dtype != dtype):
        return None
    return array


def _counts_path(ref: ShardRef, field: str, tokenizer_fingerprint: str) -> Path:
    return cache_dir() / "token-counts" / f"{_key(ref.fingerprint, field, tokenizer_fingerprint)}.npy"


def _run_workers(jobs: list[dict], bar: tqdm) -> int:
    """Run count workers as subprocesses, advancing ``bar`` (a ``progress_bar``) per shard; return the tokens
    they counted."""
    procs = start_workers("zephon.planner.counts.worker", jobs)
    tokens = 0
    for message in worker_lines(procs):
        tokens += message["tokens"]
        bar.set_postfix(tokens=f"{tokens:,}", refresh=False)  # drawn by the update
        bar.update(1)
    for proc in procs:
        assert proc.stderr is not None
        err = proc.stderr.read()
        if proc.wait() != 0:
            last = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
            raise ZephonError(f"the count pass must finish every shard, got a worker failure: {last}")
    return tokens


def start_workers(module: str, payloads: Sequence[object]) -> list[subprocess.Popen[str]]:
    """One ``python -m module`` worker process per payload, each given its payload as JSON on stdin (read with
    :func:`worker_lines`)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in payloads
    ]
    for proc, payload in zip(procs, payloads, strict=True):
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(payload))
        proc.stdin.close()
    return procs


def worker_lines(procs: Sequence[subprocess.Popen[str]]) -> Iterator[dict[str, Any]]:
    """Each JSON line the worker processes write on their stdout, as it arrives (in any order between workers);
    the local passes of the planner (counting, ``zephon tokenize``) read their workers through it."""
    with selectors.DefaultSelector() as sel:
        for proc in procs:
            assert proc.stdout is not None
            sel.register(proc.stdout, selectors.EVENT_READ)
        open_streams = len(procs)
        while open_streams:
            for key, _ in sel.select():
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if not line:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                yield json.loads(line)


def _count_on_threads(
    shards: Sequence[ShardRef],
    paths: Sequence[Path],
    spec: TokenizeSpec,
    encoder: AnyEncoder,
    threads: int,
    progress: bool | None,
) -> None:
    """Count shards on ``threads`` threads of this process, one shard per thread at a time, longest first.
    For engines that release the GIL while they encode (fastokens, gigatoken, tiktoken; ``tokenizers`` spreads
    one call over its own threads and, like kitoken, is counted in worker processes instead): no process
    start-up, no tokenizer loaded again per worker, Parquet decoding and encoding overlap."""

    def count(k: int) -> int:
        counts = count_shard(shards[k], spec.field, encoder, split=False)
        save_atomic(paths[k], counts)
        return len(counts)

    order = sorted(range(len(shards)), key=lambda k: (-shards[k].bytes, k))
    with (
        progress_bar(total=len(shards), desc="counting tokens", unit="shard", progress=progress) as bar,
        ThreadPoolExecutor(threads, thread_name_prefix="zephon-count") as pool,
    ):
        for future in as_completed([pool.submit(count, k) for k in order]):
            future.result()
            bar.update(1)


def token_counts(
    shards: Sequence[ShardRef],
    spec: TokenizeSpec,
    encoder: AnyEncoder,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    engine: str = "local",
) -> tuple[ShardTokens, CountReport]:
    """Exact per-row token counts (int32) for every shard, counting only what is not cached; the arrays stay in
    the cache and are loaded shard by shard (``ShardTokens``).

    ``engine="local"`` counts on this machine: on threads of this process when the encoder's engine releases the
    GIL (fastokens, gigatoken, tiktoken), else in worker subprocesses (in this process when one
    worker is enough); ``engine="ray"`` as Ray tasks (``zephon.planner.counts.ray_pass``). All save identical
    arrays to the same cache. ``progress``: a bar of the shards counted by the local engine
    (``zephon.storage.progress``: ``None`` draws it on a terminal only).
    """
    if engine not in ("local", "ray"):
        raise ConfigError(f'count engine must be "local" or "ray", got {engine!r}')
    in_process = bool(operators_of(encoder))  # user functions do not travel to worker processes as JSON
    if in_process and engine == "ray":
        raise ConfigError(
            'count engine must be "local" for a pipeline with user operators, got "ray" — count locally (the '
            "operators run in this process)"
        )
    paths = [_counts_path(r, spec.field, encoder.fingerprint) for r in shards]
    todo = [i for i, r in enumerate(shards) if load_cached(paths[i], r.rows, header_only=True) is None]
    if todo and engine == "ray":
        from zephon.planner.counts.ray_pass import count_with_ray

        count_with_ray([shards[i] for i in todo], spec, [paths[i] for i in todo], save_atomic, workers=workers)
    elif todo:
        n_workers = 1 if in_process else max(1, min(workers or os.cpu_count() or 1, len(todo)))
        if n_workers == 1:
            for i in track(todo, total=len(todo), desc="counting tokens", unit="shard", progress=progress):
                save_atomic(paths[i], count_shard(shards[i], spec.field, encoder))
        elif encoder.releases_gil:
            _count_on_threads([shards[i] for i in todo], [paths[i] for i in todo], spec, encoder, n_workers, progress)
        else:
            # Longest shards first, each to the least loaded worker: a deterministic, balanced split.
            loads = [0] * n_workers
            tasks: list[list[dict]] = [[] for _ in range(n_workers)]
            for i in sorted(todo, key=lambda i: (-shards[i].bytes, i)):
                w = loads.index(min(loads))
                loads[w] += shards[i].bytes
                tasks[w].append({"ref": asdict(shards[i]), "out": str(paths[i])})
            base = {"tokenize": asdict(spec), "single_thread": True}
            with progress_bar(total=len(todo), desc="counting tokens", unit="shard", progress=progress) as bar:
                _run_workers([{**base, "tasks": t} for t in tasks if t], bar)

    def loader(ref: ShardRef, path: Path) -> Callable[[], np.ndarray]:
        def load() -> np.ndarray:
            cached = load_cached(path, ref.rows)
            if cached is None:  # evicted from the cache since (or never written by a worker): count it here
                cached = count_shard(ref, spec.field, encoder)
                save_atomic(path, cached)
            return cached

        return load

    arrays = ShardTokens(
        [loader(r, p) for r, p in zip(shards, paths, strict=True)],
        rows=[r.rows for r in shards],
        names=[f"{r.uri} (dataset {r.dataset!r})" for r in shards],
    )
    return arrays, CountReport(counted=len(todo), cached=len(shards) - len(todo), tokens=arrays.total())
