"""walk_headers: a plain tar's members as tarfile lists them, read from three fields a header; anything else is
left to tarfile, so a shard's index, fingerprint and errors are the same either way."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from zephon.errors import DatasetError
from zephon.storage.tar_headers import walk_headers
from zephon.storage.tar_index import _Counting, index_of, tar_index


def write_tar(path: Path, names: list[str], fmt: int = tarfile.USTAR_FORMAT, *, dirs: tuple[str, ...] = ()) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for i, name in enumerate(names):
            payload = bytes([i % 251]) * (100 + 700 * i)
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(payload), 1_700_000_000 + i
            tar.addfile(info, io.BytesIO(payload))
    return path


def by_tarfile(path: Path) -> tuple[list[tuple[str, int, int, bool]], int]:
    with tarfile.open(path) as tar:
        members = [(m.name, m.offset_data, m.size, m.isfile()) for m in tar]
        return members, tar.offset


def walk(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return walk_headers(fd, path.stat().st_size)
    finally:
        os.close(fd)


def indexes(path: Path):
    """(the index tar_index gives, the index of tarfile's own walk)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        counting = _Counting(f)
        slow = index_of(counting, size, "shard", counter=counting)
    return tar_index(str(path), "tar", size, "shard"), slow


def same_index(a, b) -> bool:
    return (a.keys, a.extensions, a.fingerprint, a.offsets.tolist(), a.sizes.tolist()) == (
        b.keys,
        b.extensions,
        b.fingerprint,
        b.offsets.tolist(),
        b.sizes.tolist(),
    )


LONG = "a" * 60 + "/" + "b" * 60 + "/000001.jpg"  # 125 characters: a ustar prefix, or a GNU/PAX long name
PAIRS = ["000000.jpg", "000000.txt", "000001.jpg", "000001.txt"]


@pytest.mark.parametrize(
    ("names", "dirs"),
    [(PAIRS, ()), (["d/000000.jpg", "d/000000.txt", LONG, LONG.replace(".jpg", ".txt")], ("d",))],
    ids=["webdataset", "ustar-prefix-and-a-directory"],
)
def test_ustar_members_are_tarfiles_own_listing_and_the_index_is_the_same(tmp_path: Path, names, dirs) -> None:
    path = write_tar(tmp_path / "s.tar", names, dirs=dirs)
    fast = walk(path)
    assert fast is not None
    assert (fast.members, fast.end) == by_tarfile(path)
    assert fast.bytes_read == 512 * (len(names) + len(dirs) + 1)  # the headers and the first zero block
    got, want = indexes(path)
    assert same_index(got, want)
    assert got.bytes_read == fast.bytes_read


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu-long-name", "pax"])
def test_long_names_and_pax_records_are_left_to_tarfile_with_the_same_index(tmp_path: Path, fmt: int) -> None:
    path = write_tar(tmp_path / "s.tar", ["x" * 120 + ".jpg", "x" * 120 + ".txt"], fmt)
    assert walk(path) is None
    got, want = indexes(path)
    assert same_index(got, want) and got.keys == ("x" * 120,)


def test_a_bad_checksum_or_a_cut_file_is_left_to_tarfile_which_words_the_error(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "s.tar", PAIRS)
    data = bytearray(path.read_bytes())
    data[1024 + 20] ^= 0xFF  # inside the second member's header name: its checksum no longer matches
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    assert walk(bad) is None
    cut = tmp_path / "cut.tar"
    cut.write_bytes(path.read_bytes()[:3500])  # inside the third member's payload (bytes 3072-4572)
    assert walk(cut) is None
    with pytest.raises(
        DatasetError,
        match=r"^shard must hold member '000001.jpg' whole, got a tar truncated at 3500 bytes \(the member ends at 4572\)",
    ):
        tar_index(str(cut), "tar", 3500, "shard")
    with pytest.raises(
        DatasetError,
        match=r"^shard must have a readable tar header at byte 1024, got a damaged one after member '000000.jpg'",
    ):
        tar_index(str(bad), "tar", len(data), "shard")  # tarfile stops quietly at the bad header: refused, not cut
