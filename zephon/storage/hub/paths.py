"""Zephon's ``hf://`` dataset paths: parsing, validation and the canonical string form.

Grammar (the contract of the product README)::

    hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}

A path names a *dataset split*, never a file. After ``hf://`` the path has three or four ``/``-separated
segments:

* ``org`` and ``name`` — the dataset repository ``org/name`` on the Hub. The ``name`` segment may carry a
  suffix ``@revision``, ``@~source`` or ``@revision~source``:

  - ``revision`` is a branch, a tag or a 40-hex commit sha (default: the ``main`` branch). It may contain
    letters, digits, ``.``, ``-`` and ``_``. A revision with a slash, such as the Hub's conversion branch
    ``refs/convert/parquet`` or a branch called ``feature/x``, **cannot be expressed**: the slash would be read
    as a segment separator. Use ``~parquet`` to read the conversion branch, or pin the branch's commit sha.
  - ``source`` is ``original`` (files uploaded to the repository) or ``parquet`` (the Hub's automatic
    Parquet conversion). Absent, the resolver picks uploaded files when their format is supported and the
    conversion otherwise (see :mod:`zephon.storage.hub.client`).

* three segments: ``org/name/split``; four segments: ``org/name/config/split``.

``str(HfPath)`` is canonical: ``@`` appears only when a revision or a source is set, and parsing the string
gives back an equal :class:`HfPath`. File paths in the ``hf://datasets/{org}/{name}/...`` form used by pandas,
Polars and DuckDB are refused with a message that shows the Zephon form.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from zephon.errors import ConfigError

__all__ = ["SOURCES", "HfPath", "is_commit_sha", "is_hf_path", "parse_hf_path"]

SCHEME = "hf://"
SOURCES: tuple[str, ...] = ("original", "parquet")
GRAMMAR = "hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}"

# Repository ids follow the Hub's rules: letters, digits, '.', '-', '_'; no leading/trailing '.' or '-'.
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_CONFIG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
# Split names as the `datasets` library accepts them: word characters, optionally dot-separated.
_SPLIT = re.compile(r"\w+(?:\.\w+)*", re.ASCII)
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
# A segment that looks like a file or a glob: the caller passed a file path, not a split.
_FILE_LIKE = re.compile(r"[*?\[]|\.(?:parquet|arrow|jsonl?|csv|tsv|txt|gz|zst|zip)$")


def is_hf_path(text: object) -> bool:
    """True when ``text`` is a string in the ``hf://`` scheme (it may still be malformed)."""
    return isinstance(text, str) and text.startswith(SCHEME)


def is_commit_sha(revision: str | None) -> bool:
    """True when ``revision`` is a full 40-hex (lower-case) commit sha."""
    return revision is not None and _COMMIT_SHA.fullmatch(revision) is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class HfPath:
    """A parsed ``hf://`` dataset path. Construct with :func:`parse_hf_path` or directly (validated)."""

    org: str
    name: str
    revision: str | None = None
    source: str | None = None
    config: str | None = None
    split: str

    def __post_init__(self) -> None:
        where = f"hf:// path field of {self.org}/{self.name}"
        _check_repo_part("org", self.org, where)
        _check_repo_part("name", self.name, where)
        if self.revision is not None:
            _check_revision(self.revision, where)
        if self.source is not None:
            _check_source(self.source, where)
        if self.config is not None:
            _check_config(self.config, where)
        _check_split(self.split, where)

    @property
    def repo_id(self) -> str:
        """The Hub repository id, ``org/name``."""
        return f"{self.org}/{self.name}"

    @property
    def is_pinned(self) -> bool:
        """True when the revision is a commit sha and the source is explicit (as ``zephon.storage.hub.client``
        pins)."""
        return is_commit_sha(self.revision) and self.source is not None

    def __str__(self) -> str:
        text = f"{SCHEME}{self.org}/{self.name}"
        if self.revision is not None or self.source is not None:
            text += "@" + (self.revision or "") + (f"~{self.source}" if self.source else "")
        if self.config is not None:
            text += f"/{self.config}"
        return f"{text}/{self.split}"


