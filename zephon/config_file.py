"""CONFIG files: a work source written as YAML or TOML, mirroring the Python API (``zephon plan CONFIG``).

A CONFIG file holds the arguments of ``StaticMixtureWorkSource`` as plain data::

    seed: 42
    datasets:
      - {name: prose, path: data/prose/*.parquet}   # relative: against this file's directory
      - {name: code, path: data/code}
    mixture: {prose: 0.7, code: 0.3}
    num_documents: 10000                            # or epochs: 2 (neither: epochs 1)
    on_exhaustion: new_epoch                        # or stop
    shuffle: {enabled: true, window_shards: 4}
    # token mixtures and exact plans (see docs/plans.md):
    # token_estimation: {primer: measure, calibration_samples: 2048, calibration_shards_max: 4}
    # exact_tokens: true
    # tokenizer: {id: gpt2, field: text}                # needed by token mixtures and exact plans
    # packing: {max_length: 2049, algorithm: wrap}      # needed by exact plans (wrap | best_fit)

becomes ``StaticMixtureWorkSource(datasets=[Dataset.from_path("prose", "<dir>/data/prose/*.parquet"), ...],
mixture=MixtureSpec({"prose": 0.7, "code": 0.3}), seed=42, num_documents=10000, ...)``.

Rules:

* The format follows the suffix: ``.yaml``/``.yml`` (YAML, duplicate keys refused) or ``.toml``.
* Unknown keys are refused with the allowed keys and, when one is close, a suggestion; ``null`` for an
  optional key means its default.
* A relative dataset path resolves against the CONFIG file's directory, never the working directory, so a
  config and its data move together; ``hf://`` and other ``scheme://`` paths, absolute paths and ``~`` paths
  are kept as written.
* Every error is a ``ConfigError`` that starts with the file name, in the form
  "config.yaml: `seed` must be an integer ≥ 0, got string '42' — write e.g. `seed: 42`".
  Values are checked before any dataset path is listed.

``work_source_from_dict`` applies the same rules to a dict (notebooks, tests, other front ends).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zephon.errors import ConfigError, ZephonError
from zephon.recipe.dataset import Dataset
from zephon.recipe.work_source import MixtureSpec, Phase, ShuffleSpec, TokenEstimation
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import StaticMixtureWorkSource

__all__ = [
    "CONFIG_SUFFIXES",
    "PlanConfig",
    "load_plan_config",
    "load_work_source",
    "read_config",
    "work_source_from_dict",
]

CONFIG_SUFFIXES = (".yaml", ".yml", ".toml")

_TOP_KEYS = (
    "seed",
    "datasets",
    "mixture",
    "num_documents",
    "epochs",
    "on_exhaustion",
    "shuffle",
    "token_estimation",
    "num_tokens",
    "exact_tokens",
    "tokenizer",
    "packing",
    "lanes",
    "phases",
)
_REQUIRED_KEYS = ("seed", "datasets", "mixture")
_DATASET_KEYS = ("name", "path")
_SHUFFLE_KEYS = ("enabled", "window_shards")
_TOKEN_KEYS = ("primer", "calibration_samples", "calibration_shards_max", "token_count_columns")
_TOKENIZER_KEYS = ("id", "field", "add_bos", "eos_token")
_PACKING_KEYS = ("max_length", "algorithm", "oversize")
_PHASE_KEYS = ("start", "unit", "mixture", "global_batch_size")
_ON_EXHAUSTION = ("new_epoch", "stop")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanConfig:
    """A CONFIG file's work source plus the tokenizer and packing that token and exact plans need."""

    source: StaticMixtureWorkSource
    tokenize: TokenizeSpec | None
    pack: PackSpec | None


def load_work_source(path: str | os.PathLike[str]) -> StaticMixtureWorkSource:
    """Build the work source described by a ``.yaml``/``.yml``/``.toml`` CONFIG file."""
    return load_plan_config(path).source


