"""WebDataset tar shards: the member index of a shard, from its tar headers only.

A WebDataset shard is a tar whose members are grouped into samples by *key*: the member's name up to the first
``.`` of its base name (``000123.jpg``, ``000123.txt``, ``000123.json`` → key ``000123``, extensions ``jpg``,
``txt``, ``json``; ``a/b/000123.seg.png`` → key ``a/b/000123``, extension ``seg.png``). Members of one key must
be consecutive, as webdataset writes them, and each file member must have an extension (a name without a dot
is refused: webdataset drops it silently), and every member a file or a directory (a link is refused: webdataset
skips it, and its sample with it). A sample is one row of the shard, in order of first appearance; a tar
of no file members is a shard of no rows.

``tar_index(file)`` walks the headers: it reads each 512-byte header (and the GNU/PAX extension blocks that
carry long names) and seeks past the payload, so indexing reads about 512 bytes per member whatever the payload
size (``TarIndex.bytes_read`` says how many). The index holds each member's payload offset and size: a reader
fetches a sample's members by those ranges only.

A ``.tar.gz`` shard cannot be sought: it is decompressed whole (at plan time to index it, at run time to read
it). Prefer plain ``.tar`` shards (webdataset's own advice for large images).

Invariant: every key of a shard has the same extensions as the shard's first key. A member without its
partner (an image without its caption) is one ``DatasetError`` naming the shard, the key and the missing or
extra extension; a truncated tar (a header or payload past the end of the file) names the shard and the member.

Example: members ``0.jpg`` (300 B), ``0.txt``, ``1.jpg``, ``1.txt`` → keys ``["0", "1"]``, extensions
``("jpg", "txt")``, ``offsets[0] == [512, 1536]`` (each payload after its header, padded to 512 bytes).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from zephon.errors import DatasetError
from zephon.storage.tar_headers import walk_headers

#: shards.parquet ``format`` of WebDataset shards.
TAR_FORMATS = ("tar", "tar.gz")
#: The fingerprint prefix of a tar shard: BLAKE2b of its size and its member listing (names, offsets, sizes).
TAR_FINGERPRINT = "tarindex:"


@dataclass(frozen=True, kw_only=True, slots=True)
class TarIndex:
    """The samples of one tar shard: ``keys`` in order, the shard's ``extensions``, and per sample and
    extension the payload's ``offsets`` and ``sizes`` (int64, shape ``(samples, extensions)``)."""

    keys: tuple[str, ...]
    extensions: tuple[str, ...]
    offsets: np.ndarray
    sizes: np.ndarray
    #: Bytes read from the file to build the index (headers only for a plain tar; the whole file for .tar.gz).
    bytes_read: int
    fingerprint: str

    def __len__(self) -> int:
        return len(self.keys)


