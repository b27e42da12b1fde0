"""``tokenize_datasets``: raw datasets written once as Megatron token stores, in parallel, resumable.

The library function under ``zephon tokenize`` (docs/token-stores.md, "Writing a store"). For every dataset,
every shard becomes one prefix ``OUT_DIR/<dataset>/<shard>`` (``.bin`` + ``.idx``, readable by megatron-core's
``IndexedDataset`` and by ``open_token_store``; ``.zephon.json`` beside them says what made it):

1. the datasets are scanned (``zephon.storage.scan``: rows and content fingerprint per shard);
2. holding ``OUT_DIR``'s lock (``.OUT_DIR.lock`` beside it: one writer at a time), the temporaries of killed runs
   are swept and every prefix is looked at (``prefixes.resume_state``): finished stores of the same input are
   kept, files Zephon did not write are refused;
3. the remaining shards are written, each by ``shard.write_shard_store``: in this process (one worker), in
   worker subprocesses (``worker.py``; shards longest first to the least loaded worker), or as Ray tasks
   (``ray_tasks.py``). A store depends on its shard and the tokenizer alone, so the output is byte-identical
   for any number of workers and either engine.

dtype: Megatron's rule on the tokenizer's vocabulary (uint16 below 65 500 ids, else int32), the same for every
store of a run. Example: the demo corpus (7 shards, 3 datasets) with the demo tokenizer (4 096 ids) → 7 uint16
prefixes ``OUT/prose/prose-00000`` … ``OUT/short/short-00000``; run again, all 7 are kept and nothing is encoded.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from zephon.errors import ConfigError, StorageError, ZephonError, ZephonWarning
from zephon.executor.encode.encoders import AnyEncoder, make_encoder
from zephon.executor.token_stores.megatron_writer import megatron_dtype, sweep_temporaries
from zephon.plan.records import ShardRef
from zephon.planner.counts.lengths import start_workers, worker_lines
from zephon.planner.tokenize.prefixes import Expected, prefix_names, resume_state
from zephon.planner.tokenize.records import RECORD_SUFFIX, StoreRecord
from zephon.planner.tokenize.shard import ShardTask, check_encoder, write_shard_store
from zephon.planner.tokenize.worker import task_json
from zephon.recipe.dataset import Dataset
from zephon.specs import TokenizeSpec
from zephon.storage.files import claimed
from zephon.storage.progress import progress_bar
from zephon.storage.scan import scan_shard

__all__ = ["DatasetStores", "TokenizeReport", "tokenize_datasets"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetStores:
    """One dataset's stores: the folder, its prefixes (in shard order), their documents and tokens, and the
    documents ``max_tokens`` cut (``long_documents: truncate``) with the tokens cut from them."""

    dataset: str
    folder: str
    prefixes: tuple[str, ...]
    documents: int
    tokens: int
    truncated: int = 0
    truncated_tokens: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizeReport:
    """What a run did: stores written now, stores kept from an earlier run, the dtype, each dataset's stores."""

    written: int
    kept: int
    dtype: str
    datasets: tuple[DatasetStores, ...]

    @property
    def documents(self) -> int:
        return sum(d.documents for d in self.datasets)

    @property
    def tokens(self) -> int:
        return sum(d.tokens for d in self.datasets)


def _scan(datasets: Sequence[Dataset], progress: bool | None, engine: str, workers: int | None) -> list[list[ShardRef]]:
    """Every dataset's shards scanned and numbered; as Ray tasks with ``engine="ray"`` (the same records)."""
    groups: list[list[ShardRef]] = []
    next_id = 0
    with progress_bar(
        total=sum(len(d.files) for d in datasets), desc="scanning shards", unit="shard", progress=progress
    ) as bar:
        if engine == "ray":
            from zephon.planner.ray_scan import scan_on_ray

            scanned = scan_on_ray([(ds.name, ds.files) for ds in datasets], workers=workers, on_done=bar.update)
        else:
            scanned = []
            for ds in datasets:
                scanned.append([])
                for file in ds.files:
                    scanned[-1].append(scan_shard(ds.name, file))
                    bar.update(1)
        for index, (ds, infos) in enumerate(zip(datasets, scanned, strict=True)):
            refs = []
            for info in infos:
                refs.append(info.placed(shard_id=next_id, dataset_id=index, dataset=ds.name))
                next_id += 1
            groups.append(refs)
    return groups


