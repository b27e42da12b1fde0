"""What moving one microbatch from a DataLoader worker costs the loader's process, int64 against int32 ids.

Run: python benchmarks/bench_worker_handover.py

A forked child builds ``to_training(return_labels=True, return_attention_mask=True)`` of an 8 × 2049 batch and
sends ``WorkerPiece``s through a pipe, as a DataLoader worker does (``zephon.torch_loader``): with int64 ids
(what ``Pipeline.dataloader`` hands over), or with ``input_ids``/``labels`` as int32 — half their bytes — that
the parent widens back to int64 as it makes the tensors (what narrowing the hand-over would cost). The parent
counts its own thread CPU time to receive, unpickle and make the tensors, 400 pieces a run, the two kinds
alternated for 4 rounds. Prints each run's µs per microbatch and the best.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import torch


def child(conn, narrow, n):
    from zephon.executor.batch import Batch
    from zephon.loader_pieces import WorkerPiece

    tokens = np.random.default_rng(0).integers(0, 128000, size=(8, 2049)).astype(np.int32)
    batch = Batch(tokens=tokens, doc_start=np.zeros((8, 2049), bool), lengths=np.full(8, 2049))
    for _ in range(n):
        ids = torch.int32 if narrow else torch.int64
        tr = batch.to_training(return_labels=True, return_attention_mask=True, ids_dtype=ids)
        conn.send(WorkerPiece.of(tr, step=0, microbatch=0, state={}))
    conn.close()


def main_side(narrow, n=400):
    a, b = mp.Pipe(duplex=False)
    p = mp.get_context("fork").Process(target=child, args=(b, narrow, n))
    p.start()
    t = time.thread_time()
    for _ in range(n):
        tensors = a.recv().tensors()
        if narrow:  # widened back, once per tensor
            for key in ("input_ids", "labels"):
                tensors[key] = torch.empty(tensors[key].shape, dtype=torch.int64).copy_(tensors[key])
    dt = (time.thread_time() - t) / n
    p.join()
    return dt


if __name__ == "__main__":
    import zephon.torch_loader  # noqa: F401  (imported before forking, as in a DataLoader)

    res = {False: [], True: []}
    for _ in range(4):
        for narrow in (False, True):
            res[narrow].append(main_side(narrow))
    for k, v in res.items():
        runs = " ".join(f"{x * 1e6:.0f}" for x in v)
        print(
            f"int32 ids={k}: loader CPU per microbatch (receive, unpickle, tensors) {runs} µs; best {min(v) * 1e6:.0f}"
        )
    print("load", os.getloadavg())
