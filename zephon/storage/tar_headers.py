"""A fast walk over the headers of a plain tar, for the members webdataset writes: regular files (and directories)
with ustar or v7 headers.

``tarfile`` builds a ``TarInfo`` per member, parsing every field of its header — some 0.1-0.3 ms a member on a
small machine, more than reading a 100 KB payload from the page cache. ``walk_headers`` reads each 512-byte
header with one positioned read, checks its checksum and parses three fields (name with its ustar prefix, size,
type), as ``tarfile`` does for such headers. Anything it does not read exactly as ``tarfile`` would — a GNU
long name, PAX records, a sparse, link or device member, a base-256 size, a bad checksum, a header cut by the end
of the file — gives ``None``, and the caller walks the file with ``tarfile`` instead
(``zephon.storage.tar_index``): the index, its fingerprint and its errors are the same either way.

Invariant: ``walk_headers(fd, size)`` is None or its ``members`` are ``tarfile``'s ``(name, offset_data, size,
isfile())`` in order, and ``end`` is ``TarFile.offset`` after the iteration (the first all-zero block).

Example: a tar of ``0.jpg`` (300 bytes) and ``0.txt`` (5 bytes) — headers at 0 and 1024 (the payload padded
to 512), two zero blocks at 2048: members ``[("0.jpg", 512, 300, True), ("0.txt", 1536, 5, True)]``,
``end`` 2048, 1536 bytes read (three headers, the last one the zero block).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

BLOCK = 512
_ZERO = bytes(BLOCK)
#: Types read here: regular files (``0``, and ``\\0`` of old tars) and directories (``5``, skipped by callers).
_FILE, _OLD_FILE, _DIR = b"0", b"\0", b"5"


@dataclass(frozen=True, slots=True)
class HeaderWalk:
    """``members``: ``(name, payload offset, size, is a file)`` in order; ``end``: where the archive's zero blocks
    start; ``bytes_read``: header bytes read."""

    members: list[tuple[str, int, int, bool]]
    end: int
    bytes_read: int


def _text(field: bytes) -> str:
    zero = field.find(b"\0")
    return (field if zero < 0 else field[:zero]).decode("utf-8", "surrogateescape")


def _octal(field: bytes) -> int | None:
    """An octal number field as ``tarfile.nti`` reads it; None for base-256 or an invalid field."""
    if field[:1] in (b"\x80", b"\xff"):
        return None
    zero = field.find(b"\0")
    try:
        return int((field if zero < 0 else field[:zero]).decode("ascii").strip() or "0", 8)
    except ValueError:  # UnicodeDecodeError included
        return None


#: The numeric fields tarfile parses besides size and checksum (mode, uid, gid, mtime, devmajor, devminor), and
#: the form of those read here: octal digits between spaces, up to a NUL — a subset of what ``tarfile.nti``
#: accepts (it also takes signs and base-256), so a header it would refuse is never read here.
_NUMBERS = ((100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345))
_PLAIN_OCTAL = re.compile(rb" *[0-7]* *(?:\0.*)?", re.DOTALL)


def walk_headers(fd: int, size: int) -> HeaderWalk | None:
    """The members of the tar open at ``fd`` (``size`` bytes), or None where ``tarfile`` must walk it (module
    docstring)."""
    members: list[tuple[str, int, int, bool]] = []
    offset = read = 0
    while True:
        header = os.pread(fd, BLOCK, offset)
        read += len(header)
        if len(header) < BLOCK:
            return None  # the end of the file inside a header: tarfile words the error
        if header == _ZERO:
            return HeaderWalk(members=members, end=offset, bytes_read=read) if offset else None
        kind = header[156:157]
        length, checksum = _octal(header[124:136]), _octal(header[148:156])
        if kind not in (_FILE, _OLD_FILE, _DIR) or length is None or checksum is None:
            return None
        if not all(_PLAIN_OCTAL.fullmatch(header, a, b) for a, b in _NUMBERS):
            return None
        if checksum != sum(header[:148]) + 256 + sum(header[156:]):
            return None  # tarfile also accepts signed sums, and words a bad one
        name = _text(header[:100])
        is_dir = kind == _DIR or (kind == _OLD_FILE and name.endswith("/"))
        if is_dir:
            name = name.rstrip("/")
        prefix = _text(header[345:500])
        if prefix:
            name = f"{prefix}/{name}"
        if not is_dir and offset + BLOCK + length > size:
            return None  # a payload past the end of the file: tarfile's walk and its checks word it
        members.append((name, offset + BLOCK, length, not is_dir))
        offset += BLOCK + (
            0 if is_dir else -(-length // BLOCK) * BLOCK
        )  # as tarfile: a directory's size is not skipped
