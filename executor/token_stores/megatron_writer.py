"""Writing a Megatron-Core indexed dataset: ``PREFIX.bin`` + ``PREFIX.idx``, byte for byte as megatron-core does.

Invariant: what :class:`MegatronWriter` commits is exactly what megatron-core's ``IndexedDatasetBuilder`` writes
for the same documents and dtype (``add_document(ids, [len(ids)])`` per document, then ``finalize``): the ``.bin``
is the ids end to end in ``dtype``; the ``.idx`` is (little-endian) magic ``MMIDIDX\\x00\\x00``, version u64 = 1,
the dtype code u8, S u64, D = S + 1 u64, lengths i32[S], byte pointers i64[S], document indices i64[D] =
``0, 1, ..., S`` — one sequence a document, no sequence modes. ``tests/executor/token_stores`` checks the writer
against the committed fixture megatron-core wrote, byte for byte.

dtype: Megatron's rule (``DType.optimal_dtype(tokenizer.vocab_size)`` in ``tools/preprocess_data.py``): uint16
when the vocabulary has fewer than 65 500 ids, else int32 (:func:`megatron_dtype`). Every id written is checked
against the dtype's range (and ≥ 0): an id it cannot hold is a one-line error, never a wrapped value.

All or nothing: the data and the index are written to temporaries beside the target
(``.NAME.bin.zephon-tmp-<pid>-<hex>``, ``.NAME.idx.zephon-tmp-...``: hidden, and ending neither in ``.bin`` nor
``.idx``, so no reader takes them for a store), and :meth:`MegatronWriter.commit` renames the ``.bin`` then the
``.idx`` into place. Whoever calls ``commit`` decides whether the targets may be replaced (``zephon tokenize``
claims them first, see :mod:`zephon.planner.tokenize.prefixes`); a failure or :meth:`discard` removes the
temporaries, a kill leaves them for :func:`sweep_temporaries`.

Worked example: documents ``[1, 17, 2]`` and ``[1, 2]`` in uint16 → ``.bin`` = 10 bytes (``01 00 11 00 02 00 01 00
02 00``); ``.idx`` = 34-byte header (S = 2, D = 3), lengths ``[3, 2]``, pointers ``[0, 6]``, document indices
``[0, 1, 2]``: 34 + 8 + 16 + 24 = 82 bytes.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from zephon.errors import DatasetError
from zephon.executor.token_stores.megatron import DTYPES, HEADER, MAGIC

__all__ = ["TEMPORARY_MARK", "MegatronWriter", "index_bytes", "megatron_dtype", "sweep_temporaries", "temporary_path"]

#: Megatron's bound: a vocabulary of fewer ids is stored as uint16, else int32.
UINT16_VOCABULARY = 65500
#: Part of every temporary's name; :func:`sweep_temporaries` removes only files carrying it.
TEMPORARY_MARK = ".zephon-tmp-"
_CODES = {np.dtype(t): code for code, t in DTYPES.items()}


def megatron_dtype(vocab_size: int) -> np.dtype:
    """The dtype Megatron's ``preprocess_data.py`` stores ids of a ``vocab_size`` vocabulary in."""
    return np.dtype(np.uint16 if vocab_size < UINT16_VOCABULARY else np.int32)


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The ``.idx`` of documents of ``lengths`` tokens (one sequence each), as ``_IndexWriter`` writes it."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and int(lengths.max()) > np.iinfo(np.int32).max:
        raise DatasetError(
            f"a Megatron document must have < 2^31 tokens (its length is an int32), got {int(lengths.max())} — "
            "split the document (tokenizer max_tokens with long_documents: split is refused; truncate it)"
        )
    count = len(lengths)
    pointers = np.zeros(count, dtype=np.int64)
    if count:
        np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    return b"".join(
        (
            MAGIC,
            struct.pack("<Q", 1),
            struct.pack("<B", _CODES[np.dtype(dtype)]),
            struct.pack("<Q", count),
            struct.pack("<Q", count + 1),
            lengths.astype("<i4").tobytes(),
            pointers.astype("<i8").tobytes(),
            np.arange(count + 1, dtype="<i8").tobytes(),
        )
    )