def parse_hf_path(text: str) -> HfPath:
    """Parse ``hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}`` into an :class:`HfPath`.

    Raises :class:`~zephon.errors.ConfigError` naming the wrong part: a missing scheme or split, an empty
    segment, an ``@`` with nothing after it, an unknown ``~source``, too many segments (a revision with ``/``
    or a file path), characters outside the allowed sets, or the ``hf://datasets/...`` file-path form.
    """
    if not isinstance(text, str):
        raise ConfigError(
            f"hf:// path must be a string, got {type(text).__name__} — pass e.g. "
            f"'hf://HuggingFaceFW/fineweb-edu/sample-10BT/train'"
        )
    if not text.startswith(SCHEME):
        raise ConfigError(f"hf:// path must start with 'hf://', got {text!r} — write it as {GRAMMAR}")
    body = text[len(SCHEME) :]
    segments = body.split("/")
    if segments[0] == "datasets":
        raise ConfigError(_datasets_form_message(text, "/".join(segments[1:])))
    names = ("org", "name", "config", "split") if len(segments) == 4 else ("org", "name", "split")
    for index, segment in enumerate(segments):
        if not segment:
            part = names[index] if index < len(names) else f"segment {index + 1}"
            raise ConfigError(
                f"hf:// path segments must be non-empty, got an empty {part} in {text!r} — write it as {GRAMMAR}"
            )
    if len(segments) == 1:
        raise ConfigError(
            f"hf:// path must name a dataset and a split, got only the organization in {text!r} — write "
            f"'hf://{segments[0]}/{{name}}/{{split}}', e.g. 'hf://{segments[0]}/NAME/train'"
        )
    if len(segments) == 2:
        raise ConfigError(
            f"hf:// path must name a split, got {text!r} — append '/{{split}}' "
            f"(and '/{{config}}' before it when the dataset has several configs), "
            f"e.g. 'hf://{'/'.join(segments)}/train'"
        )
    if len(segments) > 4:
        hint = "; read branch refs/convert/parquet with @~parquet" if "@refs/convert/parquet" in text else ""
        raise ConfigError(
            f"hf:// path must have at most 4 segments (org/name/config/split), got "
            f"{len(segments)} in {text!r} — revisions cannot contain '/' and paths name a split, "
            f"not a file{hint}; write it as {GRAMMAR}"
        )
    org, name_spec = segments[0], segments[1]
    config, split = (segments[2], segments[3]) if len(segments) == 4 else (None, segments[2])
    name, revision, source = _split_name_spec(name_spec, text)
    _check_repo_part("org", org, text)
    _check_repo_part("name", name, text)
    if config is not None:
        _check_config(config, text)
    _check_split(split, text)
    return HfPath(org=org, name=name, revision=revision, source=source, config=config, split=split)


def _split_name_spec(spec: str, text: str) -> tuple[str, str | None, str | None]:
    if "@" not in spec:
        if "~" in spec:
            raise ConfigError(
                f"hf:// source must follow '@' (as in 'name@~parquet'), got {spec!r} in "
                f"{text!r} — write {spec.replace('~', '@~', 1)!r}"
            )
        return spec, None, None
    name, _, suffix = spec.partition("@")
    if "@" in suffix:
        raise ConfigError(
            f"hf:// path must contain at most one '@', got {spec!r} in {text!r} — write name@revision~source"
        )
    if not suffix:
        raise ConfigError(
            f"hf:// '@' must be followed by a revision and/or '~source', got nothing in "
            f"{text!r} — remove the '@' or write e.g. '{name}@main' or '{name}@~parquet'"
        )
    revision_part, tilde, source_part = suffix.partition("~")
    if tilde and "~" in source_part:
        raise ConfigError(
            f"hf:// path must contain at most one '~source', got {suffix!r} in {text!r} — "
            f"write @revision~original or @revision~parquet"
        )
    revision = revision_part or None
    if revision is not None:
        _check_revision(revision, text)
    source: str | None = None
    if tilde:
        _check_source(source_part, text)
        source = source_part
    return name, revision, source


def _check_repo_part(part: str, value: str, where: str) -> None:
    if (
        not isinstance(value, str)
        or _REPO_PART.fullmatch(value) is None
        or ".." in value
        or "--" in value
        or len(value) > 96
    ):
        raise ConfigError(
            f"hf:// {part} must be letters, digits, '.', '-', '_' (not starting or ending with "
            f"'.' or '-', at most 96 characters), got {value!r} in {where!r} — fix the {part}"
        )


def _check_revision(value: str, where: str) -> None:
    if not isinstance(value, str) or _REVISION.fullmatch(value) is None or ".." in value:
        raise ConfigError(
            f"hf:// revision must be a branch, tag or commit sha made of letters, digits, "
            f"'.', '-', '_', got {value!r} in {where!r} — revisions with '/' cannot be written "
            f"in a path; pin the commit sha instead"
        )


def _check_source(value: str, where: str) -> None:
    if value not in SOURCES:
        raise ConfigError(
            f"hf:// source must be one of {', '.join(SOURCES)}, got {value!r} in {where!r} — "
            f"write ~original (uploaded files) or ~parquet (the Hub's Parquet conversion)"
        )


def _check_config(value: str, where: str) -> None:
    if not isinstance(value, str) or _CONFIG.fullmatch(value) is None:
        raise ConfigError(
            f"hf:// config must be letters, digits, '.', '-', '_', '+', got {value!r} in "
            f"{where!r} — use the config name shown on the dataset page"
        )


def _check_split(value: str, where: str) -> None:
    if not isinstance(value, str) or _SPLIT.fullmatch(value) is None or _FILE_LIKE.search(value):
        hint = " (a path names a split, not a file)" if _FILE_LIKE.search(str(value)) else ""
        raise ConfigError(
            f"hf:// split must be a split name such as 'train' (letters, digits, '_', '.'), "
            f"got {value!r} in {where!r}{hint} — write it as {GRAMMAR}"
        )


def _datasets_form_message(text: str, rest: str) -> str:
    """The refusal for ``hf://datasets/...``, with the Zephon form when it can be derived mechanically."""
    suggestion = "hf://{org}/{name}/[{config}/]{split}"
    segments = rest.split("/")
    if not any(_FILE_LIKE.search(segment) for segment in segments):
        with contextlib.suppress(ConfigError):
            suggestion = str(parse_hf_path(SCHEME + rest))
    return (
        f"hf:// Zephon paths must name a dataset split, not a file, got the hf://datasets/ file-path form "
        f"{text!r} — use {suggestion}, not {text}"
    )
