"""The sections of a CONFIG file (``zephon.config_file``), each checked and turned into a recipe value.

Every ``parse_*`` function takes one section as plain data (what YAML or TOML parsed), checks it and returns
the recipe or spec value it describes: ``datasets`` → ``(name, path)`` pairs, ``mixture`` → weights,
``shuffle`` → ``ShuffleSpec``, ``token_estimation`` → ``TokenEstimation``, ``phases`` → ``Phase`` list,
``tokenizer`` → ``TokenizeSpec``, ``packing`` → ``PackSpec``. ``null`` (None) for an optional section means
its default.

The checks below them word every error the same way — a ``ConfigError`` that starts with ``origin`` (the
file name): "config.yaml: `seed` must be an integer ≥ 0, got string '42' — write e.g. `seed: 42`". Unknown
keys are refused with the allowed keys and, when one is close, a suggestion.

Nothing here reads a file or lists a dataset's shards: ``zephon.config_file`` reads the file and assembles
the work source from these pieces.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zephon.checks import is_int, is_number
from zephon.errors import ConfigError, ZephonError
from zephon.keywords import did_you_mean
from zephon.recipe.computed_cost import ComputedCost
from zephon.recipe.work_source import MixtureSpec, Phase, ShuffleSpec, TokenEstimation
from zephon.specs import ChatSpec, PackSpec, SamplePackSpec, TokenizeSpec
from zephon.storage.local import display_missing, looks_like_local_path

__all__ = [
    "check_keys",
    "dataset_entries",
    "describe",
    "in_file",
    "optional_integer",
    "parse_datasets",
    "parse_mixture",
    "parse_packing",
    "parse_phases",
    "parse_sample_packing",
    "parse_shuffle",
    "parse_token_estimation",
    "parse_tokenizer",
    "require_integer",
    "type_error",
]

_DATASET_KEYS = ("name", "path")
#: Optional keys of a dataset entry: its selection by metadata (``zephon.recipe.selection``).
_SELECTION_KEYS = ("where", "metadata", "key", "order_by", "order_window", "dedup_on")
#: Optional keys of a dataset entry that is a token store (``zephon.recipe.token_store``): strings, then integers.
_STORE_KEYS = ("fmt", "tokenizer", "tokens_field", "dtype")
#: Optional key of a dataset entry of records: each sample's cost, a DuckDB expression (docs/records.md).
_RECORD_KEYS = ("cost",)
#: Keys of a computed cost (``cost: {function: ..., expression: ...}``; ``zephon.recipe.computed_cost``).
_COMPUTED_KEYS = ("function", "expression")
_STORE_IDS = ("eos_token_id", "bos_token_id")
_SHUFFLE_KEYS = ("enabled", "window_shards")
_TOKEN_KEYS = ("primer", "calibration_samples", "calibration_shards_max", "token_count_columns")
_TOKENIZER_KEYS = ("id", "field", "add_bos", "eos_token", "special_tokens", "max_tokens", "long_documents", "chat")
_CHAT_KEYS = ("layout", "chat_template", "loss_on")
_PACKING_KEYS = ("max_length", "algorithm", "oversize")
_SAMPLE_PACKING_KEYS = ("max_cost", "algorithm", "oversize")
_PHASE_KEYS = ("start", "unit", "mixture", "global_batch_size")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_ALGORITHMS = ("wrap", "best_fit", "homogeneous")
_OVERSIZE = ("split", "drop")


# ----------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------


def parse_datasets(value: Any, base_dir: Path, origin: str) -> list[tuple[str, str]]:
    """``(name, resolved path)`` per entry of ``datasets`` (``dataset_entries`` adds each selection)."""
    return [(name, path) for name, path, _ in dataset_entries(value, base_dir, origin)]


def dataset_entries(value: Any, base_dir: Path, origin: str) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, resolved path, keywords)`` per entry of ``datasets``: the keywords are ``Dataset.from_path``'s
    ``where``, ``metadata`` (resolved like ``path``), ``key``, ``order_by``, ``order_window`` and ``dedup_on``,
    and a token store's ``fmt``, ``tokenizer``, ``tokens_field``, ``dtype``, ``eos_token_id``, ``bos_token_id``
    (docs/token-stores.md), and a record's ``cost``, those given only."""
    if not isinstance(value, list) or not value:
        raise type_error(
            origin, "datasets", "a non-empty list of {name, path} entries", value, "add `- {name: web, path: data/web}`"
        )
    entries = []
    for index, entry in enumerate(value):
        key = f"datasets[{index}]"
        if not isinstance(entry, Mapping):
            raise type_error(origin, key, "a mapping with `name` and `path`", entry, "write `{name: web, path: ...}`")
        check_keys(entry, _DATASET_KEYS + _SELECTION_KEYS + _STORE_KEYS + _STORE_IDS + _RECORD_KEYS, origin, f"`{key}`")
        for field in _DATASET_KEYS:
            if not isinstance(entry.get(field), str) or not entry[field]:
                raise type_error(origin, f"{key}.{field}", "a non-empty string", entry.get(field), "quote it")
        selection: dict[str, Any] = {}
        for field in _SELECTION_KEYS:
            item = entry.get(field)
            if item is None:
                continue
            if field == "order_window":
                item = require_integer(item, f"{key}.order_window", 1, origin, "write e.g. `order_window: 1024`")
            elif not isinstance(item, str) or not item.strip():
                raise type_error(origin, f"{key}.{field}", "a non-empty string", item, 'write e.g. "int_score >= 3"')
            selection[field] = _resolve_path(item, base_dir) if field == "metadata" else item
        cost = entry.get("cost")
        if isinstance(cost, Mapping):  # a computed cost: `cost: {function: "mypkg.costs:fn", expression: ...}`
            check_keys(cost, _COMPUTED_KEYS, origin, f"`{key}.cost`")
            if not isinstance(cost.get("function"), str):
                raise type_error(
                    origin, f"{key}.cost.function", "an import path 'module:name'", cost.get("function"),
                    'write e.g. `cost: {function: "mypkg.costs:image_cost"}`',
                )  # fmt: skip
            try:
                selection["cost"] = ComputedCost(function=cost["function"], expression=cost.get("expression"))
            except ConfigError as exc:
                raise ConfigError(f"{origin}: `{key}.cost`: {exc}") from None
        for field in _STORE_KEYS + (() if isinstance(cost, Mapping) else _RECORD_KEYS):
            item = entry.get(field)
            if item is not None and (not isinstance(item, str) or not item.strip()):
                raise type_error(origin, f"{key}.{field}", "a non-empty string", item, "write e.g. `fmt: megatron`")
            if item is not None:
                selection[field] = item
        for field in _STORE_IDS:
            if entry.get(field) is not None:
                fix = f"write e.g. `{field}: 2`"
                selection[field] = require_integer(entry[field], f"{key}.{field}", 0, origin, fix)
        entries.append((entry["name"], _resolve_path(entry["path"], base_dir), selection))
    return entries


