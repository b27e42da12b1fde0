"""Mosaic MDS datasets: ``index.json`` + ``shard.NNNNN.mds`` shards, read natively (no mosaicml-streaming).

``index.json`` (streaming/base/format/mds/writer.py): ``{"version": 2, "shards": [{"format": "mds",
"column_names", "column_encodings", "column_sizes", "samples", "raw_data": {"basename", "bytes"},
"compression", "zip_data"}...]}``; columns are sorted by name. A shard, little-endian::

    N uint32 | N + 1 uint32 sample offsets (absolute) | the index entry as JSON | samples

and a sample is one uint32 size per column of no fixed size, in column order, then every column's bytes.

The token column (``tokens_field``, else ``tokens`` or ``input_ids``): ``ndarray:DTYPE`` (a 1-byte
``ndim << 2 | shape-dtype code``, the shape in the smallest unsigned int that holds it, then the ids),
``ndarray:DTYPE:LEN`` (the ids only), ``ndarray`` (a dtype byte first) or the legacy ``bytes`` (raw ids in the
``dtype=`` you pass: llm-foundry wrote int64). A ``str`` column (``text_field``, else ``text``) makes a text store.

What is read when: opening reads ``index.json`` and each shard's header (``4 × (N + 2)`` bytes; one range GET;
``zephon.storage.mds_records.read_offsets``, which the record reader of MDS shards shares);
when the token column is the only column of no fixed size the counts follow from the sample sizes alone, else
each sample's size words are read (the shard's samples, once). ``read(a, b)`` reads the samples' byte range
and gathers the ids (vectorized). A compressed shard (``zip_data``: zstd or gz) is fetched whole and
decompressed once; an MDS shard missing from its folder, or of another size than ``index.json`` says, is refused.

Worked example: columns ``id`` (int, 8 bytes) and ``tokens`` (``ndarray:int32``); a sample of 4 ids is
``uint32 17 | 8 id bytes | 0x05 (ndim 1, uint8 shape) | 0x04 | 16 id bytes`` = 30 bytes, so a sample of
``30`` bytes holds ``(30 - 4 - 8 - 2) / 4 = 4`` ids.
"""

from __future__ import annotations

import gzip
import json

import numpy as np

from zephon.errors import DatasetError
from zephon.executor.token_stores.files import Blob, BytesBlob, StoreFiles
from zephon.executor.token_stores.store import CountedPart
from zephon.storage.mds_records import read_offsets

__all__ = ["MdsShard", "mds_parts"]

VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 32: "uint32", 33: "int32", 64: "uint64", 65: "int64"}
TOKEN_FIELDS = ("tokens", "input_ids")


