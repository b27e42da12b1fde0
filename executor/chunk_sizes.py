"""How many plan positions each chunk of an estimated plan reads: ``read_chunk``, or more where the plan's
documents are small.

Every chunk costs the same fixed work besides its documents — finding its rows, taking its texts, an engine
call, an append to each lane, waking threads (``zephon.executor.estimated``) — so a chunk of 1,024 documents of
~284 characters (the token plan of ``bench_hotpath.py``: 297,252 documents) paid it every ~290 K characters,
15-25 % more CPU than chunks of 4,096 (and about as much as chunks of 8,192).

So after its first chunk of ``read_chunk`` documents a run's chunks take more documents while the plan's own
size of them — a shard's bytes per row, the units the planner deals lanes by (``document_units``) — adds up to
at most ``CHUNK_UNITS``, up to ``GROW × read_chunk``
(``PlanBundle.chunks``). The sizes follow the plan alone: never the timing, and never which lanes a process
holds, so every DataLoader worker of a rank reads the same chunks as the rank without workers, and an error
reading one is raised after the same batches (``test_worker_errors.py``). A shard's bytes per row is an
average: a chunk of that shard's longest documents (a curriculum sorted by length) holds at most ``GROW`` times
what a chunk of ``read_chunk`` held.

Example: ``read_chunk`` 1,024, ``CHUNK_UNITS`` 256 Ki; the token plan's shards average 75.7 bytes a position
→ chunks of 3,463 positions; the samples plan's 1,351 → 194, so ``read_chunk``, 1,024; shards of 10 bytes a
row → 26,214, capped at ``GROW × 1,024`` = 4,096.
"""

from __future__ import annotations

#: A chunk after the first takes documents while their units (~a quarter of their characters for text in
#: Parquet: 1 Mi characters, the size of one engine call, ``zephon.executor.encode.slices.MAX_CHARS``) add up to
#: at most this many, but never more than ``GROW × read_chunk`` documents.
CHUNK_UNITS = 1 << 18
GROW = 4