def _check_datasets(datasets: Sequence[Dataset]) -> None:
    if not datasets:
        raise ConfigError("datasets must be given, got none — pass a CONFIG file or dataset paths")
    seen = set()
    for ds in datasets:
        if ds.name in seen:
            raise ConfigError(
                f"dataset names must be distinct (each gets OUT_DIR/NAME), got {ds.name!r} twice — rename one"
            )
        seen.add(ds.name)
        if ds.selection is not None:
            raise ConfigError(
                f"dataset {ds.name!r} must have no selection (where, metadata, order_by, dedup_on) to be tokenized, "
                "got one — zephon tokenize writes every row (store document i is shard row i); select when planning"
            )


def tokenize_datasets(
    datasets: Sequence[Dataset],
    spec: TokenizeSpec,
    out_dir: str | os.PathLike[str],
    *,
    workers: int | None = None,
    engine: str = "local",
    progress: bool | None = None,
    overwrite: bool = False,
) -> TokenizeReport:
    """Write every shard of ``datasets`` as a Megatron store under ``out_dir`` (see the module docstring).

    ``workers``: processes (``engine="local"``) or Ray CPUs of a local Ray instance (``engine="ray"``); default
    all cores. ``overwrite``: replace stores an earlier run wrote from other input (another tokenizer, a changed
    shard); files Zephon did not write are refused whatever it says. ``progress``: a bar of the documents
    written (``zephon.storage.progress``: ``None`` draws it on a terminal only).
    """
    if engine not in ("local", "ray"):
        raise ConfigError(f'engine must be "local" or "ray", got {engine!r} — pick one')
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers must be an integer ≥ 1 or None, got {workers!r}")
    _check_datasets(datasets)
    encoder = make_encoder(spec)
    check_encoder(encoder)
    dtype = megatron_dtype(encoder.tokenizer.get_vocab_size(with_added_tokens=True))
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise StorageError(f"-o {out} must be a directory for the token stores, got a file — choose another path")
    groups = _scan(datasets, progress, engine, workers)
    absolute = Path(os.path.abspath(out))  # "-o ." has no name to put a lock beside
    absolute.parent.mkdir(parents=True, exist_ok=True)
    made = [d for d in (absolute, *(absolute / ds.name for ds in datasets)) if not d.exists()]
    with claimed(absolute, "the token stores"):
        try:
            tasks, kept = _resume(datasets, groups, out, spec, encoder, str(dtype), overwrite)
            todo = [t for t, k in zip(tasks, kept, strict=True) if k is None]
            written = _write(todo, spec, encoder, dtype, workers=workers, engine=engine, progress=progress)
        except BaseException:  # a bad document, a wrong field: the folders this run made and left empty go
            for folder in reversed(made):  # (a store or temporary written in one keeps it, for the rerun)
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
    by_prefix = {r.shard: r for r in [*(k for k in kept if k is not None), *written]}
    summaries = []
    for ds, refs in zip(datasets, groups, strict=True):
        records = [by_prefix[r.uri] for r in refs]
        prefixes = tuple(t.prefix for t in tasks if t.ref.dataset == ds.name)
        summaries.append(
            DatasetStores(
                dataset=ds.name,
                folder=str(out / ds.name),
                prefixes=prefixes,
                documents=sum(r.documents for r in records),
                tokens=sum(r.tokens for r in records),
                truncated=sum(r.truncated for r in records),
                truncated_tokens=sum(r.truncated_tokens for r in records),
            )
        )
    return TokenizeReport(written=len(todo), kept=len(tasks) - len(todo), dtype=str(dtype), datasets=tuple(summaries))


