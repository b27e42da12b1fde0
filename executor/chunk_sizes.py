"""How many plan positions each chunk of an estimated plan reads (``ChunkSizer``): ``read_chunk``, or more
where a rank's texts are short.

Every chunk costs the same fixed work besides its documents — finding its rows, taking its texts, an engine
call, an append to each lane, waking threads (``zephon.executor.estimated``) — so a chunk of 1,024 documents of
~284 characters (the token plan of ``bench_hotpath.py``: 297,252 documents) paid it every ~290 K characters,
15-25 % more CPU than chunks of 4,096.
"""

from __future__ import annotations

#: A chunk of short texts reads more documents: enough for this many characters kept (the size of one engine call,
#: ``zephon.executor.encode.slices.MAX_CHARS``), but at most ``GROW × read_chunk`` documents.
CHUNK_CHARS = 1 << 20
GROW = 8


class ChunkSizer:
    """How many plan positions the next chunk reads: ``read_chunk``, or more while this rank's documents are
    short — enough for ``CHUNK_CHARS`` characters of the texts it keeps, at the average so far, but at most
    ``GROW × read_chunk`` documents kept (and never fewer positions than ``read_chunk``). Chunk sizes change speed
    only, never the data (the stages' invariant), and follow the texts alone, never the timing.

    Example: ``read_chunk`` 1,024, one rank of 8 (it keeps 1 position in 8), texts of 300 characters (37.5 a
    position): 1 Mi characters a chunk is 27,962 positions, 3,495 documents kept; with texts of 30 characters,
    279,620 positions would hold 34,952 documents: capped at ``GROW × 1,024`` = 8,192 kept, 65,536 positions;
    a rank alone (it keeps every position) with texts of 6,000 characters: 174 positions, so ``read_chunk``, 1,024.
    """

    def __init__(self, read_chunk: int) -> None:
        self.read_chunk = read_chunk
        self.positions = 0  # plan positions read so far
        self.kept = 0  # documents of them with a text this rank tokenizes
        self.chars = 0  # characters of those texts

    def add(self, positions: int, texts: list) -> None:
        """Count a chunk: ``positions`` plan positions read, ``texts`` the texts kept of them (a token store's
        documents, which are ids, count as kept without characters)."""
        self.positions += positions
        self.kept += len(texts)
        self.chars += sum(map(len, texts)) if texts and isinstance(texts[0], str) else 0

    def __call__(self) -> int:
        if not self.chars:
            return self.read_chunk
        by_chars = CHUNK_CHARS * self.positions // self.chars
        by_documents = GROW * self.read_chunk * self.positions // self.kept
        return max(self.read_chunk, min(by_chars, by_documents))
