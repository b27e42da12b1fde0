"""datatrove token files: ``NAME.ds`` + ``NAME.ds.index`` (+ ``.ds.metadata``, ``.ds.loss``), read natively.

Layout (datatrove/pipeline/tokens/tokenizer.py, ``TokenizedFile``), little-endian:

* ``NAME.ds`` — the documents' ids end to end, ``token_size`` bytes each: 2 → uint16, 4 → uint32;
* ``NAME.ds.index`` — uint64 per document: its *end*, in tokens, counted from the file's start (cumulative);
* ``NAME.ds.metadata`` — text: ``TOKENIZER|TOKEN_SIZE`` on the first line, then the token count (a tokenizer
  datatrove did not know is written ``Unknown Tokenizer|2``, read here as no tokenizer);
* ``NAME.ds.loss`` (optional) — one byte (bool) per token: 1 where the token carries loss.

What is read when: opening reads the metadata and the index (one GET each remotely); ``read(a, b)`` reads the
``.ds`` bytes of documents ``a .. b-1`` (one range), and the same span of ``.ds.loss`` when there is one. The
tokenizer named in the metadata is the store's ``tokenizer``. EOS: datatrove appends EOS only when its
tokenizer step was given ``eos_token``; the ids are read as they are.

Worked example: index ``[4, 7, 13]``, metadata ``gpt2|2`` → three uint16 documents of 4, 3 and 6 tokens, made
with ``gpt2``; ``read(1, 3)`` reads ``.ds`` bytes 8..26.
"""

from __future__ import annotations

import numpy as np

from zephon.errors import DatasetError
from zephon.executor.token_stores.files import Blob, StoreFiles
from zephon.executor.token_stores.store import EndToEndPart

__all__ = ["DatatrovePart", "datatrove_parts", "read_metadata"]

SIZES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
_FIX = "write it again with datatrove's DocumentTokenizer"


def read_metadata(blob: Blob) -> tuple[str | None, np.dtype, int | None]:
    """``(tokenizer or None, dtype, token count or None)`` from a ``.ds.metadata`` file (the count: its second
    line, as datatrove writes it; None where there is none)."""
    text = bytes(blob.read(0, blob.size)).decode("utf-8", errors="replace")
    lines = text.splitlines()
    first = lines[0] if lines else ""
    name, _, size = first.rpartition("|")
    if not (size.strip().isascii() and size.strip().isdigit()) or int(size) not in SIZES:
        raise DatasetError(
            f"{blob.name} must start with TOKENIZER|TOKEN_SIZE (token size 2 or 4), got {first[:80]!r} — {_FIX}"
        )
    second = lines[1].strip() if len(lines) > 1 else ""
    count = int(second) if second.isascii() and second.isdigit() else None
    return (None if name.startswith("Unknown Tokenizer") or not name else name), SIZES[int(size)], count


class DatatrovePart(EndToEndPart):
    """One ``.ds`` file with its index (see the module docstring)."""

    def __init__(self, files: StoreFiles, stem: str, dtype: np.dtype | None) -> None:
        data = files.need(stem, "its token file", _FIX)
        index = files.need(stem + ".index", "its document index", "write it with save_index=True (the default)")
        meta = files.get(stem + ".metadata")
        self.tokenizer: str | None = None
        self._counted: int | None = None  # the metadata's token count
        if meta is not None:
            self.tokenizer, found, self._counted = read_metadata(meta)
            if dtype is not None and np.dtype(dtype) != found:
                raise DatasetError(
                    f"dtype of {data.name} must be {found} as {meta.name} says, got dtype={np.dtype(dtype)} — drop "
                    "dtype= (the metadata says it)"
                )
            dtype = found
        if dtype is None:
            raise DatasetError(
                f"{data.name} must come with {data.name}.metadata or a dtype, got neither — pass dtype='uint16' "
                "(token size 2) or dtype='uint32' (token size 4)"
            )
        self.name, self.dtype, self.tokens_file = data.name, np.dtype(dtype), data
        if data.size % self.dtype.itemsize:
            raise DatasetError(
                f"{data.name} must be a whole number of {self.dtype.itemsize}-byte tokens, got {data.size} bytes — it "
                f"is truncated; {_FIX}"
            )
        if index.size % 8:
            raise DatasetError(f"{index.name} must be uint64 document ends, got {index.size} bytes — it is truncated")
        ends = np.frombuffer(index.read(0, index.size), dtype="<u8").astype(np.int64)
        total = data.size // self.dtype.itemsize
        falls = np.flatnonzero(np.diff(ends) < 0)
        if len(falls) or (len(ends) and ends[0] < 0):
            at = int(falls[0]) + 1 if len(falls) else 0
            raise DatasetError(
                f"{index.name} must hold document ends rising from 0, got {int(ends[at])} after "
                f"{int(ends[at - 1]) if at else 0} at document {at} — the index is damaged; copy it again"
            )
        if (ends[-1] if len(ends) else 0) != total:
            last = int(ends[-1]) if len(ends) else 0
            raise DatasetError(
                f"{index.name} must end its last document at the {total} tokens of {data.name}, got {last} — the "
                "index and the data file disagree (truncated copy?); copy both again"
            )
        if meta is not None and self._counted is not None and self._counted != total:
            raise DatasetError(
                f"{meta.name} must count the {total} tokens of {data.name}, got {self._counted} — the metadata and "
                f"the data disagree (a file of another run, or a truncated copy); copy them again or {_FIX}"
            )
        self.doc_starts = np.concatenate([[0], ends])
        self._loss = files.get(stem + ".loss")
        if self._loss is not None and self._loss.size != total:
            raise DatasetError(
                f"{self._loss.name} must hold one byte per token ({total}), got {self._loss.size} — copy it again"
            )

    @property
    def has_loss(self) -> bool:
        """Whether the part keeps a loss mask (its ``.ds.loss``)."""
        return self._loss is not None

    def read_loss(self, start: int, stop: int) -> np.ndarray | None:
        if self._loss is None:
            return None
        lo, hi = int(self.doc_starts[start]), int(self.doc_starts[stop])
        return np.frombuffer(self._loss.read(lo, hi), dtype=np.uint8).astype(bool)


def datatrove_parts(files: StoreFiles, dtype: np.dtype | None) -> list[DatatrovePart]:
    """The path's ``.ds`` file, else every ``.ds`` under the folder it names (sorted by path)."""
    stems = [""] if "" in files.files and files.path.endswith(".ds") else files.suffixes(".ds")
    if not stems:
        raise DatasetError(
            f"token store {files.path!r} must be a datatrove .ds file or a folder of them, got none — fix the path"
        )
    parts = [DatatrovePart(files, stem, dtype) for stem in stems]
    found = {(p.tokenizer, p.dtype) for p in parts}
    if len(found) > 1:
        raise DatasetError(
            f"token store {files.path!r} must hold one tokenizer and token size, got "
            f"{sorted((str(t), str(d)) for t, d in found)} — its files were tokenized differently; open them as "
            "separate stores"
        )
    return parts