def parse_mixture(value: Any, origin: str, key: str = "mixture") -> dict[str, float]:
    """The weights of ``mixture`` (or of a phase's mixture, ``key`` ``phases[0].mixture``), by dataset name."""
    if not isinstance(value, Mapping) or not value:
        raise type_error(
            origin, key, "a non-empty mapping of dataset name to weight", value, "write `{web: 0.7, code: 0.3}`"
        )
    for name, weight in value.items():
        if not isinstance(name, str):
            fix = f'quote the name: "{name}"'
            if isinstance(name, bool):
                fix = 'quote names that YAML reads as booleans (yes, no, on, off, true, false), e.g. "no": 0.3'
            raise type_error(origin, key, "keyed by dataset names", name, fix)
        if not is_number(weight, finite=True):
            raise type_error(origin, f"{key}.{name}", "a number", weight, "write e.g. 0.7")
    return dict(value)


def parse_shuffle(value: Any, origin: str) -> ShuffleSpec:
    """``shuffle``: the default ``ShuffleSpec`` when absent."""
    if value is None:
        return ShuffleSpec()
    if not isinstance(value, Mapping):
        raise type_error(origin, "shuffle", "a mapping", value, "write `{enabled: true, window_shards: 4}`")
    check_keys(value, _SHUFFLE_KEYS, origin, "`shuffle`")
    kwargs: dict[str, Any] = {}
    if value.get("enabled") is not None:
        if not isinstance(value["enabled"], bool):
            raise type_error(origin, "shuffle.enabled", "true or false", value["enabled"], "write true or false")
        kwargs["enabled"] = value["enabled"]
    if value.get("window_shards") is not None:
        kwargs["window_shards"] = require_integer(
            value["window_shards"], "shuffle.window_shards", 1, origin, "write e.g. `window_shards: 4`"
        )
    return ShuffleSpec(**kwargs)