def load_plan_config(path: str | os.PathLike[str]) -> PlanConfig:
    """The work source, tokenizer (``tokenizer:``) and packing (``packing:``) of a CONFIG file."""
    data = read_config(path)
    base_dir = Path(os.path.abspath(os.fspath(path))).parent
    origin = os.fspath(path)
    source = work_source_from_dict(data, base_dir=base_dir, origin=origin)
    try:
        return PlanConfig(
            source=source,
            tokenize=_tokenizer(data.get("tokenizer"), base_dir, origin),
            pack=_packing(data.get("packing"), origin),
        )
    except ZephonError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a CONFIG file into a dict (no validation of its keys yet); refuse unknown suffixes."""
    origin = os.fspath(path)
    suffix = Path(origin).suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ConfigError(
            f"CONFIG file name must end in {', '.join(CONFIG_SUFFIXES)}, got {origin!r} — rename it to .yaml or .toml"
        )
    try:
        text = Path(origin).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"CONFIG file must exist, got nothing at {origin!r} — fix the path") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"CONFIG file {origin!r} must be readable UTF-8 text, got {exc} — fix the file") from exc
    kind = "TOML" if suffix == ".toml" else "YAML"
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        else:
            # _StrictLoader is a yaml.SafeLoader subclass: plain data only, no Python objects.
            data = yaml.load(text, Loader=_StrictLoader)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin} must be valid TOML, got {exc} — fix the syntax") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin} must be valid YAML, got {_yaml_problem(exc)} — fix the syntax") from exc
    except RecursionError as exc:  # e.g. "[[[[..." thousands deep: the parsers recurse per level
        raise ConfigError(
            f"{origin} must be {kind} nested a few levels deep, got nesting too deep to parse — fix it"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{origin} must hold a mapping of settings (seed, datasets, mixture, ...), got {_describe(data)} — "
            "see docs/cli.md for an example"
        )
    return data


def work_source_from_dict(data: Mapping[str, Any], *, base_dir: Path, origin: str) -> StaticMixtureWorkSource:
    """Build a work source from CONFIG data; ``base_dir`` anchors relative paths, ``origin`` names the source."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin} must hold a mapping of settings, got {_describe(data)} — pass a dict")
    _check_keys(data, _TOP_KEYS, origin, "top-level")
    for key in _REQUIRED_KEYS:
        if data.get(key) is None:
            raise ConfigError(f"{origin}: `{key}` must be set, got nothing — add it (see docs/cli.md)")

    seed = _integer(data["seed"], "seed", 0, origin, "write e.g. `seed: 42`")
    entries = _datasets(data["datasets"], base_dir, origin)
    weights = _mixture(data["mixture"], origin)
    num_documents = _optional_integer(data, "num_documents", origin)
    epochs = _optional_integer(data, "epochs", origin)
    on_exhaustion = data.get("on_exhaustion")
    if on_exhaustion is None:
        on_exhaustion = "new_epoch"
    elif on_exhaustion not in _ON_EXHAUSTION:
        raise _type_error(origin, "on_exhaustion", '"new_epoch" or "stop"', on_exhaustion, "use one of them")
    shuffle = _shuffle(data.get("shuffle"), origin)
    token_estimation = _token_estimation(data.get("token_estimation"), origin)
    num_tokens = _optional_integer(data, "num_tokens", origin)
    lanes = data.get("lanes")
    lanes = 8 if lanes is None else _integer(lanes, "lanes", 1, origin, "write e.g. `lanes: 64`")
    phases = _phases(data.get("phases"), origin)
    exact_tokens = data.get("exact_tokens")
    if exact_tokens is not None and not isinstance(exact_tokens, bool):
        raise _type_error(origin, "exact_tokens", "true or false", exact_tokens, "write true or false")

    try:
        datasets = [Dataset.from_path(name, path) for name, path in entries]
        return StaticMixtureWorkSource(
            datasets=datasets,
            mixture=MixtureSpec(weights),
            seed=seed,
            token_estimation=token_estimation,
            num_documents=num_documents,
            epochs=epochs,
            on_exhaustion=on_exhaustion,
            shuffle=shuffle,
            num_tokens=num_tokens,
            exact_tokens=bool(exact_tokens),
            lanes=lanes,
            phases=phases,
        )
    except ZephonError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc


