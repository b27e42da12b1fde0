"""Config and split discovery for Hugging Face Hub dataset repositories (pure functions, no network).

:mod:`zephon.storage.hub.client` lists a repository at a pinned commit and calls these functions to decide which files
make up ``{config}/{split}``. The rules follow the Hub's conventions, kept to a documented subset:

**Uploaded files, README ``configs:``.** When the dataset card's YAML front matter has ``configs:``, each
entry is a config: ``config_name`` (default ``"default"``), ``default: true`` to mark the default config, and
``data_files`` as one of

* a string or a list of strings — glob patterns of the ``train`` split;
* a list of ``{split: ..., path: str | [str, ...]}`` mappings;
* a mapping ``{split: str | [str, ...]}``;

or, instead of ``data_files``, ``data_dir: some/dir`` (the layout rules below applied inside that
directory). Patterns are relative to the repository root; ``*`` and ``?`` stay inside one path segment,
``**`` crosses segments, ``[...]`` is a character class.

**Uploaded files, no ``configs:``.** Data files are those with a data extension (``.parquet``, ``.arrow``,
``.jsonl``, ``.json``, ``.ndjson``, ``.csv``, ``.tsv``, ``.txt``, each optionally ``.gz``/``.zst``/``.bz2``/
``.xz``), not hidden (no segment starts with ``.``). Split keywords map to canonical split names:
``train``/``training`` → train, ``validation``/``valid``/``val``/``dev`` → validation,
``test``/``testing``/``eval``/``evaluation`` → test. The first rule that assigns any file wins:

1. one config ``default``: ``{split}/**``, ``data/{split}/**``, ``{split}[-._0-9]*`` and
   ``data/{split}[-._0-9]*`` (the keyword is the first token of the file name);
2. one config per top-level directory ``{config}`` (other than ``data``): ``{config}/{split}/**`` and
   ``{config}/{split}[-._0-9]*``;
3. one config ``default``: a keyword anywhere as a directory name or as a ``-._ 0-9``-separated token of the
   file name (``*{split}*``);
4. one config ``default`` whose ``train`` split is every data file.

**The Hub's Parquet conversion** (branch ``refs/convert/parquet``): ``{config}/{split}/NNNN.parquet``. The
Hub writes ``{config}/partial-{split}/NNNN.parquet`` when it converted only the first part of a big split;
those are reported under the split name ``partial-{split}`` so the resolver can refuse them explicitly.
The older flat layout (``{config}/{name}-{split}.parquet``) is not supported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from zephon.errors import HubError
from zephon.storage.hub.paths import HfPath
from zephon.storage.local import detect_format

__all__ = [
    "SUPPORTED_FORMATS",
    "CardConfig",
    "Layout",
    "card_configs",
    "conversion_layout",
    "default_layout",
    "dir_layout",
    "file_format",
    "glob_to_regex",
    "is_data_file",
    "listing_prefix",
    "match_patterns",
    "pick_config",
    "pick_split",
    "select_conversion",
    "select_original",
]

SUPPORTED_FORMATS: tuple[str, ...] = ("parquet", "jsonl", "jsonl.gz", "jsonl.zst", "tar", "tar.gz")
Layout = dict[str, dict[str, list[str]]]  # config -> split -> sorted repo paths
Entries = Mapping[str, object]  # repo path -> listing entry (huggingface_hub RepoFile)

_DATA_EXT = re.compile(r"\.(?:parquet|arrow|jsonl|json|ndjson|csv|tsv|txt|tar)(?:\.(?:gz|zst|bz2|xz))?$|\.tgz$", re.I)
_SPLIT_KEYWORDS: dict[str, str] = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
    "testing": "test",
    "eval": "test",
    "evaluation": "test",
}
_TOKEN_SEP = re.compile(r"[-._ 0-9]+")


def file_format(path: str) -> str | None:
    """The Zephon shard format of a repo path (one of :data:`SUPPORTED_FORMATS`), or None if unsupported: the
    names local and object-store paths read (``zephon.storage.local.detect_format``: ``.ndjson``, ``.pq``, and
    C4's and Dolma's ``.json.gz`` JSON lines too), so an upload Zephon reads elsewhere is read from the Hub."""
    return detect_format(path)


def is_data_file(path: str) -> bool:
    """True for non-hidden files with a data extension (supported by Zephon or not)."""
    return _DATA_EXT.search(path) is not None and not any(part.startswith(".") for part in path.split("/"))


@dataclass(frozen=True, kw_only=True, slots=True)
class CardConfig:
    """One entry of a dataset card's ``configs:`` list."""

    name: str
    data_files: dict[str, tuple[str, ...]] | None  # split -> glob patterns; None when data_dir/default rules
    data_dir: str | None = None
    default: bool = False


