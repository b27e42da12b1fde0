"""Tests for CONFIG files (``zephon.config_file``): YAML/TOML parsing, path resolution, messages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from zephon.config_file import load_work_source, read_config, work_source_from_dict
from zephon.demo import demo_dataset_paths
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource, TokenEstimation

YAML_CONFIG = """\
seed: 42
datasets:
  - name: prose
    path: demo/prose-*.parquet
  - name: code
    path: demo/code-*.parquet
mixture: {prose: 0.7, code: 0.3}
num_documents: 500
on_exhaustion: stop
shuffle: {enabled: false, window_shards: 2}
"""

TOML_CONFIG = """\
seed = 42
num_documents = 500
on_exhaustion = "stop"
mixture = { prose = 0.7, code = 0.3 }
shuffle = { enabled = false, window_shards = 2 }

[[datasets]]
name = "prose"
path = "demo/prose-*.parquet"

[[datasets]]
name = "code"
path = "demo/code-*.parquet"
"""

ALLOWED = (
    "seed, datasets, mixture, num_documents, epochs, on_exhaustion, shuffle, token_estimation, num_tokens, "
    "exact_tokens, tokenizer, packing, lanes, phases, mixture_unit, num_cost, pack_samples"
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory holding the demo dataset under ``demo/``."""
    path = tmp_path_factory.mktemp("project")
    demo_dataset_paths(root=path)
    return path


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def _base(root: Path) -> dict[str, Any]:
    return {
        "seed": 1,
        "datasets": [
            {"name": "prose", "path": "demo/prose-*.parquet"},
            {"name": "code", "path": "demo/code-*.parquet"},
        ],
        "mixture": {"prose": 0.7, "code": 0.3},
    }


def _from_dict(root: Path, **changes: Any) -> StaticMixtureWorkSource:
    data = _base(root)
    for key, value in changes.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return work_source_from_dict(data, base_dir=root, origin="test.yaml")


_DROP = object()


# ----------------------------------------------------------------------------------------------------
# Building work sources
# ----------------------------------------------------------------------------------------------------


def test_yaml_config_builds_the_work_source_the_python_api_builds(root: Path) -> None:
    source = load_work_source(_write(root, "mix.yaml", YAML_CONFIG))
    expected = StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("prose", str(root / "demo/prose-*.parquet")),
            Dataset.from_path("code", str(root / "demo/code-*.parquet")),
        ],
        mixture=MixtureSpec({"prose": 0.7, "code": 0.3}),
        seed=42,
        num_documents=500,
        on_exhaustion="stop",
        shuffle=ShuffleSpec(enabled=False, window_shards=2),
    )
    assert source == expected


def test_toml_config_equals_the_yaml_config(root: Path) -> None:
    yaml_source = load_work_source(_write(root, "same.yml", YAML_CONFIG))
    toml_source = load_work_source(_write(root, "same.toml", TOML_CONFIG))
    assert toml_source == yaml_source


