"""Reading WebDataset samples from a local tar shard: each sample's members by their ranges.

``TarShard`` opens a shard the plan indexed (``zephon.storage.tar_index``) and checks it before any sample is
used: the planned size (one ``stat``) and the member listing, rebuilt from the headers (about 512 bytes read per
member) and compared with the plan's ``tarindex:`` fingerprint — a shard rewritten since planning is refused.
A sample is then ``{"__key__": key, ext: bytes, ...}``: one positioned read (``os.pread``) per member, no
payload read twice, nothing decoded (decode in ``map_transform``). A ``.tar.gz`` shard is decompressed whole
when opened and its samples sliced from memory.
"""

from __future__ import annotations

import gzip
import io
import os

import numpy as np

from zephon.errors import DatasetError
from zephon.plan.records import ShardRef
from zephon.storage.tar_index import TarIndex, index_of, tar_index

#: The key of a sample's record (WebDataset's name for it).
KEY = "__key__"


class TarShard:
    """One open tar shard: its index and, for a plain tar, an open file descriptor (``.tar.gz``: its bytes)."""

    __slots__ = ("_data", "_fd", "index", "ref")

    def __init__(self, ref: ShardRef) -> None:
        self.ref = ref
        where = f"dataset {ref.dataset!r}: shard {ref.uri}"
        try:
            size = os.path.getsize(ref.uri)
        except OSError as exc:
            raise DatasetError(
                f"{where} must exist as planned, got {exc.strerror} — restore the file or re-plan"
            ) from exc
        if size != ref.bytes:
            raise DatasetError(
                f"{where} changed since planning: size must be {ref.bytes} bytes, got {size} — restore the planned "
                "data or re-plan"
            )
        self._fd: int | None = None
        self._data: bytes | None = None
        if ref.format == "tar.gz":
            with open(ref.uri, "rb") as f:
                raw = f.read()
            try:
                self._data = gzip.decompress(raw)
            except (OSError, EOFError) as exc:
                raise DatasetError(f"{where} must be a complete gzip stream, got {exc} — restore the shard") from exc
            index: TarIndex = index_of(io.BytesIO(self._data), len(self._data), where, read=len(raw), whole=True)
        else:
            index = tar_index(ref.uri, ref.format, size, where)
            self._fd = os.open(ref.uri, os.O_RDONLY)
        if index.fingerprint != ref.fingerprint or len(index) != ref.rows:
            self.close()
            raise DatasetError(
                f"{where} changed since planning: its members must match fingerprint {ref.fingerprint} "
                f"({ref.rows} samples), got {index.fingerprint} ({len(index)} samples) — restore the planned data "
                "or re-plan"
            )
        self.index = index

    def read(self, rows: np.ndarray) -> list[dict[str, object]]:
        """The samples at ``rows``, in the order given."""
        out = []
        ix = self.index
        for row in rows.tolist():
            sample: dict[str, object] = {KEY: ix.keys[row]}
            for k, ext in enumerate(ix.extensions):
                start, size = int(ix.offsets[row, k]), int(ix.sizes[row, k])
                sample[ext] = self._member(start, size, row, ext)
            out.append(sample)
        return out

    def _member(self, start: int, size: int, row: int, ext: str) -> bytes:
        if self._data is not None:
            return self._data[start : start + size]
        assert self._fd is not None
        data = os.pread(self._fd, size, start)
        if len(data) != size:
            raise DatasetError(
                f"dataset {self.ref.dataset!r}: shard {self.ref.uri} key {self.index.keys[row]!r} member {ext!r} must "
                f"have {size} bytes, got {len(data)} (a truncated tar) — restore the shard"
            )
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._data = None
