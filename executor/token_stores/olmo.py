"""OLMo/Dolma numpy token files: headerless memory maps of one dtype, with an optional ``start,end`` sidecar.

Layout (allenai/OLMo-core ``olmo_core/data/utils.py``; written by the Dolma toolkit's ``dolma tokens``):

* ``NAME.npy`` — the ids end to end, no header (despite the name), in a dtype the file does not record: pass
  ``dtype=`` (OLMo's are uint16 for vocabularies < 65 536, else uint32). A file that does start with a NumPy
  header (``\\x93NUMPY``, written by ``np.save``) is read past its header, in the header's dtype.
* ``NAME.csv.gz`` (optional) — gzip CSV, one row per document: ``start,end[,id,source,...]`` in tokens, end
  exclusive (OLMo-core's ``write_document_indices``; Dolma adds more columns, ignored here).

Without the sidecar the documents are found as OLMo-core does, by the EOS id (``eos_token_id=``, required): a
document ends with each EOS; or, with ``bos_token_id=`` too, only at an EOS followed by BOS (stores whose
documents hold EOS inside them). Ids after the last boundary form a last document (nothing is dropped). EOS and
BOS stay in the documents as stored, never doubled or dropped.

What is read when: opening reads the sidecar (one GET) or, without it, the whole token file once to find the
boundaries (say so in plans: this is the one format where counting reads the tokens); ``read(a, b)`` reads the
documents' byte range (one range; documents of a sidecar with gaps between them are cut out of it).

Worked example: uint16 ids ``[1, 5, 2, 1, 7, 7, 2, 9]`` with ``eos_token_id=2`` → documents ``[1, 5, 2]``,
``[1, 7, 7, 2]``, ``[9]``; with the sidecar ``0,3`` / ``3,7`` → the first two only.
"""

from __future__ import annotations

import gzip
import io

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from zephon.errors import DatasetError
from zephon.executor.token_stores.files import Blob, StoreFiles

__all__ = ["OlmoPart", "olmo_parts"]

NUMPY_MAGIC = b"\x93NUMPY"


def _numpy_header(blob: Blob) -> tuple[int, np.dtype] | None:
    """``(data offset, dtype)`` of a file written by ``np.save``, else ``None``."""
    if blob.size < 10 or bytes(blob.read(0, 6)) != NUMPY_MAGIC:
        return None
    head = bytes(blob.read(0, min(blob.size, 1 << 16)))
    stream = io.BytesIO(head)
    version = np.lib.format.read_magic(stream)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(stream)
    if len(shape) != 1 or fortran:
        raise DatasetError(f"{blob.name} must hold a 1-D array of token ids, got shape {shape} — write it 1-D")
    return stream.tell(), np.dtype(dtype)