def _resume(
    datasets: Sequence[Dataset],
    groups: list[list[ShardRef]],
    out: Path,
    spec: TokenizeSpec,
    encoder: AnyEncoder,
    dtype: str,
    overwrite: bool,
) -> tuple[list[ShardTask], list[StoreRecord | None]]:
    """Every shard's task and, where a finished store of it is there, its record (kept)."""
    tasks, kept = [], []
    for ds, refs in zip(datasets, groups, strict=True):
        folder = out / ds.name
        sweep_temporaries(folder)
        names = prefix_names([r.uri for r in refs], ds.name)
        for ref, name in zip(refs, names, strict=True):
            task = ShardTask(ref=ref, prefix=str(folder / name))
            expected = Expected(ref=ref, field=spec.field, tokenizer_fingerprint=encoder.fingerprint, dtype=dtype)
            tasks.append(task)
            kept.append(resume_state(Path(task.prefix), expected, overwrite=overwrite))
        ours = {f"{folder / n}{RECORD_SUFFIX}" for n in names}
        others = (
            sorted(str(p) for p in folder.rglob(f"*{RECORD_SUFFIX}") if str(p) not in ours) if folder.is_dir() else []
        )
        if others:
            warnings.warn(
                f"{folder} holds {len(others)} store(s) of shards not in dataset {ds.name!r} now (first: "
                f"{others[0]}) — they are left as they are; remove them if a reader of the folder should not see them",
                ZephonWarning,
                stacklevel=3,
            )
    return tasks, kept


def _write(
    todo: list[ShardTask],
    spec: TokenizeSpec,
    encoder: AnyEncoder,
    dtype: np.dtype,
    *,
    workers: int | None,
    engine: str,
    progress: bool | None,
) -> list[StoreRecord]:
    if not todo:
        return []
    total = sum(t.ref.rows for t in todo)
    with progress_bar(total=total, desc="tokenizing", unit="doc", progress=progress) as bar:
        tokens = 0

        def done(record: StoreRecord) -> None:
            nonlocal tokens
            tokens += record.tokens
            bar.set_postfix(tokens=f"{tokens:,}", refresh=False)

        if engine == "ray":
            from zephon.planner.tokenize.ray_tasks import tokenize_with_ray

            def ray_done(record: StoreRecord) -> None:
                done(record)
                bar.update(record.rows)

            return tokenize_with_ray(todo, spec, str(dtype), workers=workers, on_done=ray_done)
        n_workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
        if n_workers == 1:
            records = []
            for task in todo:
                records.append(write_shard_store(task, encoder, dtype, on_rows=bar.update))
                done(records[-1])
            return records
        return _run_workers(todo, spec, dtype, n_workers, bar.update, done)


def _run_workers(
    todo: list[ShardTask],
    spec: TokenizeSpec,
    dtype: np.dtype,
    n_workers: int,
    on_rows: Callable[[int], object],
    on_done: Callable[[StoreRecord], None],
) -> list[StoreRecord]:
    """Worker subprocesses, shards longest first to the least loaded one (a deterministic, balanced split)."""
    loads = [0] * n_workers
    jobs: list[list[dict]] = [[] for _ in range(n_workers)]
    for task in sorted(todo, key=lambda t: (-t.ref.bytes, t.ref.shard_id)):
        w = loads.index(min(loads))
        loads[w] += task.ref.bytes
        jobs[w].append(task_json(task))
    payloads = [{"tokenize": asdict(spec), "dtype": str(dtype), "tasks": tasks} for tasks in jobs]
    procs = start_workers("zephon.planner.tokenize.worker", payloads)
    records: list[StoreRecord] = []
    for message in worker_lines(procs):
        if "rows" in message:
            on_rows(message["rows"])
        else:
            records.append(StoreRecord(**message["record"]))
            on_done(records[-1])
    failures = []
    for proc in procs:
        assert proc.stderr is not None
        err = proc.stderr.read().strip()
        if proc.wait() != 0:
            failures.append(err.splitlines()[-1] if err else f"exit code {proc.returncode}")
    if failures:
        raise ZephonError(
            f"zephon tokenize must finish every shard, got a worker failure: {failures[0]} — fix it and run again "
            "(finished stores are kept)"
        )
    return records
