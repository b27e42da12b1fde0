"""plan.json's ``integrity`` key: what a bundle looked like when the planner wrote it, written and checked here.

The planner writes the record last, after every Parquet file of the bundle (``integrity_record``)::

    "integrity": {
      "plan_json": {"config": "9c1f0e6b2a7d4e38", "config_hash": "…", "datasets": "…", …},
      "files": {
        "samples.parquet": {"bytes": 8519, "fingerprint": "pqfooter:5b0e…", "row_groups": "rowgroups:c1d2…"},
        "shards.parquet": {"bytes": 3164, "fingerprint": "pqfooter:77aa…", "row_groups": "rowgroups:08f3…"}
      }
    }

* ``plan_json``: for every top-level key of plan.json but ``integrity`` and ``batch``, the BLAKE2b-64 digest
  (16 hex digits) of its value as canonical JSON (``canonical_json``: sorted keys, no spaces). Any edit of a
  value, and any key added or removed, changes the set; reformatting the file (indentation, key order) does
  not. ``batch`` is left out on purpose: it only tells inspection tools how to cut steps (docs/cli.md) and a
  user may add it; it never changes what a plan schedules.
* ``files``: per Parquet file of ``files``, its size, its footer fingerprint (``zephon.plan.footer``) and a
  digest of the bytes of its first and last row groups (``row_group_digest``; all of a file of one or two row
  groups). The footer holds every column chunk's offsets, sizes and statistics, so a rewritten, truncated or
  extended file differs there; two files may still share a footer (another seed's samples of a small plan:
  same sizes, same statistics), and the edge row groups tell them apart. Read per file, however large: the
  footer (KB to MB) and two row groups (< 1 MB for samples.parquet's 65,536 documents per group).

Besides the record, ``config_hash`` is the SHA-256 of ``config`` as canonical JSON (``config_digest``), so it
is checked in every plan that has a ``config``, including plans written before the record existed.

Invariant: a bundle whose plan.json values, ``config`` or Parquet footers differ from what the planner wrote
is refused, with a line naming the file (and the plan.json keys) that changed. Not an adversary's check:
anyone can recompute the digests. Bytes changed inside a data page of a middle row group under an unchanged
footer (bit rot) are not detected here; such a page is an error when it is read only if it no longer decodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from zephon.checks import is_int
from zephon.errors import PlanFormatError
from zephon.plan.footer import ParquetFooter, read_footer
from zephon.plan.format import PLAN_JSON, SHARDS_FILE
from zephon.plan.json_fields import TEXT
from zephon.plan.json_record import key

__all__ = [
    "INTEGRITY_KEY",
    "UNSEALED_KEYS",
    "FileRecord",
    "Integrity",
    "canonical_json",
    "check_config_hash",
    "check_file",
    "check_plan_json",
    "config_digest",
    "integrity_record",
    "key_digests",
    "parse_integrity",
    "row_group_digest",
]

INTEGRITY_KEY = "integrity"
#: Top-level plan.json keys the record does not cover: the record itself, and ``batch`` (an inspection
#: default a user may add; see the module docstring).
UNSEALED_KEYS = frozenset({INTEGRITY_KEY, "batch"})

_FILE_KEYS = ("bytes", "fingerprint", "row_groups")
_FIX = "restore the bundle as the planner wrote it, or re-plan (a plan is changed by re-planning, not by editing it)"


@dataclass(frozen=True, kw_only=True, slots=True)
class FileRecord:
    """A Parquet file of the bundle as written: its size, footer fingerprint and edge row groups' digest
    (written in this order; read by ``parse_integrity``)."""

    bytes: int
    fingerprint: str
    #: ``row_group_digest`` of the file (``None``: not recorded, not checked; then not written).
    row_groups: str | None = key(TEXT.optional())


@dataclass(frozen=True, kw_only=True, slots=True)
class Integrity:
    """``integrity`` of plan.json, parsed (``parse_integrity``; written by ``zephon.plan.json_record``): digests
    per top-level key and a record per Parquet file name."""

    plan_json: Mapping[str, str]
    files: Mapping[str, FileRecord]


def canonical_json(value: object) -> str:
    """``value`` as canonical JSON: sorted keys, no spaces, ASCII (the form ``config_hash`` is computed on)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_plain)


