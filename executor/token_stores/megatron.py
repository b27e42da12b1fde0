"""Megatron-Core indexed datasets: ``PREFIX.idx`` + ``PREFIX.bin``, read natively (no megatron-core).

The ``.idx`` (megatron/core/datasets/indexed_dataset.py, ``_IndexWriter``), little-endian::

    magic b"MMIDIDX\\x00\\x00" (9) | version u64 = 1 | dtype code u8 | S = sequences u64 | D u64
    | sequence lengths i32[S] | sequence pointers i64[S] (bytes into .bin) | document indices i64[D]
    | (multimodal stores only) sequence modes i8[S]

dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16 (floats are refused).
The document indices start at 0 and end at S: document ``i`` is sequences ``doc[i] .. doc[i+1]-1`` (one
sequence a document, or several when ``preprocess_data.py --split-sentences`` wrote sentences), so there are
``D - 1`` documents. The ``.bin`` is the sequences' ids end to end; the pointers are their cumulative byte
offsets, so a run of documents is one contiguous byte range.

What is read when: opening reads the whole ``.idx`` (one GET remotely; a memory map locally) and the ``.bin``'s
size only; ``read(a, b)`` reads the ``.bin`` bytes of documents ``a .. b-1`` (one range). EOS: a store written
with ``--append-eod`` already ends each document with EOS; it is read as it is, never doubled or dropped.

Worked example: lengths ``[4, 3, 3, 3]``, document indices ``[0, 1, 2, 4]``, uint16 → three documents of 4, 3
and 6 tokens; ``read(1, 3)`` reads ``.bin`` bytes 8..26 (9 ids).
"""

from __future__ import annotations

import numpy as np

from zephon.errors import DatasetError
from zephon.executor.token_stores.files import Blob, StoreFiles
from zephon.executor.token_stores.store import EndToEndPart

__all__ = ["MAGIC", "MegatronPart", "megatron_parts"]

