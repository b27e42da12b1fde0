"""Finding the shards of a local dataset path: a directory, a glob or a single file.

Formats are detected from file names: ``.parquet``/``.pq`` → parquet; ``.jsonl``/``.ndjson`` → jsonl;
``.jsonl.gz``/``.ndjson.gz`` → jsonl.gz; ``.jsonl.zst``/``.jsonl.zstd`` → jsonl.zst (and ``.json.gz``,
``.json.zst``: JSON lines by the name C4 and Dolma give them; a plain ``.json`` is left alone, as metadata often is
one); ``.tar`` → tar and ``.tar.gz``/``.tgz`` → tar.gz (WebDataset shards, record pipelines: docs/records.md). A
directory is listed recursively (hidden files and names starting with ``_`` or ``.`` are skipped, as Spark and Hive
writers use them for markers); shards are sorted by path, so the shard order never depends on the file system.

Two kinds of subdirectory are not listed, each named in a ``ZephonWarning``: a Zephon plan bundle (plan.json
with a ``format_version`` beside shards.parquet and samples.parquet, ``zephon.plan.format.BUNDLE_MARKER``:
a plan written into a dataset's folder is never read back as its data), and a symbolic link to a directory
already listed (a link to an ancestor, or a second path to the same files). Other links to directories are
followed, so a folder of links to shard folders is a dataset.
Parquet, JSONL and tar cannot be mixed in one dataset; JSONL files may mix compressions. In a directory, files
of other formats (README.md, checksums) are ignored when shards are present — those that look like data
(``_data_like``: an ``.arrow`` of ``datasets.save_to_disk``, a ``.json`` of JSON lines, a ``.jsonl.bz2``) are
named in a ``ZephonWarning``, never left out silently; a file named directly or matched by a glob must be a
shard.

Errors show a path in its absolute, normalized form (``display_path``: ``/a/bad/../data/nope`` is shown as
``/a/data/nope``), so the message names the place that was looked at, whatever the working directory was.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

from zephon.errors import DatasetError, warn
from zephon.plan.format import PLAN_JSON, looks_like_bundle

_SUFFIXES: tuple[tuple[str, str], ...] = (
    (".jsonl.gz", "jsonl.gz"),
    (".ndjson.gz", "jsonl.gz"),
    (".jsonl.zst", "jsonl.zst"),
    (".jsonl.zstd", "jsonl.zst"),
    (".json.gz", "jsonl.gz"),  # JSON lines by another name: C4's and Dolma's documents
    (".json.zst", "jsonl.zst"),
    (".json.zstd", "jsonl.zst"),
    (".parquet", "parquet"),
    (".pq", "parquet"),
    (".jsonl", "jsonl"),
    (".ndjson", "jsonl"),
    (".tar.gz", "tar.gz"),
    (".tgz", "tar.gz"),
    (".tar", "tar"),
)
SUPPORTED_SUFFIXES = tuple(s for s, _ in _SUFFIXES)
#: Files beside shards that look like data in a format Zephon does not read (``_data_like``): left out, as every
#: other file of a directory is, but named in a warning — data is never left out silently.
_DATA_MARKS = (".jsonl", ".ndjson", ".parquet", ".arrow", ".feather", ".csv", ".tsv", ".avro", ".orc", ".tar")
#: JSON lines named ``.json.gz``/``.json.zst`` (C4, Dolma): shards in a folder of JSONL, side files (warned about)
#: beside Parquet or tar shards, as every ``.json.gz`` was before they were read.
_JSON_ALIASES = (".json.gz", ".json.zst", ".json.zstd")
_DATA_ENDS = (".json", ".json.bz2", ".json.xz", ".npy", ".bin", ".idx", *_JSON_ALIASES)
#: Metadata datasets carry beside their data (Hugging Face's save_to_disk folders and Hub dataset repos, MDS).
_METADATA = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json", "index.json"})


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFile:
    """One shard file as found on disk (or as listed by the Hub for hf://, by an object store for s3:// ...)."""

    uri: str
    format: str
    size: int
    #: Remote shards only: the ``zephon.storage.hub.client.RemoteFile`` or the pinned
    #: ``zephon.storage.objects.reads.ObjectFile`` it stands for.
    remote: object | None = None
    #: Remote MDS shards only: the shard's ``index.json`` entry (JSON), read once with the index at listing.
    entry: str | None = None


def display_path(path: str | os.PathLike[str]) -> str:
    """A local path as errors show it: ``~`` expanded, absolute and normalized (``/a/bad/../data/nope`` →
    ``/a/data/nope``). For messages only: the path itself is used as given (``..`` after a symbolic link is
    resolved by the file system, not by this)."""
    return os.path.normpath(os.path.abspath(os.path.expanduser(os.fspath(path))))


def display_missing(path: str | os.PathLike[str]) -> str:
    """A path that does not exist, as errors show it: ``display_path``, unless that names something that does
    exist (``..`` after a missing directory or a symbolic link): then the path as given, made absolute, so the
    message never calls an existing file missing."""
    shown = display_path(path)
    if not os.path.lexists(shown):
        return shown
    given = os.path.expanduser(os.fspath(path))
    return given if os.path.isabs(given) else os.path.join(os.getcwd(), given)


def looks_like_local_path(text: str) -> bool:
    """Whether ``text`` can only be a local path, never a Hub id (``name`` or ``org/name``): it starts with
    ``.``, ``/`` or ``~``, holds a backslash or more than one ``/``, or ends in ``.json``."""
    return text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1 or text.lower().endswith(".json")


def detect_format(name: str) -> str | None:
    """Return the shard format implied by a file name, or None when it is not a supported format."""
    lower = name.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    return None


#: The refusal of ``.arrow`` files (what ``datasets.save_to_disk`` writes) says how to convert them.
_ARROW_HINT = " (Arrow files of datasets.save_to_disk: datasets.load_from_disk(DIR).to_parquet('web.parquet'))"


#: Token ids among them (Megatron's .bin/.idx, OLMo's .npy) are read as a token store of their own.
_STORE_HINT = "; token ids (.bin/.idx, .npy) are a token store: Dataset.from_path(NAME, PATH, fmt='megatron'|'olmo')"


def _data_like(uri: str) -> bool:
    """Whether a file of no supported format looks like data by its name (``_DATA_MARKS``, ``_DATA_ENDS``): a
    ``.jsonl.bz2``, an ``.arrow`` of ``datasets.save_to_disk``, a ``.json`` of JSON lines; not metadata."""
    name = uri.rsplit("/", 1)[-1].lower()
    if name in _METADATA or name.endswith(".zephon.json"):
        return False
    return any(mark in name for mark in _DATA_MARKS) or name.endswith(_DATA_ENDS)


def family(fmt: str) -> str:
    """``parquet``, ``jsonl`` (plain or compressed) or ``tar`` (WebDataset shards, plain or gzipped)."""
    return "parquet" if fmt == "parquet" else "tar" if fmt.startswith("tar") else "mds" if fmt == "mds" else "jsonl"


def discover_local_files(dataset: str, path: str) -> tuple[SourceFile, ...]:
    """List the shards of a local dataset path, with clear errors for empty, unknown or mixed inputs.

    Symbolic links to files are followed (a Hugging Face cache snapshot is a directory of links into its blob
    store), and so are links to directories, once each: a link to a directory already listed (an ancestor: a
    loop) is skipped with a warning, as is a plan bundle (see the module docstring; a glob follows Python's
    ``glob`` rules). Zephon only reads through links; nothing is written under a dataset path.
    """
    if "\0" in path:  # repr: the NUL is shown as \x00 (display_path would fail on it)
        raise DatasetError(
            f"dataset {dataset!r}: path {path!r} must not contain a NUL character, got one — fix the path"
        )
    try:
        return _discover(dataset, path)
    except OSError as exc:
        where = display_path(exc.filename if exc.filename is not None else path)
        raise DatasetError(
            f"dataset {dataset!r}: path {display_path(path)!r} must be readable, got {exc.strerror or exc} for "
            f"{where} — fix the path or its permissions"
        ) from exc


def _discover(dataset: str, path: str) -> tuple[SourceFile, ...]:
    expanded = os.path.expanduser(path)
    shown = display_path(path)
    if any(ch in expanded for ch in "*?["):
        candidates = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
        candidates = _outside_bundles(dataset, candidates)
        if not candidates:
            raise DatasetError(
                f"dataset {dataset!r}: glob {shown!r} must match at least one file, got none — check the pattern"
            )
    elif os.path.isdir(expanded) and os.path.isfile(os.path.join(expanded, "index.json")) and _record_mds(expanded):
        from zephon.storage.mds_records import mds_files

        # an MDS dataset of records (zephon.storage.mds_records)
        return tuple(SourceFile(uri=uri, format="mds", size=size) for uri, size in mds_files(dataset, expanded))
    elif os.path.isdir(expanded):
        if is_plan_bundle(expanded):
            raise DatasetError(
                f"dataset {dataset!r}: path {shown!r} must be a folder of shards, got a Zephon plan bundle — point "
                "the path at the dataset's files (a plan is not data)"
            )
        listing = list_directory(expanded)
        for skipped in listing.skipped:
            warn(f"dataset {dataset!r}: {skipped}")
        candidates = sorted(listing.files)
        if not candidates:
            got = "an empty directory"
            if listing.skipped:  # each named in its warning
                got = f"no shard files, only what was skipped ({', '.join(listing.skipped_paths)})"
            raise DatasetError(
                f"dataset {dataset!r}: directory {shown!r} must contain shard files, got {got} — "
                f"put {', '.join(SUPPORTED_SUFFIXES)} files there or fix the path"
            )
    elif os.path.isfile(expanded):
        candidates = [expanded]
    else:
        raise DatasetError(
            f"dataset {dataset!r}: path {display_missing(path)!r} must exist, got nothing there — fix the path"
        )

    listed = [SourceFile(uri=os.path.abspath(c), format="", size=os.path.getsize(c)) for c in candidates]
    return shards_of(dataset, listed, directory=os.path.isdir(expanded))


def _record_mds(folder: str) -> bool:
    from zephon.storage.mds_records import is_record_mds

    return is_record_mds(folder)


@dataclass(frozen=True, kw_only=True, slots=True)
class Listing:
    """A dataset directory's files (paths below it, links not resolved) and what was not listed, one phrase each."""

    files: tuple[str, ...]
    skipped: tuple[str, ...]
    skipped_paths: tuple[str, ...]


def _bundle_message(directory: str) -> str:
    return (
        f"skipped the plan bundle {display_path(directory)} (a Zephon plan, not data) — move plans out of dataset "
        "folders"
    )


def _outside_bundles(dataset: str, candidates: list[str]) -> list[str]:
    """The globbed files that are not a plan bundle's (its files, or its selected/ copies), a warning per bundle."""
    parents = {os.path.dirname(p) or "." for p in candidates}
    bundles = {d for d in parents | {os.path.dirname(d) or "." for d in parents} if is_plan_bundle(d)}
    for bundle in sorted(bundles):
        warn(f"dataset {dataset!r}: {_bundle_message(bundle)}")
    inside = {d for d in parents if d in bundles or (os.path.dirname(d) or ".") in bundles}
    return [p for p in candidates if (os.path.dirname(p) or ".") not in inside]


def is_plan_bundle(directory: str, names: set[str] | None = None) -> bool:
    """Whether ``directory`` (entries ``names``) is a Zephon plan bundle: the marker files, and a plan.json
    that is a JSON object with a ``format_version`` (a dataset's own plan.json beside Parquet files is data)."""
    try:
        names = set(os.listdir(directory)) if names is None else names
    except OSError:
        return False
    if not looks_like_bundle(names):
        return False
    try:
        with open(os.path.join(directory, PLAN_JSON), "rb") as f:
            head = json.loads(f.read())
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and "format_version" in head


def list_directory(root: str) -> Listing:
    """Every file under ``root`` whose path below it has no part starting with ``.`` or ``_``, in no set order.

    Real subdirectories are walked first; then links to directories, each followed unless its target is, holds
    or lies inside a directory already walked (a loop, or the same files twice). Plan bundles are not entered.
    """
    files: list[str] = []
    skipped: list[str] = []
    skipped_paths: list[str] = []
    walked: list[Path] = [Path(os.path.realpath(root))]
    links: list[str] = []
    stack = [root]
    while stack or links:
        if not stack:  # the real tree is done: follow the next link to a directory
            link = links.pop(0)
            target = Path(os.path.realpath(link))
            seen = next(
                (w for w in walked if target == w or target.is_relative_to(w) or w.is_relative_to(target)), None
            )
            if seen is not None:
                skipped.append(
                    f"skipped the linked directory {display_path(link)} → {target}: it loops to or repeats "
                    f"{seen}, already listed — remove the link or point it elsewhere"
                )
                skipped_paths.append(display_path(link))
                continue
            walked.append(target)
            stack.append(link)
        directory = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        names = {e.name for e in entries}
        if directory != root and is_plan_bundle(directory, names):
            skipped.append(_bundle_message(directory))
            skipped_paths.append(display_path(directory))
            continue
        for entry in entries:
            if entry.name.startswith((".", "_")):
                continue
            if entry.is_dir(follow_symlinks=True):
                (links if entry.is_symlink() else stack).append(entry.path)
            elif entry.is_file(follow_symlinks=True):
                files.append(entry.path)
    return Listing(files=tuple(files), skipped=tuple(skipped), skipped_paths=tuple(skipped_paths))


def alias_side_files(files: list[tuple[str, str | None]]) -> set[str]:
    """Among ``files`` (path, detected format or None), the ``.json.gz``/``.json.zst`` ones that are side files
    rather than JSON lines of the dataset: all of them when Parquet or tar shards are beside them (a
    ``stats.json.gz``), none among JSON lines (C4's shards). Local and object-store listings and Hub splits alike."""
    if not any(fmt is not None and family(fmt) != "jsonl" for _, fmt in files):
        return set()
    return {path for path, _ in files if path.lower().endswith(_JSON_ALIASES)}


def shards_of(dataset: str, listed: list[SourceFile], *, directory: bool) -> tuple[SourceFile, ...]:
    """The shards among ``listed`` (formats from their names), by the rules of the module docstring: in a
    ``directory`` other files are ignored when shards are present; a named or globbed file must be a shard;
    Parquet and JSONL do not mix. Shared by local paths and object-store prefixes."""
    found: list[SourceFile] = []
    unknown: list[str] = []
    for candidate in listed:
        fmt = detect_format(candidate.uri)
        if fmt is None:
            unknown.append(candidate.uri)
            continue
        found.append(SourceFile(uri=candidate.uri, format=fmt, size=candidate.size, remote=candidate.remote))
    side = alias_side_files([(f.uri, f.format) for f in found]) if directory else set()
    if side:  # beside Parquet or tar shards, a .json.gz is a side file, as it was
        found, unknown = [f for f in found if f.uri not in side], unknown + [f.uri for f in found if f.uri in side]
    # In a directory, side files (README.md, dataset_info.json, checksums) are common beside shards and
    # are ignored; a file named explicitly or matched by a glob must be a shard.
    if unknown and (not found or not directory):
        raise DatasetError(
            f"dataset {dataset!r}: files must be Parquet or JSONL ({', '.join(SUPPORTED_SUFFIXES)}), "
            f"got unknown format for {unknown[0]!r}"
            + (f" and {len(unknown) - 1} more" if len(unknown) > 1 else "")
            + " — convert them or point the path at the data files"
            + (_ARROW_HINT if any(u.lower().endswith(".arrow") for u in unknown) else "")
        )
    data = [uri for uri in unknown if _data_like(uri)]
    if data:
        where = os.path.dirname(data[0]) if len(data) == 1 else "the dataset's folder"
        warn(
            f"dataset {dataset!r}: {len(data)} file(s) beside its shards are not read, in a format Zephon does not "
            f"read: {', '.join(map(repr, data[:3]))}{' …' if len(data) > 3 else ''} — convert them to Parquet or "
            f"JSONL if they are data, or move them out of {where}"
            + (_STORE_HINT if any(u.lower().endswith((".bin", ".idx", ".npy")) for u in data) else "")
        )
    families = sorted({family(f.format) for f in found})
    if len(families) > 1:
        first = {fam: next(f.uri for f in found if family(f.format) == fam) for fam in families}
        raise DatasetError(
            f"dataset {dataset!r}: shards must share one format, got mixed {' and '.join(families)} "
            f"(e.g. {first[families[0]]!r} and {first[families[1]]!r}) — split them into two datasets"
        )
    return tuple(found)
