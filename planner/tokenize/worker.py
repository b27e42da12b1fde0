"""A ``zephon tokenize`` worker process: ``python -m zephon.planner.tokenize.worker`` reads its job as JSON on stdin.

Plain subprocesses, as the count pass's (``zephon.planner.counts.worker``): a user's script is never imported
again and no thread pool is forked. The job: ``{"tokenize": TokenizeSpec fields, "dtype": "uint16", "tasks":
[{"ref": ShardRef fields, "prefix": "..."}]}``; each encodes on one thread. Reported on stdout, one JSON line
each: ``{"rows": 4096}`` after every batch (the progress bar), ``{"record": {...}}`` after every shard. A
``ZephonError`` is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from zephon.errors import ZephonError
from zephon.executor.encode.encoders import make_encoder
from zephon.executor.encode.text import encode_on_one_thread
from zephon.plan.records import ShardRef
from zephon.planner.tokenize.shard import ShardTask, write_shard_store
from zephon.specs import TokenizeSpec


def task_json(task: ShardTask) -> dict:
    from dataclasses import asdict

    return {"ref": asdict(task.ref), "prefix": task.prefix}


def main() -> None:
    job = json.load(sys.stdin)
    encode_on_one_thread()
    try:
        encoder = make_encoder(TokenizeSpec(**job["tokenize"]), threads=1)
        dtype = np.dtype(job["dtype"])

        def rows(n: int) -> None:
            print(json.dumps({"rows": n}), flush=True)

        for item in job["tasks"]:
            task = ShardTask(ref=ShardRef(**item["ref"]), prefix=item["prefix"])
            record = write_shard_store(task, encoder, dtype, split=False, on_rows=rows)
            print(json.dumps({"record": record.to_dict()}), flush=True)
    except ZephonError as exc:  # one line on stderr: the parent reports it as the run's error
        print(str(exc).replace("\n", " "), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