# ----------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------


def _datasets(value: Any, base_dir: Path, origin: str) -> list[tuple[str, str]]:
    """``(name, resolved path)`` per entry of ``datasets``."""
    if not isinstance(value, list) or not value:
        raise _type_error(
            origin, "datasets", "a non-empty list of {name, path} entries", value, "add `- {name: web, path: data/web}`"
        )
    entries = []
    for index, entry in enumerate(value):
        key = f"datasets[{index}]"
        if not isinstance(entry, Mapping):
            raise _type_error(origin, key, "a mapping with `name` and `path`", entry, "write `{name: web, path: ...}`")
        _check_keys(entry, _DATASET_KEYS, origin, f"`{key}`")
        for field in _DATASET_KEYS:
            if not isinstance(entry.get(field), str) or not entry[field]:
                raise _type_error(origin, f"{key}.{field}", "a non-empty string", entry.get(field), "quote it")
        entries.append((entry["name"], _resolve_path(entry["path"], base_dir)))
    return entries


def _mixture(value: Any, origin: str) -> dict[str, float]:
    if not isinstance(value, Mapping) or not value:
        raise _type_error(
            origin, "mixture", "a non-empty mapping of dataset name to weight", value, "write `{web: 0.7, code: 0.3}`"
        )
    for name, weight in value.items():
        if not isinstance(name, str):
            fix = f'quote the name: "{name}"'
            if isinstance(name, bool):
                fix = 'quote names that YAML reads as booleans (yes, no, on, off, true, false), e.g. "no": 0.3'
            raise _type_error(origin, "mixture", "keyed by dataset names", name, fix)
        if not _is_number(weight):
            raise _type_error(origin, f"mixture.{name}", "a number", weight, "write e.g. 0.7")
    return dict(value)


def _shuffle(value: Any, origin: str) -> ShuffleSpec:
    if value is None:
        return ShuffleSpec()
    if not isinstance(value, Mapping):
        raise _type_error(origin, "shuffle", "a mapping", value, "write `{enabled: true, window_shards: 4}`")
    _check_keys(value, _SHUFFLE_KEYS, origin, "`shuffle`")
    kwargs: dict[str, Any] = {}
    if value.get("enabled") is not None:
        if not isinstance(value["enabled"], bool):
            raise _type_error(origin, "shuffle.enabled", "true or false", value["enabled"], "write true or false")
        kwargs["enabled"] = value["enabled"]
    if value.get("window_shards") is not None:
        kwargs["window_shards"] = _integer(
            value["window_shards"], "shuffle.window_shards", 1, origin, "write e.g. `window_shards: 4`"
        )
    return ShuffleSpec(**kwargs)


