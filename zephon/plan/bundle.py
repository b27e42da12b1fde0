"""Opening a plan bundle: the one door the executor's ``PlanBundle`` and every inspection tool go through.

``open_bundle(plan_dir)`` reads and checks the whole bundle before anything is read from it, so a damaged
bundle is one ``PlanFormatError`` line naming the file, never an error from deep inside a query:

1. plan.json exists, is JSON, and is a valid manifest (``zephon.plan.manifest``);
2. its ``integrity`` record, when it has one, matches every sealed key (``zephon.plan.integrity``), and
   ``config`` hashes to ``config_hash`` (also in plans written before the record existed);
3. every Parquet file of ``files`` exists, ends in a footer that parses (a truncated or foreign file does not),
   has the columns and types of the format (``zephon.plan.format``), and the samples files hold
   ``totals.documents`` rows and shards.parquet ``totals.shards``;
4. each file's size, footer fingerprint and first and last row groups match the record (when there is one).

Cost, per Parquet file, whatever its size: its last 8 bytes and its footer read, hashed and parsed once, and
with a record its first and last row groups read and hashed (< 1 MB for samples.parquet). The parsed footers
are kept (``CheckedFile``), so readers open the files without reading the footers again (``CheckedFile.open``).

Not checked here: bytes inside the data pages of the other row groups (decoded when read; a page that does
not decode is an error then, ``read_row_group``), and the shards' own data (checked by the executor when it
opens each shard).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.errors import PlanFormatError, one_line
from zephon.plan.footer import read_footer
from zephon.plan.format import BINS_SCHEMA, COPIES_SCHEMA, SHARDS_SCHEMA, check_schema, samples_schema
from zephon.plan.integrity import Integrity, check_config_hash, check_file, check_plan_json
from zephon.plan.manifest import Manifest, parse_manifest, read_plan_json

__all__ = ["DAMAGED", "CheckedBundle", "CheckedFile", "open_bundle", "read_row_group"]

DAMAGED = "the file is truncated or damaged; restore it or re-plan"


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckedFile:
    """A Parquet file of the bundle, checked: its path, size, footer fingerprint and parsed footer."""

    path: Path
    size: int
    #: ``pqfooter:`` fingerprint of the file (``zephon.plan.footer``).
    fingerprint: str
    metadata: pq.FileMetaData

    @property
    def rows(self) -> int:
        return int(self.metadata.num_rows)

    @property
    def schema(self) -> pa.Schema:
        return self.metadata.schema.to_arrow_schema()

    def open(self) -> pq.ParquetFile:
        """A reader of the file that uses the checked footer (the footer is not read again)."""
        return pq.ParquetFile(self.path, metadata=self.metadata)

    def read_row_group(self, reader: pq.ParquetFile, group: int, columns: list[str]) -> pa.Table:
        """Row group ``group`` read with ``reader`` (from ``open``); see ``read_row_group``."""
        return read_row_group(reader, self.path, group, columns)

    def read(self, columns: list[str] | None = None) -> pa.Table:
        """The whole file (or ``columns``); a data page that does not decode is one line naming the file."""
        try:
            return self.open().read(columns=columns)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise PlanFormatError(f"{self.path} must be readable Parquet, got {one_line(exc)} — {DAMAGED}") from exc


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckedBundle:
    """A plan bundle that passed every check of the module docstring."""

    path: Path
    manifest: Manifest
    shards: CheckedFile
    samples: tuple[CheckedFile, ...]
    #: bins.parquet of a best-fit exact plan; ``None`` otherwise.
    bins: CheckedFile | None
    #: selected.parquet of a plan written with ``materialize_selections``; ``None`` otherwise.
    copies: CheckedFile | None
    #: Whether plan.json carries an integrity record (plans written before it do not; see docs/plan-format.md).
    sealed: bool


def open_bundle(plan_dir: str | os.PathLike[str]) -> CheckedBundle:
    """The bundle in ``plan_dir``, checked (see the module docstring); any failure is one ``PlanFormatError``."""
    path = Path(plan_dir)
    data, json_path = read_plan_json(path)
    manifest = parse_manifest(data, json_path)
    assert isinstance(data, dict)  # parse_manifest refuses anything else
    integrity = manifest.integrity
    if integrity is not None:  # digests of the keys as written (an added unknown key changes them too)
        check_plan_json(data, integrity, json_path)
    check_config_hash(manifest.config, manifest.config_hash, json_path)
    files = manifest.files
    schema = samples_schema(manifest.format_version)
    samples = tuple(_checked(path, name, schema, integrity) for name in files.samples)
    shards = _checked(path, files.shards, SHARDS_SCHEMA, integrity)
    bins = _checked(path, files.bins, BINS_SCHEMA, integrity) if files.bins is not None else None
    copies = _checked(path, files.copies, COPIES_SCHEMA, integrity) if files.copies is not None else None
    _check_rows(samples, manifest.totals.documents, "documents")
    _check_rows((shards,), manifest.totals.shards, "shards")
    return CheckedBundle(
        path=path,
        manifest=manifest,
        shards=shards,
        samples=samples,
        bins=bins,
        copies=copies,
        sealed=integrity is not None,
    )


def read_row_group(reader: pq.ParquetFile, file: Path, group: int, columns: list[str]) -> pa.Table:
    """Row group ``group`` of a bundle file; one that does not decode (a damaged data page, which the checks at
    opening cannot see) is one ``PlanFormatError`` naming the file."""
    try:
        return reader.read_row_group(group, columns=columns)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise PlanFormatError(
            f"{file} row group {group} must be readable Parquet, got {one_line(exc)} — {DAMAGED}"
        ) from exc


def _checked(plan_dir: Path, name: str, schema: pa.Schema, integrity: Integrity | None) -> CheckedFile:
    """The bundle file ``name`` (relative to ``plan_dir``: ``samples/part-00001.parquet`` for a part), checked."""
    path = plan_dir / name
    if not path.is_file():
        got = "a directory" if path.is_dir() else "nothing there"
        raise PlanFormatError(
            f"plan bundle file {path} must exist, got {got} — the bundle is incomplete; restore the file or re-plan"
        )
    try:
        footer = read_footer(path)
    except OSError as exc:  # the file system's refusal (permissions, I/O): the file may be whole
        raise PlanFormatError(
            f"{path} must be readable, got {one_line(exc)} — check its permissions and the disk, or re-plan"
        ) from exc
    except ValueError as exc:
        raise PlanFormatError(f"{path} must be a complete Parquet file, got {one_line(exc)} — {DAMAGED}") from exc
    try:
        metadata = footer.metadata()
        arrow_schema = metadata.schema.to_arrow_schema()
    except (OSError, ValueError, pa.ArrowException) as exc:  # a footer that does not parse
        raise PlanFormatError(f"{path} must be a complete Parquet file, got {one_line(exc)} — {DAMAGED}") from exc
    check_schema(arrow_schema, schema, path)
    if integrity is not None:
        try:
            check_file(path, footer, metadata, integrity.files.get(name))
        except (OSError, ValueError) as exc:
            raise PlanFormatError(f"{path} must be a complete Parquet file, got {one_line(exc)} — {DAMAGED}") from exc
    return CheckedFile(path=path, size=footer.size, fingerprint=footer.fingerprint, metadata=metadata)


def _check_rows(files: tuple[CheckedFile, ...], want: int, what: str) -> None:
    got = sum(f.rows for f in files)
    if got != want:
        names = ", ".join(str(f.path) for f in files)
        raise PlanFormatError(
            f"{names} must hold the plan's {want} {what} (plan.json totals.{what}), got {got} rows — it is not this "
            "plan's file; restore the bundle's own file or re-plan"
        )