def test_relative_paths_resolve_against_the_config_directory_not_the_working_directory(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs = root / "configs"
    configs.mkdir(exist_ok=True)
    text = YAML_CONFIG.replace("path: demo/", "path: ../demo/")
    config = _write(configs, "up.yaml", text)
    monkeypatch.chdir(tmp_path)
    source = load_work_source(Path(os.path.relpath(config, tmp_path)))
    assert [ds.path for ds in source.datasets] == [
        str(configs / "../demo/prose-*.parquet"),
        str(configs / "../demo/code-*.parquet"),
    ]
    assert [len(ds.files) for ds in source.datasets] == [4, 2]


def test_absolute_and_url_paths_are_kept_as_written(root: Path) -> None:
    absolute = str(root / "demo" / "code-00000.parquet")
    source = _from_dict(root, datasets=[{"name": "prose", "path": absolute}], mixture={"prose": 1})
    assert source.datasets[0].path == absolute
    # The hf:// path reaches the Hub client as written (not anchored at the CONFIG's directory).
    with pytest.raises(ConfigError, match=r"^test\.yaml: Hub access for dataset org/web .* resolve hf://org/web/train"):
        _from_dict(root, datasets=[{"name": "web", "path": "hf://org/web/train"}], mixture={"web": 1})


def test_budget_defaults_and_nulls_mean_the_default(root: Path) -> None:
    source = _from_dict(root, num_documents=None, epochs=None, shuffle=None, on_exhaustion=None)
    assert (source.num_documents, source.epochs, source.on_exhaustion) == (None, None, "new_epoch")
    assert source.shuffle == ShuffleSpec()
    assert _from_dict(root, epochs=2).epochs == 2


def test_token_estimation_section_builds_token_estimation(root: Path) -> None:
    source = _from_dict(root, token_estimation={"primer": {"prose": 0.25, "code": 0.4}, "calibration_samples": 64})
    assert source.token_estimation == TokenEstimation(primer={"prose": 0.25, "code": 0.4}, calibration_samples=64)
    assert _from_dict(root, token_estimation={"primer": 0.3}).token_estimation == TokenEstimation(primer=0.3)


# ----------------------------------------------------------------------------------------------------
# Messages: every error is a ConfigError naming the file and the key
# ----------------------------------------------------------------------------------------------------


def test_unknown_top_level_key_names_key_file_and_allowed_keys(root: Path) -> None:
    config = _write(root, "typo.yaml", YAML_CONFIG.replace("seed:", "sede:"))
    with pytest.raises(ConfigError) as info:
        load_work_source(config)
    assert str(info.value) == (
        f"{config}: top-level keys must be among {ALLOWED}, got unknown `sede` (did you mean `seed`?) — "
        "fix the spelling or remove it"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seed": "42"}, "test.yaml: `seed` must be an integer ≥ 0, got string '42' — write e.g. `seed: 42`"),
        ({"seed": True}, "test.yaml: `seed` must be an integer ≥ 0, got boolean true — write e.g. `seed: 42`"),
        ({"seed": _DROP}, "test.yaml: `seed` must be set, got nothing — add it (see docs/cli.md)"),
        (
            {"num_documents": 1.5},
            "test.yaml: `num_documents` must be an integer ≥ 1, got number 1.5 — write e.g. `num_documents: 2` "
            "or remove it",
        ),
        ({"epochs": 0}, "test.yaml: `epochs` must be an integer ≥ 1, got integer 0 — write e.g. `epochs: 2`"),
        ({"datasets": "demo"}, "test.yaml: `datasets` must be a non-empty list of {name, path} entries, got string"),
        ({"datasets": [{"name": "prose"}]}, "test.yaml: `datasets[0].path` must be a non-empty string, got null"),
        (
            {"datasets": [{"name": 2023, "path": "x"}]},
            "test.yaml: `datasets[0].name` must be a non-empty string, got integer 2023",
        ),
        (
            {"datasets": [{"name": "prose", "path": "p", "weight": 1}]},
            "test.yaml: `datasets[0]` keys must be among name, path, where, metadata, key, order_by, order_window, dedup_on, fmt, tokenizer, tokens_field, dtype, eos_token_id, bos_token_id, cost, got unknown `weight` — fix the spelling",
        ),
        (
            {"mixture": [0.7, 0.3]},
            "test.yaml: `mixture` must be a non-empty mapping of dataset name to weight, got a list",
        ),
        ({"mixture": {"prose": "0.7", "code": 0.3}}, "test.yaml: `mixture.prose` must be a number, got string '0.7'"),
        (
            {"mixture": {"prose": 0.7, False: 0.3}},
            "test.yaml: `mixture` must be keyed by dataset names, got boolean false — quote names",
        ),
        ({"mixture": {"prose": 0.7, "code": 0}}, "test.yaml: mixture weight of 'code' must be > 0, got 0"),
        ({"mixture": {"prose": 1}}, "test.yaml: mixture must give a weight to every dataset, got none for ['code']"),
        ({"num_documents": 5, "epochs": 1}, "test.yaml: budget must be num_documents or epochs, got both"),
        (
            {"on_exhaustion": "restart"},
            'test.yaml: `on_exhaustion` must be "new_epoch" or "stop", got string \'restart\'',
        ),
        ({"shuffle": {"enabled": "maybe"}}, "test.yaml: `shuffle.enabled` must be true or false, got string 'maybe'"),
        (
            {"shuffle": {"window": 2}},
            "test.yaml: `shuffle` keys must be among enabled, window_shards, got unknown `window` "
            "(did you mean `window_shards`?)",
        ),
        ({"shuffle": {"window_shards": 0}}, "test.yaml: `shuffle.window_shards` must be an integer ≥ 1, got integer 0"),
        (
            {"token_estimation": {"primer": "guess"}},
            'test.yaml: `token_estimation.primer` must be "measure", a tokens-per-byte number',
        ),
        (
            {"token_estimation": {"calibration_samples": 0}},
            "test.yaml: `token_estimation.calibration_samples` must be an integer ≥ 1, got integer 0",
        ),
        (
            {"datasets": [{"name": "prose", "path": "nope/*.parquet"}], "mixture": {"prose": 1}},
            "test.yaml: dataset 'prose': glob '<root>/nope/*.parquet' must match at least one file, got none",
        ),
    ],
)
def test_bad_values_raise_config_error_naming_file_and_key(root: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _from_dict(root, **changes)
    assert str(info.value).startswith(message.replace("<root>", str(root)))


def test_values_are_checked_before_dataset_paths_are_listed(root: Path) -> None:
    with pytest.raises(ConfigError, match="`seed` must be"):
        _from_dict(root, seed=-1, datasets=[{"name": "prose", "path": "missing/dir"}], mixture={"prose": 1})


def test_work_source_from_dict_refuses_a_non_mapping() -> None:
    with pytest.raises(
        ConfigError, match=r"^nb must hold a mapping of settings, got a list of 2 item\(s\) — pass a dict$"
    ):
        work_source_from_dict([1, 2], base_dir=Path("."), origin="nb")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.yaml", "seed: [1\n", r"bad\.yaml must be valid YAML, got .* at line 2, column 1 — fix the syntax"),
        ("dup.yaml", "seed: 1\nseed: 2\n", r"dup\.yaml must be valid YAML, got duplicate key 'seed' .* at line 2"),
        ("bad.toml", "seed = \n", r"bad\.toml must be valid TOML, got .*line 1.* — fix the syntax"),
        ("list.yaml", "- 1\n- 2\n", r"list\.yaml must hold a mapping of settings .*, got a list of 2 item\(s\)"),
        ("empty.yml", "", r"empty\.yml must hold a mapping of settings .*, got null"),
        ("config.json", "{}", r"CONFIG file name must end in \.yaml, \.yml, \.toml, got '.*config\.json'"),
    ],
)
def test_unreadable_files_raise_config_error(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_config(_write(tmp_path, name, text))


def test_missing_file_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^CONFIG file must exist, got nothing at '.*nope\.yaml' — fix the path"):
        load_work_source(tmp_path / "nope.yaml")


def test_lanes_key_sets_the_packing_lanes(root: Path) -> None:
    assert _from_dict(root, lanes=64).lanes == 64
    assert _from_dict(root).lanes is None  # one lane per row of the run's global batch
    with pytest.raises(ConfigError, match="`lanes` must be an integer ≥ 1, got integer 0"):
        _from_dict(root, lanes=0)


def test_tokenizer_section_takes_the_operator_settings(root: Path, tokenizer_dir: str) -> None:
    from zephon.config_file import load_plan_config
    from zephon.specs import ChatSpec

    text = "seed: 1\ndatasets: [{name: prose, path: demo/prose-*.parquet}]\nmixture: {prose: 1}\n"
    chat = _write(root, "chat.yaml", text + f"tokenizer: {{id: {tokenizer_dir}, chat: {{layout: alpaca}}}}\n")
    spec = load_plan_config(chat).tokenize
    assert spec.chat == ChatSpec(layout="alpaca") and spec.field == "instruction"
    text_opts = f"tokenizer: {{id: {tokenizer_dir}, special_tokens: eos, max_tokens: 512, long_documents: split}}\n"
    spec = load_plan_config(_write(root, "opts.yaml", text + text_opts)).tokenize
    assert (spec.special_tokens, spec.max_tokens, spec.long_documents, spec.chat) == ("eos", 512, "split", None)
    bad = _write(root, "bad.yaml", text + f"tokenizer: {{id: {tokenizer_dir}, special_tokens: both}}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: `tokenizer`: special_tokens must be one of bos_eos, bos"):
        load_plan_config(bad)
    wrong = _write(root, "wrong.yaml", text + f"tokenizer: {{id: {tokenizer_dir}, chat: {{layout: alpaca, x: 1}}}}\n")
    with pytest.raises(ConfigError, match=r"x"):
        load_plan_config(wrong)
