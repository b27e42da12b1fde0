"""A count-pass worker process: ``python -m zephon.planner.counts.worker`` reads its tasks as JSON on stdin.

Workers are plain subprocesses rather than multiprocessing children, so planning from a user's script never
re-imports that script (no ``if __name__ == "__main__"`` guard is needed) and no thread pool is forked.
Each finished shard is reported as one JSON line on stdout: ``{"shard_id": 3, "tokens": 123456}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from zephon.errors import ZephonError
from zephon.executor.encode.encoders import AnyEncoder, converter_of, make_encoder
from zephon.executor.encode.text import encode_on_one_thread
from zephon.executor.engines.at_document import AtDocument
from zephon.executor.read.shard_reader import ShardReader, planning_cache
from zephon.plan.records import ShardRef
from zephon.specs import TokenizeSpec
from zephon.storage.files import write_atomic


def count_shard(ref: ShardRef, field: str, encoder: AnyEncoder, *, split: bool = True) -> np.ndarray:
    """Tokens (with BOS/EOS) of every row of one shard, int32: ``lengths`` of each batch the reader yields, no
    ids kept (chat records rendered by the same converter). ``split=False``: on this thread alone (one shard per
    thread). A record a user operator dropped (None) has 0 tokens: it is in no sequence."""
    reader = ShardReader([ref], field, capacity=1, cache=planning_cache(), convert=converter_of(encoder))
    parts = []
    first = 0  # the shard's row of the batch's first value
    for values in reader.iter_shard(ref.shard_id):
        kept = [i for i, v in enumerate(values) if v is not None]
        counts = np.zeros(len(values), np.int32)
        try:
            if kept:
                counts[kept] = encoder.lengths([values[i] for i in kept], split=split)
        except AtDocument as exc:  # the spot check or a lone surrogate: name the document
            raise exc.located(ref, first + kept[exc.index]) from None
        parts.append(counts)
        first += len(values)
    return np.concatenate(parts) if parts else np.empty(0, np.int32)


def save_atomic(path: Path, array: np.ndarray) -> None:
    """Write a per-shard array all or nothing (temporary + rename): a killed or failed count leaves no partial
    array, so a rerun counts exactly the shards without one. A full or read-only disk is a ``StorageError``."""
    write_atomic(path, lambda tmp: np.save(tmp, array), "the token-count cache")


def main() -> None:
    job = json.load(sys.stdin)
    if job.get("single_thread"):
        encode_on_one_thread()
    try:
        encoder = make_encoder(TokenizeSpec(**job["tokenize"]), threads=1 if job.get("single_thread") else None)
        for task in job["tasks"]:
            ref = ShardRef(**task["ref"])
            counts = count_shard(ref, job["tokenize"]["field"], encoder)
            save_atomic(Path(task["out"]), counts)
            print(json.dumps({"shard_id": ref.shard_id, "tokens": int(counts.sum())}), flush=True)
    except ZephonError as exc:  # one line on stderr: the parent reports it as the count pass's error
        print(str(exc), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