def _plain(value: object) -> object:
    if isinstance(value, Mapping):  # a read-only view (Manifest.config) encodes as the object it shows
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def config_digest(config: object) -> str:
    """The ``config_hash`` of a normalized config: SHA-256 of its canonical JSON (as ``zephon.planner.prepare``)."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def key_digests(manifest: Mapping[str, Any]) -> dict[str, str]:
    """BLAKE2b-64 of every sealed top-level value of ``manifest`` (all keys but ``UNSEALED_KEYS``)."""
    return {
        key: hashlib.blake2b(canonical_json(value).encode(), digest_size=8).hexdigest()
        for key, value in sorted(manifest.items())
        if key not in UNSEALED_KEYS
    }


def _bundle_files(manifest: Mapping[str, Any]) -> list[str]:
    files = manifest.get("files") or {}
    names = [*files.get("samples", []), files.get("shards") or SHARDS_FILE]
    return names + [files[key] for key in ("bins", "copies") if files.get(key)]


def row_group_digest(path: str | os.PathLike[str], metadata: pq.FileMetaData) -> str:
    """``rowgroups:`` and the BLAKE2b-128 digest of the bytes of the first and the last row group of a Parquet
    file (its only one, if one): each row group's column chunks, from the first chunk's first page to the last
    chunk's end, located by ``metadata`` (the file's footer).

    Two files can share a footer (same sizes, same statistics: small plans of another seed do); their data
    differs here. Reads two row groups, whatever the file's size. Raises ``ValueError`` when the footer
    locates a row group outside the file, ``OSError`` when the file cannot be read.
    """
    digest = hashlib.blake2b(digest_size=16)
    groups = sorted({0, metadata.num_row_groups - 1}) if metadata.num_row_groups else []
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        for g in groups:
            lo, hi = _span(metadata.row_group(g))
            if not 0 <= lo <= hi <= size:
                raise ValueError(f"a footer that places row group {g} at bytes {lo}..{hi} of a file of {size} bytes")
            fh.seek(lo)
            digest.update(struct.pack("<QQ", lo, hi))
            digest.update(fh.read(hi - lo))
    return "rowgroups:" + digest.hexdigest()


def _span(group: pq.RowGroupMetaData) -> tuple[int, int]:
    starts, ends = [], []
    for c in range(group.num_columns):
        chunk = group.column(c)
        dictionary = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
        start = dictionary if dictionary else chunk.data_page_offset  # 0 is "none" in some writers
        starts.append(start)
        ends.append(start + chunk.total_compressed_size)
    return (min(starts), max(ends)) if starts else (0, 0)


def integrity_record(manifest: Mapping[str, Any], plan_dir: str | os.PathLike[str]) -> Integrity:
    """The ``integrity`` record for ``manifest`` (plan.json as JSON values, without the record) and the Parquet
    files in ``plan_dir``."""
    manifest = json.loads(json.dumps(manifest))  # digest what a reader parses (tuples as lists, keys as text)
    files = {}
    for name in _bundle_files(manifest):
        path = Path(plan_dir) / name
        footer = read_footer(path)
        files[name] = FileRecord(
            bytes=footer.size, fingerprint=footer.fingerprint, row_groups=row_group_digest(path, footer.metadata())
        )
    return Integrity(plan_json=key_digests(manifest), files=files)


def parse_integrity(value: object, file: Path) -> Integrity | None:
    """``integrity`` of plan.json (``None`` when absent: a plan written before the record existed)."""
    if value is None:
        return None

    def bad(what: str, got: object) -> PlanFormatError:
        shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
        return PlanFormatError(f"{file} key {what} must be as the planner wrote it, got {shown} — {_FIX}")

    if not isinstance(value, dict):
        raise bad(f"'{INTEGRITY_KEY}'", value)
    digests, files = value.get("plan_json"), value.get("files")
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise bad(f"'{INTEGRITY_KEY}.plan_json'", digests)
    if not isinstance(files, dict):
        raise bad(f"'{INTEGRITY_KEY}.files'", files)
    records = {}
    for name, entry in files.items():
        size, fingerprint, groups = (entry.get(k) if isinstance(entry, dict) else None for k in _FILE_KEYS)
        if (
            not is_int(size)
            or not isinstance(fingerprint, str)
            or not isinstance(groups, str | None)
        ):
            raise bad(f"'{INTEGRITY_KEY}.files.{name}'", entry)
        records[name] = FileRecord(bytes=size, fingerprint=fingerprint, row_groups=groups)
    return Integrity(plan_json=dict(digests), files=records)


def _quoted(keys: list[str]) -> str:
    return ", ".join(repr(k) for k in keys)


def check_plan_json(data: Mapping[str, Any], integrity: Integrity, file: Path) -> None:
    """Refuse a plan.json whose sealed keys differ from the record: names the keys changed, added, removed."""
    got = key_digests(data)
    want = integrity.plan_json
    changed = sorted(k for k in got.keys() & want.keys() if got[k] != want[k])
    added = sorted(got.keys() - want.keys())
    removed = sorted(want.keys() - got.keys())
    if not (changed or added or removed):
        return
    parts = [f"changed {_quoted(changed)}"] if changed else []
    parts += [f"added {_quoted(added)}"] if added else []
    parts += [f"removed {_quoted(removed)}"] if removed else []
    raise PlanFormatError(
        f"{file} must be as the planner wrote it, got edited keys ({'; '.join(parts)}) since planning — {_FIX}"
    )


def check_config_hash(config: Mapping[str, Any], config_hash: str, file: Path) -> None:
    """Refuse a plan.json whose ``config`` does not hash to its ``config_hash`` (no ``config``: nothing to check)."""
    if not config:
        return
    got = config_digest(config)
    if got != config_hash:
        raise PlanFormatError(
            f"{file} config must hash to its config_hash {config_hash[:12]}, got {got[:12]} — the config or "
            f"config_hash was edited since planning; {_FIX}"
        )


def check_file(
    path: Path, footer: ParquetFooter, metadata: pq.FileMetaData, record: FileRecord | None, *, name: str
) -> None:
    """Refuse a bundle Parquet file whose size, footer or edge row groups differ from its record (``None``: not
    recorded). ``name`` is the file's bundle-relative name, as plan.json's files list it
    (``samples/part-00001.parquet`` for a part). Raises ``ValueError`` or ``OSError`` when the row groups cannot
    be read (a damaged file)."""
    if record is None:
        root = path.parents[len(Path(name).parts) - 1]
        raise PlanFormatError(f"{root / PLAN_JSON} key '{INTEGRITY_KEY}.files' must list {name}, got no entry — {_FIX}")
    if footer.size != record.bytes:
        want, got = f"{record.bytes} bytes", f"{footer.size} bytes"
    elif footer.fingerprint != record.fingerprint:
        want, got = f"footer {record.fingerprint}", f"footer {footer.fingerprint}"
    elif record.row_groups is not None and (digest := row_group_digest(path, metadata)) != record.row_groups:
        want, got = f"first and last row groups {record.row_groups}", digest
    else:
        return
    raise PlanFormatError(
        f"{path} must be the file the plan was written with ({want}), got {got} — it changed since planning; {_FIX}"
    )
