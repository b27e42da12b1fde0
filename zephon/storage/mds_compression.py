"""Compressed MDS shards (``MDSWriter(compression=...)``): which algorithms Zephon decodes, and the decoding.

A compressed shard is ``shard.NNNNN.mds.<ext>``; its ``index.json`` entry names the algorithm (``compression``,
``"zstd"`` or ``"zstd:7"``: the level after the colon does not matter for reading), the compressed file
(``zip_data: {basename, bytes}``) and the shard it decompresses to (``raw_data: {basename, bytes}``). Compression
is of the whole shard, so nothing inside can be read by range: a compressed shard is read whole and decompressed
in memory — at planning (its header is inside) and each time a run opens it — as a ``.tar.gz`` is.

Decoded here: ``zstd`` (the ``zstandard`` package, a Zephon dependency), ``gz`` and ``bz2`` (the standard
library). Refused in one line naming the algorithm: ``br`` (Brotli) and ``snappy``, which need packages Zephon
does not depend on — rewrite such a dataset with ``compression="zstd"`` (or None, which keeps range reads).

Invariant: ``decompress_shard(data, entry, where)`` returns exactly ``raw_data.bytes`` bytes, or raises one
``DatasetError`` line naming ``where``. Example: entry ``{"compression": "zstd:7", "zip_data": {"basename":
"shard.00000.mds.zstd", "bytes": 1795}, "raw_data": {"basename": "shard.00000.mds", "bytes": 4700}}`` and the
1,795 bytes of the file → the 4,700 bytes of the MDS shard.
"""

from __future__ import annotations

import bz2
import gzip
import zlib
from collections.abc import Callable

from zephon.errors import DatasetError

__all__ = ["DECODED", "algorithm", "check_algorithm", "compression_of", "decompress", "decompress_shard", "shard_file"]


def _zstd(data: bytes, size: int) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data, max_output_size=max(size, 1))


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "zstd": _zstd,
    "gz": lambda data, size: gzip.decompress(data),
    "bz2": lambda data, size: bz2.decompress(data),
}
#: The algorithms a compressed MDS shard may use.
DECODED = tuple(_DECODERS)


def algorithm(compression: object) -> str | None:
    """The algorithm of an entry's ``compression`` (``"zstd:7"`` → ``"zstd"``), None when uncompressed."""
    if compression in (None, ""):
        return None
    return str(compression).partition(":")[0]


def shard_file(entry: dict) -> tuple[str, int, str | None]:
    """``(basename, bytes, algorithm)`` of the file that holds an entry's shard: the raw shard when the entry has
    no ``zip_data``, else the compressed file (``algorithm`` None for the raw shard)."""
    zipped = entry.get("zip_data")
    if isinstance(zipped, dict) and zipped.get("basename"):
        return str(zipped["basename"]), int(zipped.get("bytes", -1)), algorithm(entry.get("compression")) or "?"
    raw = entry.get("raw_data") or {}
    return str(raw.get("basename")), int(raw.get("bytes", -1)), None


def check_algorithm(entry: dict, where: str) -> None:
    """Refuse, in one line, a compressed entry whose algorithm Zephon does not decode."""
    name = shard_file(entry)[2]
    if name is not None and name not in _DECODERS:
        raise DatasetError(
            f"{where} must be compressed with one of {', '.join(DECODED)} (or not at all), got "
            f"{entry.get('compression')!r} — rewrite the dataset with MDSWriter(compression='zstd') or None"
        )


def compression_of(name: str) -> str | None:
    """The algorithm a shard's file name implies (``shard.00000.mds.zstd`` → ``"zstd"``), None for ``.mds``."""
    stem, dot, ext = name.rpartition(".")
    return ext if dot and stem.endswith(".mds") else None


def decompress_shard(data: bytes, entry: dict, where: str) -> bytes:
    """The MDS shard inside the compressed ``data`` of ``entry`` (module docstring), checked against its size."""
    check_algorithm(entry, where)
    name = shard_file(entry)[2]
    assert name is not None
    return decompress(data, name, int((entry.get("raw_data") or {}).get("bytes", -1)), where)


def decompress(data: bytes, name: str, size: int | None, where: str) -> bytes:
    """``data`` decompressed with the algorithm ``name``; exactly ``size`` bytes when it is given."""
    if name not in _DECODERS:
        raise DatasetError(
            f"{where} must be compressed with one of {', '.join(DECODED)} (or not at all), got {name!r} — rewrite "
            "the dataset with MDSWriter(compression='zstd') or None"
        )
    try:
        out = _DECODERS[name](data, size if size is not None and size >= 0 else 1 << 34)
    except Exception as exc:  # OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError
        if not isinstance(exc, OSError | EOFError | ValueError | zlib.error) and type(exc).__name__ != "ZstdError":
            raise
        raise DatasetError(
            f"{where} must decompress with {name}, got {exc} — the shard is damaged; copy it again"
        ) from None
    if size is not None and len(out) != size:
        raise DatasetError(
            f"{where} must decompress to {size} bytes as index.json says, got {len(out)} — the shard is from "
            "another write; copy it again"
        )
    return out
