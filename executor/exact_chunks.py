"""An exact run's microbatches built a chunk at a time and handed out one by one.

A rank hands out its microbatches in running order (``zephon.executor.progress``); a DataLoader worker builds
only its share of them (``zephon.executor.worker_share``). ``exact_microbatches`` looks ahead from the progress
to the next ``chunk`` microbatches of the share, builds all their rows in one call
(``ExactSequences.rows_many``: one lookup of their pieces in samples.parquet, one fetch of their documents, one
token buffer, ``zephon.executor.pack.exact_rows``) and hands them out one at a time, moving the progress past
each microbatch only as it is handed out — a state taken between two batches is what it was when every
microbatch was built alone. The fixed cost of finding, fetching and cutting (~0.4 ms a call) is paid once a
chunk instead of once a microbatch.

The first chunk is one microbatch (the first batch comes as soon as it alone is ready), then ``chunk_size``: at
most ``MAX_CHUNK`` microbatches and ``CHUNK_TOKENS`` tokens (a 4 MB buffer of int32 ids), so a chunk's documents stay
within the document cache's read-ahead (``zephon.executor.exact``). Each chunk has its own buffers, never reused:
a batch the trainer keeps is never overwritten (its arrays are views of its chunk's). With a remote shard cache
each microbatch is its own chunk, announced to the cache before it is read (``RemoteAccess.advance``).

Invariant: the batches, their order and the progress at each are those of building each microbatch alone
(tests/executor/test_exact_chunks.py). A chunk whose building raises is built again one microbatch at a time, as
without chunks: the microbatches before the failing one are handed out, then the same error is raised.

Example: B = 8, W = 2049, one rank, no workers: chunk_size = min(64, 2²⁰ // (8 · 2049)) = 63 — microbatch 0
alone, then microbatches 1-63 from one call (504 sequences: two binary searches, one fetch, and, their rows
following each other in the cache, one copy), handed out as 63 batches; then 64-126, and so on.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from zephon.executor.exact import ExactSequences
from zephon.executor.geometry import Geometry
from zephon.executor.pack.rows import PackedRows
from zephon.executor.progress import MicrobatchAt, Progress
from zephon.executor.read.remote import RemoteAccess
from zephon.executor.worker_share import WorkerShare

#: The most microbatches, and tokens, built together.
MAX_CHUNK, CHUNK_TOKENS = 64, 1 << 20

Built = tuple[MicrobatchAt, np.ndarray, PackedRows | None, np.ndarray | None]


def chunk_size(rows: int, width: int) -> int:
    """Microbatches of ``rows`` rows of ``width`` tokens built together."""
    return max(1, min(MAX_CHUNK, CHUNK_TOKENS // max(1, rows * width)))


def exact_microbatches(
    sequences: ExactSequences,
    progress: Progress,
    share: WorkerShare,
    geometry: Geometry,
    *,
    steps: int,
    remote: RemoteAccess,
) -> Iterator[Built]:
    """This worker's microbatches from ``progress`` to the end of ``steps``: ``(at, ids, rows, datasets)`` each,
    ``rows`` None when every sequence ``ids`` is past the plan (then ``datasets`` is None too)."""
    end, n, a = steps * geometry.accumulation, sequences.num_sequences, geometry.accumulation
    most = 1 if remote.cache is not None else chunk_size(geometry.microbatch, sequences.max_length)

    def chunk_from(scanned: int, size: int) -> tuple[list[tuple[int, np.ndarray, np.ndarray]], int]:
        """This worker's next ``size`` microbatches from running number ``scanned`` on (running number, sequences,
        those in the plan), and the running number after the last one scanned."""
        owned: list[tuple[int, np.ndarray, np.ndarray]] = []
        while scanned < end and len(owned) < size:
            piece = share.rows(scanned)
            if piece is not None:
                ids = geometry.microbatch_sequences(*divmod(scanned, a))[piece[0] : piece[1]]
                owned.append((scanned, ids, ids[ids < n]))
            scanned += 1
        return owned, scanned

    owned, scanned = chunk_from(progress.running, 1)
    while progress.running < end:
        after, next_scanned = chunk_from(scanned, most)  # the next chunk: its sequences are read ahead
        upcoming = [real for _, _, real in after if len(real)]
        hint = np.concatenate(upcoming) if upcoming else None
        reals = [real for _, _, real in owned if len(real)]
        built: Iterator[tuple[PackedRows, np.ndarray]] | None = None
        if len(reals) > 1:
            try:
                built = iter(sequences.rows_many(reals, upcoming=hint))
            except Exception:  # built again one microbatch at a time below: the error comes where it belongs
                built = None
        for running, ids, real in owned:
            while progress.running < running:  # other workers' microbatches
                progress.advance()
            rows: PackedRows | None = None
            datasets: np.ndarray | None = None
            if len(real) and built is not None:
                rows, datasets = next(built)
            elif len(real):
                if remote.cache is not None:
                    pieces = sequences.pieces(int(real[0]))
                    remote.advance(pieces[0].position if pieces else 0)
                rows, datasets = sequences.rows_many([real], upcoming=hint if len(owned) == 1 else None)[0]
            at = progress.advance()  # after its rows are built: an error reading them leaves it not handed out
            yield at, ids, rows, datasets
        while progress.running < scanned:
            progress.advance()
        owned, scanned = after, next_scanned