def parse_token_estimation(value: Any, origin: str) -> TokenEstimation | None:
    """``token_estimation`` (None when absent)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise type_error(origin, "token_estimation", "a mapping", value, "write `{primer: measure}`")
    check_keys(value, _TOKEN_KEYS, origin, "`token_estimation`")
    kwargs: dict[str, Any] = {}
    primer = value.get("primer")
    if primer is not None:
        valid = primer == "measure" or is_number(primer, finite=True)
        if isinstance(primer, Mapping):
            valid = all(isinstance(k, str) and is_number(v, finite=True) for k, v in primer.items())
            primer = dict(primer)
        if not valid:
            raise type_error(
                origin,
                "token_estimation.primer",
                '"measure", a tokens-per-byte number or a mapping of dataset name to number',
                primer,
                "use one of them",
            )
        kwargs["primer"] = primer
    columns = value.get("token_count_columns")
    if columns is not None:
        if not isinstance(columns, Mapping) or not all(isinstance(v, str) for v in columns.values()):
            raise type_error(
                origin,
                "token_estimation.token_count_columns",
                "a mapping of dataset name to column",
                columns,
                "write `{fineweb: token_count}`",
            )
        kwargs["token_count_columns"] = dict(columns)
    for key in _TOKEN_KEYS[1:3]:
        if value.get(key) is not None:
            kwargs[key] = require_integer(value[key], f"token_estimation.{key}", 1, origin, f"write e.g. `{key}: 4`")
    return TokenEstimation(**kwargs)


def parse_phases(value: Any, origin: str) -> list[Phase]:
    """``phases`` (an empty list when absent)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise type_error(
            origin,
            "phases",
            "a list of {start, mixture, unit}",
            value,
            "write `- {start: 0.9, mixture: {web: 0.5, math: 0.5}}`",
        )
    out = []
    for index, entry in enumerate(value):
        key = f"phases[{index}]"
        if not isinstance(entry, Mapping):
            raise type_error(origin, key, "a mapping with `start` and `mixture`", entry, "write `{start: 0.9, ...}`")
        check_keys(entry, _PHASE_KEYS, origin, f"`{key}`")
        if not is_number(entry.get("start"), finite=True):
            raise type_error(origin, f"{key}.start", "a number", entry.get("start"), "write e.g. `start: 0.9`")
        weights = parse_mixture(entry.get("mixture"), origin, f"{key}.mixture")
        try:
            out.append(
                Phase(
                    start=entry["start"],
                    mixture=MixtureSpec(weights),
                    unit=entry.get("unit") or "fraction",
                    global_batch_size=entry.get("global_batch_size"),
                )
            )
        except ZephonError as exc:
            raise in_file(origin, exc, f"`{key}`") from exc
    return out


def parse_tokenizer(value: Any, base_dir: Path, origin: str) -> TokenizeSpec | None:
    """``tokenizer`` (None when absent); an ``id`` naming a path next to the CONFIG file resolves to it."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("id"), str):
        raise type_error(origin, "tokenizer", "a mapping with an `id`", value, "write `{id: gpt2, field: text}`")
    check_keys(value, _TOKENIZER_KEYS, origin, "`tokenizer`")
    tokenizer_id = value["id"]
    local = Path(tokenizer_id).expanduser()
    if not local.is_absolute() and (base_dir / local).exists():
        tokenizer_id = str(base_dir / local)  # a local tokenizer next to the CONFIG file
    elif looks_like_local_path(tokenizer_id) and not local.exists():
        where = display_missing(local if local.is_absolute() else base_dir / local)
        raise ConfigError(
            f"{origin}: `tokenizer.id` must be an existing directory or tokenizer.json, or a Hub id, got path "
            f"{where} which does not exist — fix the path (a relative one is read from the CONFIG file's directory)"
        )
    field = value.get("field")
    if field is not None and (not isinstance(field, str) or not field):
        raise type_error(origin, "tokenizer.field", "a non-empty string", field, "write e.g. `field: text`")
    if value.get("add_bos") is not None and not isinstance(value["add_bos"], bool):
        raise type_error(origin, "tokenizer.add_bos", "true, false or null", value["add_bos"], "write one of them")
    eos = value.get("eos_token")
    if eos is not None and (not isinstance(eos, str) or not eos):
        raise type_error(origin, "tokenizer.eos_token", "a token string", eos, 'write e.g. `eos_token: "</s>"`')
    chat = value.get("chat")
    if chat is not None:  # tokenize_chat: {layout, chat_template, loss_on} (docs/operators.md)
        if not isinstance(chat, Mapping):
            raise type_error(origin, "tokenizer.chat", "a mapping", chat, "write e.g. `chat: {layout: alpaca}`")
        check_keys(chat, _CHAT_KEYS, origin, "`tokenizer.chat`")
    try:
        chat_spec = ChatSpec(**chat) if chat is not None else None
        return TokenizeSpec(  # field None: "text", or the chat layout's column (specs.CHAT_FIELDS)
            tokenizer_id=tokenizer_id,
            field=field or None,
            add_bos=value.get("add_bos"),
            eos_token=eos,
            special_tokens=value.get("special_tokens"),
            max_tokens=value.get("max_tokens"),
            long_documents=value.get("long_documents", "truncate"),
            chat=chat_spec,
        )
    except ConfigError as exc:
        raise ConfigError(f"{origin}: `tokenizer`: {exc}") from exc


def parse_packing(value: Any, origin: str) -> PackSpec | None:
    """``packing`` (None when absent)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise type_error(origin, "packing", "a mapping", value, "write `{max_length: 2049, algorithm: wrap}`")
    check_keys(value, _PACKING_KEYS, origin, "`packing`")
    max_length = require_integer(
        value.get("max_length"), "packing.max_length", 2, origin, "write e.g. `max_length: 2049`"
    )
    algorithm, oversize = value.get("algorithm") or "wrap", value.get("oversize") or "split"
    if algorithm not in _ALGORITHMS:
        raise type_error(
            origin, "packing.algorithm", '"wrap", "best_fit" or "homogeneous"', algorithm, "use one of them"
        )
    if oversize not in _OVERSIZE:
        raise type_error(origin, "packing.oversize", '"split" or "drop"', oversize, "use one of them")
    return PackSpec(max_length=max_length, algorithm=algorithm, oversize=oversize)