MAGIC = b"MMIDIDX\x00\x00"
HEADER = 34
DTYPES: dict[int, type[np.number]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_FIX = "rebuild it with Megatron's tools/preprocess_data.py"


class MegatronPart(EndToEndPart):
    """One ``PREFIX.idx`` + ``PREFIX.bin`` pair (see the module docstring)."""

    def __init__(self, idx: Blob, bin: Blob, prefix: str) -> None:
        self.name, self.tokens_file = bin.name, bin
        if idx.size < HEADER:
            raise DatasetError(
                f"{idx.name} must be a Megatron index of at least {HEADER} bytes, got {idx.size} — it is truncated; "
                f"{_FIX}"
            )
        raw = np.frombuffer(idx.read(0, idx.size), dtype=np.uint8)
        head = raw[:HEADER].tobytes()
        if head[:9] != MAGIC:
            raise DatasetError(
                f"{idx.name} must start with the Megatron index magic {MAGIC!r}, got {head[:9]!r} — it is not a "
                f"Megatron .idx file; {_FIX}"
            )
        version = int.from_bytes(head[9:17], "little")
        if version != 1:
            raise DatasetError(f"{idx.name} must be a Megatron index of version 1, got version {version} — {_FIX}")
        code = head[17]
        if code not in DTYPES or DTYPES[code] in (np.float32, np.float64):
            known = ", ".join(f"{c} {DTYPES[c].__name__}" for c in sorted(DTYPES) if c not in (6, 7))
            raise DatasetError(
                f"{idx.name} must name an integer dtype code ({known}), got code {code} — the index is damaged; {_FIX}"
            )
        self.dtype = np.dtype(DTYPES[code])
        seqs, docs = int.from_bytes(head[18:26], "little"), int.from_bytes(head[26:34], "little")
        need = HEADER + 12 * seqs + 8 * docs
        if docs < 1:  # a document index always holds 0 (Megatron writes [0, …, sequences])
            raise DatasetError(
                f"{idx.name} must hold at least one document index (0), got none — it is damaged or not written by "
                f"Megatron; {_FIX}"
            )
        if idx.size not in (need, need + seqs):
            raise DatasetError(
                f"{idx.name} must be {need} bytes for its {seqs} sequences and {docs} document indices, got "
                f"{idx.size} — it is truncated or damaged; {_FIX}"
            )
        lengths = raw[HEADER : HEADER + 4 * seqs].view("<i4").astype(np.int64)
        pointers = raw[HEADER + 4 * seqs : HEADER + 12 * seqs].view("<i8")
        doc_index = raw[HEADER + 12 * seqs : need].view("<i8")
        if (lengths < 0).any():
            raise DatasetError(f"{idx.name} must hold sequence lengths ≥ 0, got {int(lengths.min())} — {_FIX}")
        if doc_index[0] != 0 or doc_index[-1] != seqs or (np.diff(doc_index) < 0).any():
            raise DatasetError(
                f"{idx.name} must hold document indices rising from 0 to its {seqs} sequences, got "
                f"{doc_index[:1].tolist()}..{doc_index[-1:].tolist()} — {_FIX}"
            )
        ends = np.cumsum(lengths) * self.dtype.itemsize
        starts = ends - lengths * self.dtype.itemsize
        if seqs and not np.array_equal(pointers, starts):
            bad = int(np.flatnonzero(pointers != starts)[0])
            where = "past the end of the data" if pointers[bad] >= (ends[-1] if seqs else 0) else "out of place"
            raise DatasetError(
                f"{idx.name} must point sequence {bad} at byte {int(starts[bad])} of {bin.name}, got "
                f"{int(pointers[bad])} "
                f"({where}) — the index is damaged; {_FIX}"
            )
        total = int(ends[-1]) if seqs else 0
        if bin.size != total:
            shorter = "shorter" if bin.size < total else "longer"
            raise DatasetError(
                f"{bin.name} must be {total} bytes as {idx.name} says, got {bin.size} ({shorter}) — the data file is "
                f"{'truncated' if bin.size < total else 'not the one this index was written with'}; copy the pair "
                "again or rebuild it"
            )
        cumulative = np.concatenate([[0], np.cumsum(lengths)])
        #: Token offset of each document's first id in the ``.bin``, and one past the last.
        self.doc_starts = cumulative[doc_index]
        self.prefix = prefix


def megatron_prefixes(files: StoreFiles) -> list[str]:
    """The suffixes of every ``PREFIX`` with both ``.idx`` and ``.bin`` (``""`` for the path itself), sorted."""
    return [s[: -len(".idx")] for s in files.suffixes(".idx") if s[: -len(".idx")] + ".bin" in files.files]


def megatron_parts(files: StoreFiles) -> list[MegatronPart]:
    """One part per ``.idx``/``.bin`` pair: the path's own pair, else every pair under the folder it names."""
    prefixes = [""] if ".idx" in files.files or ".bin" in files.files else megatron_prefixes(files)
    if not prefixes:
        raise DatasetError(
            f"token store {files.path!r} must be a Megatron PREFIX with PREFIX.idx and PREFIX.bin (or a folder of "
            "them), got neither — pass the prefix without .idx/.bin"
        )
    parts = []
    for p in prefixes:
        what = "its index" if p == "" else "the index"
        idx = files.need(p + ".idx", what, "copy the .idx beside the .bin")
        bin_ = files.need(p + ".bin", "its data file", "copy the .bin beside the .idx")
        parts.append(MegatronPart(idx, bin_, files.path + p))
    dtypes = {part.dtype for part in parts}
    if len(dtypes) > 1:
        raise DatasetError(
            f"token store {files.path!r} must hold one dtype, got {sorted(str(d) for d in dtypes)} across its "
            f"files — a store mixes tokenizations; open its files as separate stores"
        )
    return parts