def temporary_path(target: Path) -> Path:
    """A hidden temporary beside ``target``: ``.NAME.zephon-tmp-<pid>-<hex>`` (swept by :func:`sweep_temporaries`)."""
    return target.with_name(f".{target.name}{TEMPORARY_MARK}{os.getpid()}-{os.urandom(4).hex()}")


class MegatronWriter:
    """Streams documents into the temporaries of ``PREFIX.bin``/``PREFIX.idx``; :meth:`commit` renames them.

    ``add(ids, sizes)`` appends documents: ``ids`` every document's ids end to end (any integer dtype),
    ``sizes`` how many each has. Use it as a context manager: leaving the block by an error discards the
    temporaries (a committed writer has none left).
    """

    def __init__(self, prefix: Path, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in _CODES or self.dtype.kind not in "iu":
            raise DatasetError(f"a Megatron store's dtype must be an integer dtype it has a code for, got {dtype}")
        self.prefix = Path(prefix)
        self.bin_path, self.idx_path = (
            self.prefix.with_name(self.prefix.name + ".bin"),
            self.prefix.with_name(self.prefix.name + ".idx"),
        )
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self.bin_tmp, self.idx_tmp = temporary_path(self.bin_path), temporary_path(self.idx_path)
        self._lengths: list[np.ndarray] = []
        self._file = open(self.bin_tmp, "wb")  # noqa: SIM115 — closed by finish() or discard()
        self._limits = np.iinfo(self.dtype)
        self.documents = 0
        self.tokens = 0

    def __enter__(self) -> MegatronWriter:
        return self

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        if kind is not None:
            self.discard()

    def add(self, ids: np.ndarray, sizes: np.ndarray, *, where: str = "") -> None:
        """Append the documents whose ids are ``ids`` (end to end) and whose token counts are ``sizes``."""
        ids, sizes = np.asarray(ids), np.asarray(sizes, dtype=np.int64)
        if int(sizes.sum()) != len(ids):
            raise DatasetError(f"document sizes must add up to the ids given, got {int(sizes.sum())} ≠ {len(ids)}")
        if len(ids):
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high > self._limits.max:  # ids are ≥ 0, whatever the dtype could hold
                bad = low if low < 0 else high
                raise DatasetError(
                    f"{where or self.bin_path} must hold ids from 0 that fit {self.dtype} (the dtype Megatron's rule "
                    f"picks for the tokenizer's vocabulary), got id {bad} — the tokenizer's vocabulary size is wrong; "
                    "fix its tokenizer.json"
                )
        self._file.write(ids.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self._lengths.append(sizes)
        self.documents += len(sizes)
        self.tokens += len(ids)

    def finish(self) -> bytes:
        """Close the data temporary and write the index temporary; returns the index's bytes."""
        self._file.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.empty(0, np.int64)
        index = index_bytes(lengths, self.dtype)
        size = os.path.getsize(self.bin_tmp)
        if size != self.tokens * self.dtype.itemsize or len(index) != HEADER + 20 * self.documents + 8:
            raise DatasetError(
                f"{self.bin_tmp} must be {self.tokens * self.dtype.itemsize} bytes after writing, got {size} — the "
                "disk changed it while written; write it again"
            )
        self.idx_tmp.write_bytes(index)
        return index

    def commit(self) -> None:
        """Rename the data, then the index, into place (after :meth:`finish`)."""
        os.replace(self.bin_tmp, self.bin_path)
        os.replace(self.idx_tmp, self.idx_path)

    def discard(self) -> None:
        """Close and remove the temporaries (errors ignored: a leftover is :func:`sweep_temporaries`' to remove)."""
        self._file.close()
        for tmp in (self.bin_tmp, self.idx_tmp):
            tmp.unlink(missing_ok=True)


def sweep_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries :class:`MegatronWriter`\\ s left under ``folder`` (killed writers); only files
    named ``.NAME.bin.zephon-tmp-*`` / ``.NAME.idx.zephon-tmp-*`` (and the record's, ``.NAME.json.zephon-tmp-*``)
    are touched. Call it only while no writer of ``folder`` runs (``zephon tokenize`` holds its lock)."""
    removed = []
    if not folder.is_dir():
        return removed
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            if name.startswith(".") and TEMPORARY_MARK in name:
                path = Path(root) / name
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