class _Counting(io.RawIOBase):
    """A file that counts the bytes read through it (seeks are free)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.read_bytes = raw, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)


def split_name(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name (see the module docstring)."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])


def tar_index(uri: str, fmt: str, size: int, where: str) -> TarIndex:
    """The index of the tar shard at local path ``uri`` (``fmt``: ``tar`` or ``tar.gz``); ``where`` names it in
    errors (``dataset 'x': shard /path``). A plain tar's headers are walked by ``walk_headers`` (one positioned
    read and three fields a member), or by ``tarfile`` where that walk leaves it (long names, PAX, damage)."""
    with open(uri, "rb", buffering=0) as f:  # unbuffered: tarfile's header reads are 512 bytes each, no read-ahead
        if fmt == "tar.gz":
            try:
                data = gzip.decompress(f.read())
            except (OSError, EOFError) as exc:
                raise DatasetError(f"{where} must be a complete gzip stream, got {exc} — restore the shard") from exc
            return index_of(io.BytesIO(data), len(data), where, read=size, whole=True)
        fast = walk_headers(f.fileno(), size)
        if fast is not None:
            return _index(fast.members, fast.end, size, where, fast.bytes_read)
        counting = _Counting(f)
        return index_of(counting, size, where, counter=counting)


def index_of(
    raw: BinaryIO, size: int, where: str, *, counter: _Counting | None = None, read: int = 0, whole: bool = False
) -> TarIndex:
    """The index of an uncompressed tar in ``raw`` of ``size`` bytes (see ``tar_index``), walked by ``tarfile``."""
    members: list[tuple[str, int, int, bool]] = []
    try:
        with tarfile.open(fileobj=raw, mode="r:") as tar:  # type: ignore[call-overload]
            for member in tar:
                if not (member.isfile() or member.isdir()):
                    raise DatasetError(_not_a_file(where, member))
                members.append((member.name, member.offset_data, member.size, member.isfile()))
                if member.isfile() and member.offset_data + member.size > size:
                    break  # _index words it; tarfile would stop at the end of the data
            end = tar.offset
    except tarfile.TarError as exc:
        raise DatasetError(f"{where} must be a readable tar, got {exc} — restore the shard") from exc
    raw.seek(end)
    stop = raw.read(512)
    if len(stop) == 512 and any(stop):  # tarfile stops quietly at a header it cannot read (a bad checksum)
        after = f"after member {members[-1][0]!r}" if members else "at its first member"
        raise DatasetError(
            f"{where} must have a readable tar header at byte {end}, got a damaged one {after} — restore the shard"
        )
    return _index(members, end, size, where, read if whole else (counter.read_bytes if counter is not None else 0))


def _index(members: list[tuple[str, int, int, bool]], end: int, size: int, where: str, read: int) -> TarIndex:
    """The index of a tar's ``members`` (``(name, payload offset, size, is a file)`` in order) whose walk stopped
    at ``end``: samples grouped by key, every check of the module docstring, the fingerprint."""
    keys: list[str] = []
    rows: list[dict[str, tuple[int, int]]] = []
    listing = hashlib.blake2b(f"{size}".encode(), digest_size=16)
    for name, offset, length, is_file in members:
        if not is_file:
            continue
        if offset + length > size:
            raise DatasetError(
                f"{where} must hold member {name!r} whole, got a tar truncated at {size} bytes (the "
                f"member ends at {offset + length}) — restore the shard"
            )
        key, ext = split_name(name)
        if not ext:
            raise DatasetError(
                f"{where} member {name!r} must be named KEY.EXTENSION (a sample's members are grouped by key), got no "
                "extension — rename or remove that member"
            )
        listing.update(f"{name}\0{offset}\0{length}\n".encode())
        if not keys or keys[-1] != key:
            keys.append(key)
            rows.append({})
        if ext in rows[-1]:
            raise DatasetError(
                f"{where} key {key!r} must have one member per extension, got {ext!r} twice — rewrite the shard"
            )
        rows[-1][ext] = (offset, length)
    # A complete tar ends with two zero blocks after its last member; a file cut inside a header ends the walk
    # early, so too few bytes after the last member read are a truncated tar.
    last = members[-1][0] if keys else None
    if size - end < 1024:
        raise DatasetError(
            f"{where} must end with the tar end-of-archive blocks, got a tar truncated at {size} bytes "
            f"after member {last!r} — restore the shard"
        )
    if len(set(keys)) != len(keys):
        seen: set[str] = set()
        again = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise DatasetError(
            f"{where} key {again!r} must have consecutive members, got them apart — write each sample's members "
            "together (as webdataset does)"
        )
    extensions = tuple(sorted(rows[0])) if rows else ()
    for key, row in zip(keys, rows, strict=True):
        if tuple(sorted(row)) != extensions:
            missing = sorted(set(extensions) - set(row))
            extra = sorted(set(row) - set(extensions))
            got = f"no {', '.join(missing)}" if missing else f"an extra {', '.join(extra)}"
            raise DatasetError(
                f"{where} key {key!r} must have the members {', '.join(extensions)} like the shard's first key, got "
                f"{got} — add its partner or remove the member"
            )
    offsets = np.array([[row[e][0] for e in extensions] for row in rows], np.int64).reshape(len(rows), len(extensions))
    sizes = np.array([[row[e][1] for e in extensions] for row in rows], np.int64).reshape(len(rows), len(extensions))
    return TarIndex(
        keys=tuple(keys),
        extensions=extensions,
        offsets=offsets,
        sizes=sizes,
        bytes_read=read,
        fingerprint=TAR_FINGERPRINT + listing.hexdigest(),
    )


def save_index(path: Path, index: TarIndex) -> None:
    """Write ``index`` to ``path`` (an ``.npz``, atomically; no pickled objects)."""
    from zephon.storage.files import write_atomic

    write_atomic(
        path,
        lambda tmp: np.savez(
            tmp,
            keys=np.array(index.keys, dtype=str),
            extensions=np.array(index.extensions, dtype=str),
            offsets=index.offsets,
            sizes=index.sizes,
            bytes_read=index.bytes_read,
            fingerprint=index.fingerprint,
        ),
        "the tar index cache",
    )


def load_index(path: Path) -> TarIndex | None:
    """The index saved at ``path``, or None when absent or unreadable (it is derived data: rebuild it)."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            keys = tuple(str(k) for k in saved["keys"].tolist())
            return TarIndex(
                keys=keys,
                extensions=tuple(str(e) for e in saved["extensions"].tolist()),
                offsets=saved["offsets"].astype(np.int64).reshape(len(keys), -1),
                sizes=saved["sizes"].astype(np.int64).reshape(len(keys), -1),
                bytes_read=int(saved["bytes_read"]),
                fingerprint=str(saved["fingerprint"]),
            )
    except Exception:  # absent or damaged: a miss, never a failure
        return None


_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
}


def _not_a_file(where: str, member: tarfile.TarInfo) -> str:
    """The line refusing a member that is neither a file nor a directory: webdataset skips such members, so the
    sample holding it (a deduplicated image stored as a link) would be lost or partnerless without a word."""
    kind = _KINDS.get(member.type, f"a member of tar type {member.type!r}")
    target = f" to {member.linkname!r}" if member.islnk() or member.issym() else ""
    return (
        f"{where} member {member.name!r} must be a file or a directory, got {kind}{target} (webdataset skips it: its "
        "sample would be lost) — write the file itself (tar --dereference) or remove the member"
    )
