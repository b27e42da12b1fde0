"""CONFIG files: a work source written as YAML or TOML, mirroring the Python API (``zephon plan CONFIG``).

A CONFIG file holds the arguments of ``StaticMixtureWorkSource`` as plain data::

    seed: 42
    datasets:
      - {name: prose, path: data/prose/*.parquet}   # relative: against this file's directory
      - {name: code, path: data/code}
      # - {name: web_hq, path: data/web, where: "int_score >= 4", metadata: scores/, key: id,
      #    order_by: "difficulty DESC", order_window: 1024, dedup_on: cluster_id}   # docs/curricula.md
    mixture: {prose: 0.7, code: 0.3}
    num_documents: 10000                            # or epochs: 2 (neither: epochs 1)
    on_exhaustion: new_epoch                        # or stop
    shuffle: {enabled: true, window_shards: 4}
    # token mixtures and exact plans (see docs/plans.md):
    # token_estimation: {primer: measure, calibration_samples: 2048, calibration_shards_max: 4}
    # exact_tokens: true
    # tokenizer: {id: gpt2, field: text}                # needed by token mixtures and exact plans
    # packing: {max_length: 2049, algorithm: wrap}      # needed by exact plans (wrap | best_fit)
    # records with costs (docs/records.md#costs-and-packing-samples): `cost: "..."` on every dataset (or a computed
    # cost, `cost: {function: "mypkg.costs:image_cost"}`), then
    # mixture_unit: cost, num_cost: 1000000, pack_samples: {max_cost: 4096, oversize: refuse}

becomes ``StaticMixtureWorkSource(datasets=[Dataset.from_path("prose", "<dir>/data/prose/*.parquet"), ...],
mixture=MixtureSpec({"prose": 0.7, "code": 0.3}), seed=42, num_documents=10000, ...)``.

Rules:

* The format follows the suffix: ``.yaml``/``.yml`` (YAML, duplicate keys refused) or ``.toml``.
* Unknown keys are refused with the allowed keys and, when one is close, a suggestion; ``null`` for an
  optional key means its default.
* A relative dataset path resolves against the CONFIG file's directory, never the working directory, so a
  config and its data move together; ``hf://`` and other ``scheme://`` paths, absolute paths and ``~`` paths
  are kept as written.
* Every error is a ``ConfigError`` that names the file once, at the start (as given, normalized), in the form
  "config.yaml: `seed` must be an integer ≥ 0, got string '42' — write e.g. `seed: 42`".
  Values are checked before any dataset path is listed.

``work_source_from_dict`` applies the same rules to a dict (notebooks, tests, other front ends).

This module reads and parses the file (``read_config``) and assembles its top level into a work source; each
section (``datasets``, ``mixture``, ``shuffle``, ``phases``, ``tokenizer``, ...) is checked and built by
``zephon.recipe.config_sections``, which also words the errors.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zephon.errors import ConfigError, ZephonError
from zephon.recipe.config_sections import (
    check_keys,
    dataset_entries,
    describe,
    in_file,
    optional_integer,
    parse_mixture,
    parse_packing,
    parse_phases,
    parse_sample_packing,
    parse_shuffle,
    parse_token_estimation,
    parse_tokenizer,
    require_integer,
    type_error,
)
from zephon.recipe.dataset import Dataset
from zephon.recipe.work_source import MixtureSpec
from zephon.specs import PackSpec, SamplePackSpec, TokenizeSpec
from zephon.storage.local import display_missing
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
    "mixture_unit",
    "num_cost",
    "pack_samples",
)
_REQUIRED_KEYS = ("seed", "datasets", "mixture")
_ON_EXHAUSTION = ("new_epoch", "stop")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanConfig:
    """A CONFIG file's work source plus the tokenizer and packing that token and exact plans need."""

    source: StaticMixtureWorkSource
    tokenize: TokenizeSpec | None
    pack: PackSpec | None
    #: ``pack_samples:``: records grouped into rows by cost (``Pipeline.pack_samples``); None without it.
    sample_pack: SamplePackSpec | None = None


def load_work_source(path: str | os.PathLike[str]) -> StaticMixtureWorkSource:
    """Build the work source described by a ``.yaml``/``.yml``/``.toml`` CONFIG file."""
    return load_plan_config(path).source


