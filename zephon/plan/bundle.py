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

A big plan's samples parts (``samples/part-*.parquet``, ``zephon.plan.format.SAMPLES_PART_ROWS`` rows each but the
last) are checked when they are opened, not all at once: opening the bundle checks the first part, that plan.json
lists the parts ``totals.documents`` needs at the first part's rows each, and that each exists (with a record: at
its recorded size), one ``stat`` each; steps 3 and 4 run on another part the first time a reader asks for its
footer (``CheckedFile.metadata``), which also checks that it holds the rows the rule gives it. So a rank that
seeks into a plan of 10^10 documents parses the footers of the first part and of the part it reads (~2,048 row
groups each), not 75 footers of 152,588 row groups in all, and its memory does not grow with the plan.

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
from zephon.plan.footer import ParquetFooter, read_footer
from zephon.plan.format import (
    BINS_SCHEMA,
    COPIES_SCHEMA,
    SHARDS_SCHEMA,
    check_schema,
    samples_part,
    samples_schema,
)
from zephon.plan.integrity import Integrity, check_config_hash, check_file, check_plan_json
from zephon.plan.manifest import Manifest, parse_manifest, read_plan_json

__all__ = ["DAMAGED", "CheckedBundle", "CheckedFile", "open_bundle", "read_row_group"]

DAMAGED = "the file is truncated or damaged; restore it or re-plan"


class CheckedFile:
    """A Parquet file of the bundle, checked: its path, size, footer fingerprint and parsed footer.

    A samples part (made with ``rows``: what the part rule gives it) is checked the first time its footer is asked
    for, and its rows with it; every other file is checked when the bundle is opened (``check``)."""

    __slots__ = ("_footer", "_integrity", "_metadata", "_rows", "_schema", "name", "path")

    def __init__(
        self, plan_dir: Path, name: str, schema: pa.Schema, integrity: Integrity | None, rows: int | None = None
    ) -> None:
        #: The name plan.json's ``files`` gives it (relative to the bundle: ``samples/part-00001.parquet``).
        self.name = name
        self.path = plan_dir / name
        self._schema = schema
        self._integrity = integrity
        #: A part's rows by the part rule (checked when its footer is read); ``None``: read from the footer.
        self._rows = rows
        self._footer: ParquetFooter | None = None
        self._metadata: pq.FileMetaData | None = None

    def check(self) -> CheckedFile:
        """Read and check the footer (steps 3 and 4 of the module docstring), once; return ``self``."""
        if self._metadata is None:
            self._footer, self._metadata = _check(self.path, self.name, self._schema, self._integrity)
            if self._rows is not None and self._metadata.num_rows != self._rows:
                raise PlanFormatError(
                    f"{self.path} must hold {self._rows} documents (a part of a plan's samples: as many as the "
                    f"first part, the last the rest), got {self._metadata.num_rows} rows — {DAMAGED}"
                )
        return self

    @property
    def checked(self) -> bool:
        """Whether the footer has been read and checked (a samples part: only once a reader asked for it)."""
        return self._metadata is not None

    @property
    def metadata(self) -> pq.FileMetaData:
        self.check()
        assert self._metadata is not None
        return self._metadata

    @property
    def size(self) -> int:
        self.check()
        assert self._footer is not None
        return self._footer.size

    @property
    def fingerprint(self) -> str:
        """``pqfooter:`` fingerprint of the file (``zephon.plan.footer``)."""
        self.check()
        assert self._footer is not None
        return self._footer.fingerprint

    @property
    def rows(self) -> int:
        """Rows of the file (a part's without reading its footer)."""
        return self._rows if self._rows is not None else int(self.metadata.num_rows)

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
    if len(files.samples) > 1:
        samples = _parts(path, files.samples, schema, integrity, manifest.totals.documents, json_path)
    else:
        samples = tuple(CheckedFile(path, name, schema, integrity).check() for name in files.samples)
        _check_rows(samples, manifest.totals.documents, "documents")
    shards = CheckedFile(path, files.shards, SHARDS_SCHEMA, integrity).check()
    bins = CheckedFile(path, files.bins, BINS_SCHEMA, integrity).check() if files.bins is not None else None
    copies = CheckedFile(path, files.copies, COPIES_SCHEMA, integrity).check() if files.copies is not None else None
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


def _check(
    path: Path, name: str, schema: pa.Schema, integrity: Integrity | None
) -> tuple[ParquetFooter, pq.FileMetaData]:
    """The footer of the bundle file ``name`` at ``path``, read and checked (steps 3 and 4)."""
    _exists(path)
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
            check_file(path, footer, metadata, integrity.files.get(name), name=name)
        except (OSError, ValueError) as exc:
            raise PlanFormatError(f"{path} must be a complete Parquet file, got {one_line(exc)} — {DAMAGED}") from exc
    return footer, metadata


def _exists(path: Path) -> None:
    if not path.is_file():
        got = "a directory" if path.is_dir() else "nothing there"
        raise PlanFormatError(
            f"plan bundle file {path} must exist, got {got} — the bundle is incomplete; restore the file or re-plan"
        )


def _parts(
    plan_dir: Path,
    names: tuple[str, ...],
    schema: pa.Schema,
    integrity: Integrity | None,
    documents: int,
    json_path: Path,
) -> tuple[CheckedFile, ...]:
    """A big plan's samples parts, each to be checked when opened but the first: every part holds as many rows as
    the first (``SAMPLES_PART_ROWS`` as written) but the last, so plan.json must list the names that rule gives for
    ``documents``, and each must exist (at its recorded size), one stat each."""
    first = CheckedFile(plan_dir, names[0], schema, integrity).check()
    part_rows = max(first.rows, 1)
    count = -(-documents // part_rows)
    want = [samples_part(k) for k in range(count)]
    if list(names) != want:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise PlanFormatError(
            f"{json_path} key 'files.samples' must list the {count} parts {want[0]} ... {want[-1]} of "
            f"{documents} documents ({part_rows} each, as the first), got {len(names)} names [{shown}] — restore "
            "the bundle's plan.json and samples/ or re-plan"
        )
    parts = [first]
    for k, name in enumerate(names[1:], start=1):
        rows = min(part_rows, documents - k * part_rows)
        part = CheckedFile(plan_dir, name, schema, integrity, rows)
        _exists(part.path)
        record = integrity.files.get(name) if integrity is not None else None
        if integrity is not None and record is None:
            raise PlanFormatError(
                f"{json_path} key 'integrity.files' must list {name}, got no entry — restore the bundle's plan.json "
                "or re-plan"
            )
        if record is not None and (size := part.path.stat().st_size) != record.bytes:
            raise PlanFormatError(
                f"{part.path} must be the file the plan was written with ({record.bytes} bytes), got {size} bytes — "
                "it changed since planning; restore the bundle's own file or re-plan"
            )
        parts.append(part)
    return tuple(parts)


def _check_rows(files: tuple[CheckedFile, ...], want: int, what: str) -> None:
    got = sum(f.rows for f in files)
    if got != want:
        names = ", ".join(str(f.path) for f in files)
        raise PlanFormatError(
            f"{names} must hold the plan's {want} {what} (plan.json totals.{what}), got {got} rows — it is not this "
            "plan's file; restore the bundle's own file or re-plan"
        )