def parse_sample_packing(value: Any, origin: str) -> SamplePackSpec | None:
    """``pack_samples`` (None when absent): ``Pipeline.pack_samples``'s settings (docs/records.md)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise type_error(origin, "pack_samples", "a mapping", value, "write `{max_cost: 4096}`")
    check_keys(value, _SAMPLE_PACKING_KEYS, origin, "`pack_samples`")
    max_cost = require_integer(value.get("max_cost"), "pack_samples.max_cost", 1, origin, "write e.g. `max_cost: 4096`")
    algorithm, oversize = value.get("algorithm") or "best_fit", value.get("oversize") or "refuse"
    if algorithm != "best_fit":
        raise type_error(origin, "pack_samples.algorithm", '"best_fit"', algorithm, "write best_fit")
    if oversize not in ("refuse", "drop"):
        raise type_error(origin, "pack_samples.oversize", '"refuse" or "drop"', oversize, "use one of them")
    return SamplePackSpec(max_cost=max_cost, algorithm=algorithm, oversize=oversize)


# ----------------------------------------------------------------------------------------------------
# Checks and messages
# ----------------------------------------------------------------------------------------------------


def _resolve_path(path: str, base_dir: Path) -> str:
    """Anchor a relative local path at ``base_dir``; keep URLs, absolute and ``~`` paths as written."""
    if _URL.match(path) or os.path.isabs(os.path.expanduser(path)):
        return path
    return str(Path(os.path.abspath(base_dir)) / path)


def check_keys(mapping: Mapping[Any, Any], allowed: Sequence[str], origin: str, scope: str) -> None:
    """Refuse a key of ``mapping`` not in ``allowed``, suggesting the closest allowed one."""
    for key in mapping:
        if key in allowed:
            continue
        raise ConfigError(
            f"{origin}: {scope} keys must be among {', '.join(allowed)}, got unknown `{key}`"
            f"{did_you_mean(key, allowed)} — fix the spelling or remove it"
        )


def require_integer(value: Any, key: str, minimum: int, origin: str, fix: str) -> int:
    """``value`` when it is an integer ≥ ``minimum`` (booleans are not integers here)."""
    if not is_int(value) or value < minimum:
        raise type_error(origin, key, f"an integer ≥ {minimum}", value, fix)
    return value


def optional_integer(data: Mapping[str, Any], key: str, origin: str) -> int | None:
    """``data[key]`` as an integer ≥ 1, or None when absent or null."""
    value = data.get(key)
    return None if value is None else require_integer(value, key, 1, origin, f"write e.g. `{key}: 2` or remove it")


def in_file(origin: str, exc: ZephonError, scope: str = "") -> ConfigError:
    """``exc`` as a CONFIG error that names the file once: "origin: scope: message", or the message as it is
    when it already starts with the file name (a section's own checks word it that way)."""
    message = str(exc)
    if message.startswith((f"{origin}: ", f"{origin} ")):
        return ConfigError(message)
    return ConfigError(f"{origin}: {scope}: {message}" if scope else f"{origin}: {message}")


def type_error(origin: str, key: str, want: str, got: Any, fix: str) -> ConfigError:
    """The error for a value of the wrong kind: "origin: `key` must be want, got ... — fix"."""
    return ConfigError(f"{origin}: `{key}` must be {want}, got {describe(got)} — {fix}")


def describe(value: Any) -> str:
    """A value as a CONFIG author wrote it: its YAML/TOML kind and a short repr."""
    if value is None:
        return "null (or nothing)"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, Mapping):
        return f"a mapping with keys {sorted(map(str, value))}"
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    kind = {int: "integer", float: "number", str: "string"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"