def _token_estimation(value: Any, origin: str) -> TokenEstimation | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _type_error(origin, "token_estimation", "a mapping", value, "write `{primer: measure}`")
    _check_keys(value, _TOKEN_KEYS, origin, "`token_estimation`")
    kwargs: dict[str, Any] = {}
    primer = value.get("primer")
    if primer is not None:
        valid = primer == "measure" or _is_number(primer)
        if isinstance(primer, Mapping):
            valid = all(isinstance(k, str) and _is_number(v) for k, v in primer.items())
            primer = dict(primer)
        if not valid:
            raise _type_error(
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
            raise _type_error(
                origin,
                "token_estimation.token_count_columns",
                "a mapping of dataset name to column",
                columns,
                "write `{fineweb: token_count}`",
            )
        kwargs["token_count_columns"] = dict(columns)
    for key in _TOKEN_KEYS[1:3]:
        if value.get(key) is not None:
            kwargs[key] = _integer(value[key], f"token_estimation.{key}", 1, origin, f"write e.g. `{key}: 4`")
    return TokenEstimation(**kwargs)


def _phases(value: Any, origin: str) -> list[Phase]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _type_error(
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
            raise _type_error(origin, key, "a mapping with `start` and `mixture`", entry, "write `{start: 0.9, ...}`")
        _check_keys(entry, _PHASE_KEYS, origin, f"`{key}`")
        if not _is_number(entry.get("start")):
            raise _type_error(origin, f"{key}.start", "a number", entry.get("start"), "write e.g. `start: 0.9`")
        try:
            out.append(
                Phase(
                    start=entry["start"],
                    mixture=MixtureSpec(_mixture(entry.get("mixture"), origin)),
                    unit=entry.get("unit") or "fraction",
                    global_batch_size=entry.get("global_batch_size"),
                )
            )
        except ZephonError as exc:
            raise ConfigError(f"{origin}: `{key}`: {exc}") from exc
    return out


def _tokenizer(value: Any, base_dir: Path, origin: str) -> TokenizeSpec | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("id"), str):
        raise _type_error(origin, "tokenizer", "a mapping with an `id`", value, "write `{id: gpt2, field: text}`")
    _check_keys(value, _TOKENIZER_KEYS, origin, "`tokenizer`")
    tokenizer_id = value["id"]
    local = Path(tokenizer_id).expanduser()
    if not local.is_absolute() and (base_dir / local).exists():
        tokenizer_id = str(base_dir / local)  # a local tokenizer next to the CONFIG file
    return TokenizeSpec(
        tokenizer_id=tokenizer_id,
        field=value.get("field") or "text",
        add_bos=value.get("add_bos"),
        eos_token=value.get("eos_token"),
    )


def _packing(value: Any, origin: str) -> PackSpec | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _type_error(origin, "packing", "a mapping", value, "write `{max_length: 2049, algorithm: wrap}`")
    _check_keys(value, _PACKING_KEYS, origin, "`packing`")
    max_length = _integer(value.get("max_length"), "packing.max_length", 2, origin, "write e.g. `max_length: 2049`")
    return PackSpec(
        max_length=max_length, algorithm=value.get("algorithm") or "wrap", oversize=value.get("oversize") or "split"
    )


# ----------------------------------------------------------------------------------------------------
# Checks and messages
# ----------------------------------------------------------------------------------------------------


def _resolve_path(path: str, base_dir: Path) -> str:
    """Anchor a relative local path at ``base_dir``; keep URLs, absolute and ``~`` paths as written."""
    if _URL.match(path) or os.path.isabs(os.path.expanduser(path)):
        return path
    return str(Path(os.path.abspath(base_dir)) / path)


def _check_keys(mapping: Mapping[Any, Any], allowed: Sequence[str], origin: str, scope: str) -> None:
    for key in mapping:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        raise ConfigError(
            f"{origin}: {scope} keys must be among {', '.join(allowed)}, got unknown `{key}`{hint} — "
            "fix the spelling or remove it"
        )


def _integer(value: Any, key: str, minimum: int, origin: str, fix: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _type_error(origin, key, f"an integer ≥ {minimum}", value, fix)
    return value


def _optional_integer(data: Mapping[str, Any], key: str, origin: str) -> int | None:
    value = data.get(key)
    return None if value is None else _integer(value, key, 1, origin, f"write e.g. `{key}: 2` or remove it")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _type_error(origin: str, key: str, want: str, got: Any, fix: str) -> ConfigError:
    return ConfigError(f"{origin}: `{key}` must be {want}, got {_describe(got)} — {fix}")


def _describe(value: Any) -> str:
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


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys instead of keeping the last one."""


def _strict_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (each key may appear once)", key_node.start_mark
            )
        if isinstance(key, Hashable):
            seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)
