"""litData optimized datasets: ``index.json`` + ``chunk-*.bin``, read natively (no litdata, no torch).

``index.json`` (litdata/streaming/writer.py): ``{"chunks": [{"filename", "chunk_size" (items), "chunk_bytes",
"dim"}...], "config": {"item_loader", "data_format", "data_spec", "compression", "encryption", ...}}``. Every
chunk starts with a header, little-endian: ``N`` uint32 | ``N + 1`` uint32 byte offsets of the items (absolute,
the first one just past the header), then the items.

* ``TokensLoader`` stores (``data_format`` ``["no_header_numpy:K"]`` or ``["no_header_tensor:K"]``): each item is
  one document's ids, raw, in the dtype ``K`` names. A document's count is its item's byte size / itemsize, so
  the counts come from the chunk headers (``4 × (N + 2)`` bytes each; one range GET a chunk remotely), never the ids.
* Raw text items (the default ``PyTreeLoader``): a plain string item is ``uint32 size | UTF-8`` (``dict`` and
  ``tuple`` items hold one ``uint32`` size per leaf, then the leaves; ``text_field`` names the leaf, found in
  ``data_spec``'s dict keys). litdata ≥ 0.2.6 writes rows of flat strings as an Arrow IPC file at the chunk's end
  instead (``... | IPC | uint32 IPC length | b"LDARW01\\0"``); its ``text_field`` column is read.
  Text stores give texts (``read_texts``), tokenized downstream.

Compressed or encrypted chunks are refused (a range of a compressed chunk cannot be read alone).

Worked example: a chunk ``N = 2``, offsets ``[12, 20, 26]``, ``no_header_numpy:5`` (uint16) → two documents
of 4 and 3 tokens; ``read(1, 2)`` reads chunk bytes 20..26.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from zephon.errors import DatasetError
from zephon.executor.token_stores.files import Blob, StoreFiles

__all__ = ["LitdataChunk", "litdata_parts"]

#: litdata's ``_NUMPY_DTYPES_MAPPING`` order (integer kinds only) and ``_TORCH_DTYPES_MAPPING`` integer codes.
NUMPY_CODES = {0: "int8", 1: "int16", 2: "int32", 3: "int64", 4: "uint8", 5: "uint16", 6: "uint32", 7: "uint64"}
TORCH_CODES = {
    11: "uint8",
    12: "int8",
    13: "int16",
    14: "int16",
    15: "int32",
    16: "int32",
    17: "int64",
    18: "int64",
    20: "uint16",
}
ARROW_MAGIC = b"LDARW01\0"


def _token_dtype(index: Blob, fmt: list) -> np.dtype:
    name, _, code = str(fmt[0] if fmt else "").partition(":")
    table = {"no_header_numpy": NUMPY_CODES, "no_header_tensor": TORCH_CODES}.get(name, {})
    if len(fmt) != 1 or not code.isdigit() or int(code) not in table:
        raise DatasetError(
            f"{index.name} must describe TokensLoader items as one integer no_header_numpy/no_header_tensor leaf, got "
            f"data_format {fmt!r} — write the store with TokensLoader and 1-D integer arrays"
        )
    return np.dtype(table[int(code)]).newbyteorder("<")


class LitdataChunk:
    """One ``chunk-*.bin`` of a litData store (see the module docstring)."""

    def __init__(
        self, blob: Blob, entry: dict, dtype: np.dtype | None, text: tuple[int, int, bool] | None, text_field: str
    ) -> None:
        self.name, self._blob, self.dtype = blob.name, blob, dtype
        self._text, self._text_field = text, text_field
        n = int(entry.get("chunk_size", -1))
        if blob.size != int(entry.get("chunk_bytes", -1)) or n < 0 or blob.size < 4 * (n + 2):
            raise DatasetError(
                f"{blob.name} must be {entry.get('chunk_bytes')} bytes holding {n} items as index.json says, got "
                f"{blob.size} bytes — the chunk is truncated or from another write; copy the store again"
            )
        head = np.frombuffer(blob.read(0, 4 * (n + 2)), dtype="<u4").astype(np.int64)
        self.offsets = head[1:]
        if head[0] != n or self.offsets[0] != 4 * (n + 2) or (np.diff(self.offsets) < 0).any():
            raise DatasetError(
                f"{blob.name} must start with its {n} items and their rising offsets, got {int(head[0])} items — "
                "the chunk is damaged; copy the store again"
            )
        if self._text is None and self.offsets[-1] != blob.size:
            raise DatasetError(
                f"{blob.name} must end at its last item's end ({int(self.offsets[-1])}), got {blob.size}"
            )
        self._arrow: pa.Table | None = None

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    def token_counts(self) -> np.ndarray:
        assert self.dtype is not None
        sizes = np.diff(self.offsets)
        if (sizes % self.dtype.itemsize).any():
            raise DatasetError(f"{self.name} must hold whole {self.dtype} ids in each item, got item sizes {sizes}")
        return sizes // self.dtype.itemsize

    def read(self, start: int, stop: int) -> np.ndarray:
        assert self.dtype is not None
        return np.frombuffer(self._blob.read(int(self.offsets[start]), int(self.offsets[stop])), dtype=self.dtype)

    def read_loss(self, start: int, stop: int) -> None:
        return None

    def read_texts(self, start: int, stop: int) -> list[str]:
        assert self._text is not None
        leaf, leaves, arrow = self._text
        if arrow:
            return [str(t) for t in self._arrow_table().column(self._text_field).to_pylist()[start:stop]]
        lo = int(self.offsets[start])
        data = bytes(self._blob.read(lo, int(self.offsets[stop])))
        out = []
        for i in range(start, stop):  # one item a document: texts are tokenized after this, far slower
            at = int(self.offsets[i]) - lo
            sizes = np.frombuffer(data, dtype="<u4", count=leaves, offset=at)
            begin = at + 4 * leaves + int(sizes[:leaf].sum())
            out.append(data[begin : begin + int(sizes[leaf])].decode("utf-8"))
        return out

    def _arrow_table(self) -> pa.Table:
        if self._arrow is None:
            data = bytes(self._blob.read(0, self._blob.size))
            size = int.from_bytes(data[-12:-8], "little")
            table = pa.ipc.open_file(pa.py_buffer(data[-12 - size : -12])).read_all()
            if self._text_field not in table.column_names:
                raise DatasetError(
                    f"{self.name} must hold the text field {self._text_field!r}, got columns {table.column_names} — "
                    "pass text_field="
                )
            self._arrow = table
        return self._arrow


def _text_leaf(index: Blob, config: dict, text_field: str) -> tuple[int, int]:
    """``(leaf, leaves)``: which pytree leaf of each item is the text, and how many leaves an item has."""
    fmt = list(config.get("data_format") or [])
    if fmt == ["str"]:
        return 0, 1
    spec = json.loads(config.get("data_spec") or "[1, {}]")[1]
    keys = json.loads(spec.get("context") or "null") if spec.get("type") == "builtins.dict" else None
    if (
        not isinstance(keys, list)
        or text_field not in keys
        or len(keys) != len(fmt)
        or fmt[keys.index(text_field)] != "str"
    ):
        raise DatasetError(
            f"{index.name} must describe items with a str field {text_field!r}, got data_format {fmt} — pass "
            "text_field= naming the text leaf"
        )
    return keys.index(text_field), len(fmt)


def litdata_parts(files: StoreFiles, text_field: str) -> tuple[str, np.dtype | None, list[LitdataChunk]]:
    """``(holds, dtype, chunks)`` of the litData store in the folder ``files`` names."""
    index = files.need("/index.json", "its index", "point at the folder litdata.optimize wrote")
    try:
        meta = json.loads(bytes(index.read(0, index.size)))
        chunks, config = meta["chunks"], meta["config"]
    except (ValueError, KeyError, TypeError):
        raise DatasetError(
            f"{index.name} must be litdata's JSON index with chunks and config — copy it again"
        ) from None
    if config.get("compression") or config.get("encryption"):
        raise DatasetError(
            f"{index.name} must describe uncompressed, unencrypted chunks to be read by ranges, got compression "
            f"{config.get('compression')!r} — write the store with compression=None"
        )
    loader = config.get("item_loader")
    dtype: np.dtype | None = None
    text: tuple[int, int, bool] | None = None
    if loader == "TokensLoader":
        holds, dtype = "tokens", _token_dtype(index, list(config.get("data_format") or []))
    elif loader == "PyTreeLoader":
        holds = "text"
    else:
        raise DatasetError(
            f"{index.name} must be written with TokensLoader (ids) or PyTreeLoader (text items), got {loader!r}"
        )
    parts = []
    for entry in chunks:
        blob = files.need("/" + str(entry.get("filename")), "the chunk", "copy every chunk index.json lists")
        if holds == "text":
            arrow = blob.size >= 8 and bytes(blob.read(blob.size - 8, blob.size)) == ARROW_MAGIC
            leaf = (0, 0) if arrow else _text_leaf(index, config, text_field)
            text = (leaf[0], leaf[1], arrow)
        parts.append(LitdataChunk(blob, entry, dtype, text, text_field))
    return holds, dtype, parts