class OlmoPart:
    """One numpy token file (see the module docstring)."""

    def __init__(
        self, data: Blob, sidecar: Blob | None, dtype: np.dtype | None, eos: int | None, bos: int | None
    ) -> None:
        self.name, self._data = data.name, data
        header = _numpy_header(data)
        self._offset = 0
        if header is not None:
            self._offset, found = header
            if found.kind not in "iu":
                raise DatasetError(
                    f"{data.name} must hold integer token ids, got a {found} array — save the ids as integers "
                    "(ids.astype(np.uint32)), or a headerless file of them"
                )
            if dtype is not None and np.dtype(dtype) != found:
                raise DatasetError(f"dtype of {data.name} must be {found} as its header says, got {np.dtype(dtype)}")
            dtype = found
        if dtype is None:
            raise DatasetError(
                f"{data.name} must be read with the dtype it was written in, got none — pass dtype='uint32' (or "
                "'uint16' for vocabularies under 65 536); OLMo/Dolma numpy files do not record it"
            )
        self.dtype = np.dtype(dtype)
        body = data.size - self._offset
        if body % self.dtype.itemsize:
            raise DatasetError(
                f"{data.name} must be a whole number of {self.dtype} ids ({self.dtype.itemsize} bytes each), got "
                f"{body} bytes — the dtype is wrong or the file is truncated; pass the dtype it was written in"
            )
        total = body // self.dtype.itemsize
        if sidecar is not None:
            self.starts, self.ends = _read_sidecar(sidecar, total)
        else:
            if eos is None:
                raise DatasetError(
                    f"{data.name} must come with its document index {data.name[:-4]}.csv.gz or an EOS id to find "
                    "its documents, got neither — pass eos_token_id= (and bos_token_id= for EOS→BOS boundaries)"
                )
            ids = np.frombuffer(data.read(self._offset, data.size), dtype=self.dtype)
            is_end = ids == eos
            if bos is not None:
                is_end[:-1] &= ids[1:] == bos  # an EOS ends a document only when BOS follows (and at the end)
            ends = np.flatnonzero(is_end) + 1
            if not len(ends) or ends[-1] != total:
                ends = np.append(ends, total) if total else ends
            self.ends = ends.astype(np.int64)
            # (an empty file: no end, so no document — not one start without its end)
            self.starts = np.concatenate([[0], self.ends[:-1]]).astype(np.int64)[: len(self.ends)]
        self._contiguous = bool(np.array_equal(self.starts[1:], self.ends[:-1]))

    @property
    def num_documents(self) -> int:
        return len(self.starts)

    def token_counts(self) -> np.ndarray:
        return self.ends - self.starts

    def read(self, start: int, stop: int) -> np.ndarray:
        if stop == start:
            return np.zeros(0, self.dtype)
        size, lo, hi = self.dtype.itemsize, int(self.starts[start]), int(self.ends[stop - 1])
        span = np.frombuffer(self._data.read(self._offset + lo * size, self._offset + hi * size), dtype=self.dtype)
        if self._contiguous:
            return span
        return np.concatenate(
            [span[s - lo : e - lo] for s, e in zip(self.starts[start:stop], self.ends[start:stop], strict=True)]
        )

    def read_loss(self, start: int, stop: int) -> None:
        return None

    def read_texts(self, start: int, stop: int) -> list[str]:
        raise AssertionError("an OLMo store holds token ids")  # pragma: no cover


def _read_sidecar(blob: Blob, total: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        text = gzip.decompress(bytes(blob.read(0, blob.size)))
    except (OSError, EOFError) as exc:
        raise DatasetError(
            f"{blob.name} must be gzip CSV of start,end rows, got a damaged file ({exc}) — copy it again"
        ) from None
    if not text.strip():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    try:
        table = pacsv.read_csv(
            pa.BufferReader(text),
            read_options=pacsv.ReadOptions(autogenerate_column_names=True),
            convert_options=pacsv.ConvertOptions(
                include_columns=["f0", "f1"], column_types={"f0": pa.int64(), "f1": pa.int64()}
            ),
        )
    except (pa.ArrowInvalid, KeyError) as exc:
        raise DatasetError(
            f"{blob.name} must hold integer start,end rows, got {str(exc)[:120]!r} — copy it again"
        ) from None
    starts, ends = table["f0"].to_numpy(), table["f1"].to_numpy()
    bad = (starts < 0) | (ends < starts) | (ends > total)
    if bad.any() or (starts[1:] < ends[:-1]).any():
        row = int(np.argmax(bad)) if bad.any() else int(np.argmax(starts[1:] < ends[:-1])) + 1
        raise DatasetError(
            f"{blob.name} must hold sorted start,end rows within the {total} ids of its data file, got "
            f"{int(starts[row])},{int(ends[row])} in row {row} — the sidecar belongs to another file; write it again"
        )
    return starts.astype(np.int64), ends.astype(np.int64)


def olmo_parts(files: StoreFiles, dtype: np.dtype | None, eos: int | None, bos: int | None) -> list[OlmoPart]:
    """The path's ``NAME.npy`` (listed by its stem, so ``NAME.csv.gz`` is listed with it), else every ``.npy``
    under the folder it names (sorted by path); each with its ``.csv.gz`` sidecar when there is one."""
    stems = [".npy"] if ".npy" in files.files else [s for s in files.suffixes(".npy") if s.startswith("/")]
    if not stems:
        raise DatasetError(
            f"token store {files.path!r} must be a .npy token file or a folder of them, got none — fix the path"
        )
    return [OlmoPart(files.files[stem], files.get(stem[: -len(".npy")] + ".csv.gz"), dtype, eos, bos) for stem in stems]