class MdsShard(CountedPart):
    """One MDS shard (see the module docstring)."""

    def __init__(self, blob: Blob, entry: dict, column: int, dtype: np.dtype | None) -> None:
        self.name, self._blob = blob.name, blob
        #: A compressed shard's bytes, decompressed (its fingerprint samples them: ``shards.part_content``).
        self.decompressed: Blob | None = blob if isinstance(blob, BytesBlob) else None
        self.names, self.encodings = list(entry["column_names"]), list(entry["column_encodings"])
        self.sizes = list(entry["column_sizes"])
        self.column, n = column, int(entry["samples"])
        self.offsets = read_offsets(lambda a, b: bytes(blob.read(a, b)), blob.size, n, blob.name)
        encoding = self.encodings[column]
        self.holds = "text" if encoding == "str" else "tokens"
        self.dtype = self._dtype(encoding, dtype)
        self._var = [i for i, s in enumerate(self.sizes) if s is None]
        self.starts, self.counts = self._locate()

    def _dtype(self, encoding: str, dtype: np.dtype | None) -> np.dtype | None:
        kind, _, rest = encoding.partition(":")
        if self.holds == "text":
            return None
        if kind == "bytes":
            if dtype is None:
                raise DatasetError(
                    f"token column {self.names[self.column]!r} of {self.name} is raw bytes, got no dtype to read "
                    "them in — pass dtype= (llm-foundry's legacy 'bytes' columns hold int64 ids: dtype='int64')"
                )
            return np.dtype(dtype)
        if kind != "ndarray":
            raise DatasetError(
                f"token column {self.names[self.column]!r} of {self.name} must be ndarray or bytes, got {encoding!r} — "
                "pass tokens_field= naming the token column"
            )
        name = rest.partition(":")[0]
        if name and name not in VALUE_DTYPES.values():
            raise DatasetError(f"token column of {self.name} must hold integer ids, got {encoding!r}")
        return np.dtype(name) if name else None  # None: each sample names its dtype (read per sample)

    def _locate(self) -> tuple[np.ndarray, np.ndarray]:
        """Per sample: the byte where its token column's values (or text) start, and their count (ids or bytes)."""
        sample = np.diff(self.offsets)
        col, encoding = self.column, self.encodings[self.column]
        fixed_before = sum(int(s) for s in self.sizes[:col] if s is not None)
        if self._var == [col] and (self.dtype is not None or self.holds == "text"):
            body = sample - 4 - sum(int(s) for s in self.sizes if s is not None)  # the column's bytes
            if self.dtype is None:  # a text column: its UTF-8 bytes
                return self.offsets[:-1] + 4 + fixed_before, body
            head = _ndarray_head(body, encoding, self.dtype, self.name)
            return self.offsets[:-1] + 4 + fixed_before + head, (body - head) // self.dtype.itemsize
        if self.sizes[col] is not None and self.dtype is not None and all(j > col for j in self._var):
            # a fixed-shape column after fixed-size columns only: same place, same count in every sample
            at = self.offsets[:-1] + 4 * len(self._var) + fixed_before  # ndarray:DTYPE:SHAPE: the ids only
            return at, np.full(len(sample), int(self.sizes[col]) // self.dtype.itemsize, dtype=np.int64)
        # Several columns of no fixed size (or a dtype per sample): read each sample's size words, once.
        data = np.frombuffer(self._blob.read(0, self._blob.size), dtype=np.uint8)
        starts, counts, dtypes = [], [], set()
        for i in range(len(sample)):  # a Python loop over samples at open only (no index gives these sizes)
            at = int(self.offsets[i])
            sizes = data[at : at + 4 * len(self._var)].view("<u4")
            widths = [int(s) if s is not None else int(sizes[self._var.index(j)]) for j, s in enumerate(self.sizes)]
            begin = at + 4 * len(self._var) + sum(widths[:col])
            width = widths[col]
            if self.holds == "text":
                starts.append(begin)
                counts.append(width)
                continue
            head, dtype = _sample_head(data[begin : begin + width].tobytes(), encoding, self.dtype, self.name)
            dtypes.add(dtype)
            starts.append(begin + head)
            counts.append((width - head) // dtype.itemsize)
        if self.dtype is None:
            if len(dtypes) > 1:
                raise DatasetError(f"token column of {self.name} must hold one dtype, got {sorted(map(str, dtypes))}")
            self.dtype = dtypes.pop() if dtypes else np.dtype("int32")
        return np.asarray(starts, np.int64), np.asarray(counts, np.int64)

    def read(self, start: int, stop: int) -> np.ndarray:
        assert self.dtype is not None
        if stop == start:
            return np.zeros(0, self.dtype)
        size = self.dtype.itemsize
        lo = int(self.offsets[start])
        raw = np.frombuffer(self._blob.read(lo, int(self.offsets[stop])), dtype=np.uint8)
        starts, lengths = self.starts[start:stop] - lo, self.counts[start:stop] * size
        # Gather the ids' bytes of every sample at once: index = its start + position inside it.
        pos = np.arange(int(lengths.sum()), dtype=np.int64)
        shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        return raw[pos + shift].view(self.dtype.newbyteorder("<"))

    def read_loss(self, start: int, stop: int) -> None:
        return None

    def read_texts(self, start: int, stop: int) -> list[str]:
        lo = int(self.offsets[start])
        data = bytes(self._blob.read(lo, int(self.offsets[stop])))
        return [
            data[int(s) - lo : int(s) - lo + int(c)].decode("utf-8")
            for s, c in zip(self.starts[start:stop], self.counts[start:stop], strict=True)
        ]


def _ndarray_head(body: np.ndarray, encoding: str, dtype: np.dtype, name: str) -> np.ndarray:
    """Bytes before the ids in an ``ndarray:DTYPE`` value of ``body`` bytes: 1 (ndim | shape code) + the 1-D shape
    in the smallest unsigned int that holds the length — the one width ``w`` whose length fits it exactly."""
    if encoding == "bytes" or encoding.count(":") == 2:
        return np.zeros_like(body)
    out = np.full_like(body, -1)
    for code, width in enumerate((1, 2, 4, 8)):
        n, rem = np.divmod(body - 1 - width, dtype.itemsize)
        low = 0 if code == 0 else 1 << (8 * (1 << (code - 1)))
        fits = (rem == 0) & (n >= max(low, 1)) & (n < (1 << min(63, 8 * width))) & (out < 0)
        out[fits] = 1 + width
    if (out < 0).any():  # (MDSWriter refuses an empty array of a dynamic shape: no sample holds 0 ids)
        bad = int(np.flatnonzero(out < 0)[0])
        raise DatasetError(
            f"token values of {encoding!r} in {name} must be 1-D arrays of one id or more (as MDSWriter writes them), "
            f"got sample {bad} of {int(body[bad])} bytes — write the shard again with MDSWriter"
        )
    return out


def _sample_head(value: bytes, encoding: str, dtype: np.dtype | None, name: str) -> tuple[int, np.dtype]:
    """``(header bytes, dtype)`` of one token value, read from its own bytes."""
    at = 0
    if dtype is None:
        if value[0] not in VALUE_DTYPES:
            raise DatasetError(f"token column of {name} must hold integer ids, got dtype code {value[0]}")
        dtype, at = np.dtype(VALUE_DTYPES[value[0]]), 1
    if encoding == "bytes" or encoding.count(":") == 2:
        return at, dtype
    ndim, code = value[at] >> 2, value[at] & 3
    if ndim != 1:
        raise DatasetError(f"token values of {name} must be 1-D arrays, got {ndim} dimensions")
    return at + 1 + (1 << code), dtype


def mds_parts(
    files: StoreFiles, tokens_field: str | None, text_field: str | None, dtype: np.dtype | None
) -> list[MdsShard]:
    """The shards of the MDS dataset in the folder ``files`` names."""
    index = files.need("/index.json", "its index", "point at the folder MDSWriter wrote")
    try:
        shards = json.loads(bytes(index.read(0, index.size)))["shards"]
    except (ValueError, KeyError, TypeError):
        raise DatasetError(f"{index.name} must be an MDS index with shards — copy it again") from None
    parts = []
    for entry in shards:
        if entry.get("format") != "mds":
            raise DatasetError(f"{index.name} must list mds shards, got format {entry.get('format')!r}")
        names = list(entry["column_names"])
        column = _pick(index, names, list(entry["column_encodings"]), tokens_field, text_field)
        raw = entry["raw_data"]
        zipped = entry.get("zip_data")
        plain = files.get("/" + raw["basename"])
        if plain is None and zipped:
            blob = _decompress(
                files.need("/" + zipped["basename"], "the shard", "copy every shard index.json lists"),
                str(entry.get("compression") or ""),
                raw["basename"],
            )
        else:
            blob = files.need("/" + raw["basename"], "the shard", "copy every shard index.json lists")
        if blob.size != int(raw["bytes"]):
            raise DatasetError(
                f"{blob.name} must be {raw['bytes']} bytes as index.json says, got {blob.size} — the shard is "
                "truncated or from another write; copy it again"
            )
        parts.append(MdsShard(blob, entry, column, dtype))
    if len({(p.holds, str(p.dtype)) for p in parts}) > 1:
        raise DatasetError(f"token store {files.path!r} must hold one dtype in every shard — its shards differ")
    return parts


def _pick(index: Blob, names: list[str], encodings: list[str], tokens: str | None, text: str | None) -> int:
    wanted = [tokens] if tokens else [text] if text else [*TOKEN_FIELDS, "text"]
    for name in wanted:
        if name in names:
            return names.index(name)
    raise DatasetError(
        f"{index.name} must have a column {' or '.join(map(repr, wanted))}, got "
        f"{dict(zip(names, encodings, strict=True))} — "
        "pass tokens_field= (ids) or text_field= (text)"
    )


def _decompress(blob: Blob, compression: str, name: str) -> Blob:
    data = bytes(blob.read(0, blob.size))
    algo = compression.partition(":")[0]
    try:
        if algo == "zstd":
            import zstandard

            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 34)
        elif algo == "gz":
            out = gzip.decompress(data)
        else:
            raise DatasetError(
                f"{blob.name} must be zstd or gz compressed to be read, got {compression!r} — write the dataset with "
                "compression='zstd' or None"
            )
    except (OSError, EOFError, ValueError) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"{blob.name} must decompress with {algo}, got {exc} — the shard is damaged") from None
    return BytesBlob(blob.name.rsplit("/", 1)[0] + "/" + name + f" (from {blob.name.rsplit('/', 1)[-1]})", out)