def card_configs(card: Mapping[str, object] | None, dataset: str) -> list[CardConfig]:
    """Parse ``configs:`` of a dataset card (the README's YAML front matter); ``[]`` when absent."""
    raw = (card or {}).get("configs")
    if raw is None:
        return []
    fix = "fix the configs: section of the dataset card (README.md), or read the conversion with @~parquet"
    if not isinstance(raw, list) or not all(isinstance(item, Mapping) for item in raw):
        raise HubError(
            f"README.md configs of dataset {dataset} must be a list of mappings, got {type(raw).__name__} — {fix}"
        )
    configs: list[CardConfig] = []
    for item in raw:
        name = str(item.get("config_name", "default"))
        data_dir = item.get("data_dir")
        data_files = _parse_data_files(item.get("data_files"), dataset, name, fix)
        configs.append(
            CardConfig(
                name=name,
                data_files=data_files,
                data_dir=str(data_dir).strip("/") if data_dir else None,
                default=item.get("default") is True,
            )
        )
    names = [config.name for config in configs]
    if len(set(names)) != len(names):
        raise HubError(f"README.md config names of dataset {dataset} must be unique, got {names} — {fix}")
    return configs


def _parse_data_files(raw: object, dataset: str, config: str, fix: str) -> dict[str, tuple[str, ...]] | None:
    def patterns(value: object) -> tuple[str, ...]:
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise HubError(
            f"README.md data_files of config {config!r} of dataset {dataset} must be a glob "
            f"pattern or a list of them, got {value!r} — {fix}"
        )

    if raw is None:
        return None
    if isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(v, str) for v in raw)):
        return {"train": patterns(raw)}
    result: dict[str, tuple[str, ...]] = {}
    if isinstance(raw, Mapping):
        for split, value in raw.items():
            result[str(split)] = result.get(str(split), ()) + patterns(value)
        return result
    if isinstance(raw, list):
        for entry in raw:
            if not isinstance(entry, Mapping) or "path" not in entry:
                raise HubError(
                    f"README.md data_files entries of config {config!r} of dataset {dataset} "
                    f"must be mappings with split and path, got {entry!r} — {fix}"
                )
            split = str(entry.get("split", "train"))
            result[split] = result.get(split, ()) + patterns(entry["path"])
        return result
    raise HubError(
        f"README.md data_files of config {config!r} of dataset {dataset} must be a pattern, a "
        f"list or a mapping, got {type(raw).__name__} — {fix}"
    )


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Compile a Hub ``data_files`` glob (``*``, ``?``, ``**``, ``[...]``) to a full-match regex."""
    text = pattern.removeprefix("./").lstrip("/")
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif text.startswith("**", i):
            out.append(".*")
            i += 2
        elif text[i] == "*":
            out.append("[^/]*")
            i += 1
        elif text[i] == "?":
            out.append("[^/]")
            i += 1
        elif text[i] == "[" and (end := text.find("]", i + 2)) != -1:
            body = text[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(text[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def match_patterns(patterns: Iterable[str], paths: Iterable[str]) -> list[str]:
    """Sorted repo paths matching any of ``patterns``."""
    regexes = [glob_to_regex(p) for p in patterns]
    return sorted(p for p in paths if any(r.match(p) for r in regexes))


def listing_prefix(patterns: Iterable[str]) -> str:
    """The deepest directory holding every match of ``patterns`` ("" = repository root).

    Lets the resolver list only ``sample/10BT/`` of a repository with thousands of files.
    """
    prefixes: list[list[str]] = []
    for pattern in patterns:
        parts = pattern.removeprefix("./").lstrip("/").split("/")
        fixed: list[str] = []
        for part in parts[:-1]:
            if any(c in part for c in "*?["):
                break
            fixed.append(part)
        prefixes.append(fixed)
    if not prefixes:
        return ""
    common = prefixes[0]
    for other in prefixes[1:]:
        n = 0
        while n < min(len(common), len(other)) and common[n] == other[n]:
            n += 1
        common = common[:n]
    return "/".join(common)


def _first_token(name: str) -> str | None:
    tokens = [t for t in _TOKEN_SEP.split(name) if t]
    return _SPLIT_KEYWORDS.get(tokens[0]) if tokens else None


def _any_token(name: str) -> str | None:
    for token in _TOKEN_SEP.split(name):
        if token in _SPLIT_KEYWORDS:
            return _SPLIT_KEYWORDS[token]
    return None


def _split_at_top(parts: list[str]) -> str | None:
    """Rule 1 on path parts relative to a base: {split}/**, data/{split}/**, {split}-*, data/{split}-*."""
    if parts[0] == "data" and len(parts) > 1:
        parts = parts[1:]
    if len(parts) > 1:
        return _SPLIT_KEYWORDS.get(parts[0])
    return _first_token(parts[0])


def _split_anywhere(parts: list[str]) -> str | None:
    for directory in parts[:-1]:
        if directory in _SPLIT_KEYWORDS:
            return _SPLIT_KEYWORDS[directory]
    return _any_token(parts[-1])


def _assign(paths: list[str], base: str, rule: object) -> dict[str, list[str]]:
    splits: dict[str, list[str]] = {}
    for path in paths:
        rel = path[len(base) + 1 :] if base else path
        split = rule(rel.split("/"))  # type: ignore[operator]
        if split is not None:
            splits.setdefault(split, []).append(path)
    return {split: sorted(files) for split, files in sorted(splits.items())}


def dir_layout(paths: Iterable[str], base: str = "") -> dict[str, list[str]]:
    """Split -> files for the data files under ``base`` (rules 1, 3 and 4 of the module docstring)."""
    prefix = base.strip("/")
    files = sorted(p for p in paths if is_data_file(p) and (not prefix or p.startswith(prefix + "/")))
    if not files:
        return {}
    for rule in (_split_at_top, _split_anywhere):
        splits = _assign(files, prefix, rule)
        if splits:
            return splits
    return {"train": files}


def default_layout(paths: Iterable[str]) -> Layout:
    """Config -> split -> files for a repository without ``configs:`` (rules 1-4 of the module docstring)."""
    files = sorted(p for p in paths if is_data_file(p))
    if not files:
        return {}
    splits = _assign(files, "", _split_at_top)
    if splits:
        return {"default": splits}
    layout: Layout = {}
    for top in sorted({p.split("/", 1)[0] for p in files if "/" in p} - {"data"}):
        under = [p for p in files if p.startswith(top + "/")]
        top_splits = _assign(under, top, _split_at_top)
        if top_splits:
            layout[top] = top_splits
    if layout:
        return layout
    return {"default": dir_layout(files)}


def conversion_layout(paths: Iterable[str]) -> Layout:
    """Config -> split -> files of the Hub's Parquet conversion: ``{config}/{split}/NNNN.parquet``."""
    layout: Layout = {}
    for path in sorted(paths):
        parts = path.split("/")
        if len(parts) == 3 and parts[2].endswith(".parquet") and not parts[0].startswith("."):
            layout.setdefault(parts[0], {}).setdefault(parts[1], []).append(path)
    return layout


# -- choosing config, split and files for a path ---------------------------------------------------------
def pick_config(hf: HfPath, available: list[str], defaults: Sequence[str] = ()) -> str:
    """The path's config; required when there are several (``defaults``: the card's ``default: true``)."""
    if hf.config in available or (hf.config is None and len(available) == 1):
        return hf.config or available[0]
    example = replace(hf, config=defaults[0] if defaults else available[0])
    if hf.config is None:
        marked = " (the card's default config)" if defaults else ""
        raise HubError(
            f"config of dataset {hf.repo_id} must be given, it has {len(available)} configs: "
            f"{', '.join(available)} — write e.g. {example}{marked}"
        )
    got = ", ".join(available)
    raise HubError(f"config of dataset {hf.repo_id} must be one of {got}, got {hf.config!r} — write e.g. {example}")


def pick_split(hf: HfPath, config: str, available: list[str]) -> str:
    if hf.split in available:
        return hf.split
    example = replace(hf, split=available[0]) if available else hf
    raise HubError(
        f"split of dataset {hf.repo_id} config {config!r} must be one of {', '.join(available) or '(none)'}, "
        f"got {hf.split!r} — write e.g. {example}"
    )


def select_original(
    hf: HfPath, commit: str, card: Mapping[str, object], list_files: Callable[[str], Entries]
) -> tuple[str, str, list[str], Entries]:
    """(config, split, paths, entries) of uploaded files; ``list_files(prefix)`` lists the tree at ``commit``."""
    configs = card_configs(card, hf.repo_id)
    if not configs:
        entries = list_files("")
        layout = default_layout(entries)
        if not layout:
            raise HubError(
                f"dataset {hf.repo_id} at commit {commit} must contain data files, got none — "
                f"check the repository, or read the Hub's Parquet conversion with @~parquet"
            )
        config = pick_config(hf, sorted(layout))
        return config, (split := pick_split(hf, config, sorted(layout[config]))), layout[config][split], entries
    config = pick_config(hf, [c.name for c in configs], [c.name for c in configs if c.default])
    spec = next(c for c in configs if c.name == config)
    if spec.data_files is None:
        entries = list_files(spec.data_dir or "")
        splits = dir_layout(entries, spec.data_dir or "")
        return config, (split := pick_split(hf, config, sorted(splits))), splits[split], entries
    split = pick_split(hf, config, sorted(spec.data_files))
    patterns = spec.data_files[split]
    entries = list_files(listing_prefix(patterns))
    paths = match_patterns(patterns, entries)
    if not paths:
        raise HubError(
            f"data_files {list(patterns)} of dataset {hf.repo_id} config {config!r} split {split!r} must "
            f"match files at commit {commit}, got none — fix the dataset card or use @~parquet"
        )
    return config, split, paths, entries


def select_conversion(hf: HfPath, commit: str, entries: Entries, prefer: str | None) -> tuple[str, str, list[str]]:
    """(config, split, paths) in the Parquet conversion; ``prefer``: the config chosen on uploaded files."""
    layout = conversion_layout(entries)
    if not layout:
        raise HubError(
            f"Parquet conversion of dataset {hf.repo_id} at commit {commit} must contain "
            f"{{config}}/{{split}}/NNNN.parquet files, got none — read uploaded files with ~original"
        )
    config = prefer if hf.config is None and prefer in layout else pick_config(hf, sorted(layout))
    splits = layout[str(config)]
    if hf.split not in splits and f"partial-{hf.split}" in splits:
        raise HubError(
            f"Parquet conversion of dataset {hf.repo_id} config {config!r} split {hf.split!r} must be "
            f"complete, got only partial-{hf.split} (the Hub converted just the first part) — read the "
            f"uploaded files with ~original"
        )
    split = pick_split(hf, str(config), sorted(splits))
    return str(config), split, splits[split]