def load_plan_config(path: str | os.PathLike[str]) -> PlanConfig:
    """The work source, tokenizer (``tokenizer:``) and packing (``packing:``) of a CONFIG file."""
    data = read_config(path)
    base_dir = Path(os.path.abspath(os.fspath(path))).parent
    origin = _origin(path)
    source = work_source_from_dict(data, base_dir=base_dir, origin=origin)
    try:
        return PlanConfig(
            source=source,
            tokenize=parse_tokenizer(data.get("tokenizer"), base_dir, origin),
            pack=parse_packing(data.get("packing"), origin),
            sample_pack=parse_sample_packing(data.get("pack_samples"), origin),
        )
    except ZephonError as exc:
        raise in_file(origin, exc) from exc


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a CONFIG file into a dict (no validation of its keys yet); refuse unknown suffixes."""
    origin = _origin(path)
    suffix = Path(origin).suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ConfigError(
            f"CONFIG file name must end in {', '.join(CONFIG_SUFFIXES)}, got {origin!r} — rename it to .yaml or .toml"
        )
    try:
        text = Path(os.fspath(path)).read_text(encoding="utf-8")  # as given: `origin` is for messages
    except FileNotFoundError as exc:
        raise ConfigError(f"CONFIG file must exist, got nothing at {display_missing(path)!r} — fix the path") from exc
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
            f"{origin} must hold a mapping of settings (seed, datasets, mixture, ...), got {describe(data)} — "
            "see docs/cli.md for an example"
        )
    return data


def _origin(path: str | os.PathLike[str]) -> str:
    """The CONFIG file as its errors name it: as given, normalized (``conf/../x.yaml`` → ``x.yaml``)."""
    return os.path.normpath(os.fspath(path))


def work_source_from_dict(data: Mapping[str, Any], *, base_dir: Path, origin: str) -> StaticMixtureWorkSource:
    """Build a work source from CONFIG data; ``base_dir`` anchors relative paths, ``origin`` names the source."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin} must hold a mapping of settings, got {describe(data)} — pass a dict")
    check_keys(data, _TOP_KEYS, origin, "top-level")
    for key in _REQUIRED_KEYS:
        if data.get(key) is None:
            raise ConfigError(f"{origin}: `{key}` must be set, got nothing — add it (see docs/cli.md)")

    seed = require_integer(data["seed"], "seed", 0, origin, "write e.g. `seed: 42`")
    entries = dataset_entries(data["datasets"], base_dir, origin)
    weights = parse_mixture(data["mixture"], origin)
    num_documents = optional_integer(data, "num_documents", origin)
    epochs = optional_integer(data, "epochs", origin)
    on_exhaustion = data.get("on_exhaustion")
    if on_exhaustion is None:
        on_exhaustion = "new_epoch"
    elif on_exhaustion not in _ON_EXHAUSTION:
        raise type_error(origin, "on_exhaustion", '"new_epoch" or "stop"', on_exhaustion, "use one of them")
    shuffle = parse_shuffle(data.get("shuffle"), origin)
    token_estimation = parse_token_estimation(data.get("token_estimation"), origin)
    num_tokens = optional_integer(data, "num_tokens", origin)
    lanes = data.get("lanes")
    lanes = None if lanes is None else require_integer(lanes, "lanes", 1, origin, "write e.g. `lanes: 64`")
    phases = parse_phases(data.get("phases"), origin)
    num_cost = optional_integer(data, "num_cost", origin)
    mixture_unit = data.get("mixture_unit")
    if mixture_unit is not None and mixture_unit != "cost":
        raise type_error(origin, "mixture_unit", '"cost"', mixture_unit, "write `mixture_unit: cost` or leave it out")
    exact_tokens = data.get("exact_tokens")
    if exact_tokens is not None and not isinstance(exact_tokens, bool):
        raise type_error(origin, "exact_tokens", "true or false", exact_tokens, "write true or false")

    try:
        datasets = [Dataset.from_path(name, path, **selection) for name, path, selection in entries]
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
            mixture_unit=mixture_unit,
            num_cost=num_cost,
        )
    except ZephonError as exc:
        raise in_file(origin, exc) from exc


# ----------------------------------------------------------------------------------------------------
# YAML: the parser's problem as one line, and a loader that refuses duplicate keys
# ----------------------------------------------------------------------------------------------------


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
