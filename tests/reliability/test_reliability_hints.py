"""Fast, precise failures and hints that fit the caller (issue 14): a tokenizer that is a missing path or an
unreachable Hub id fails at once with the reason; paths in errors are normalized; a CONFIG error names its
file once; the text-field hint names every spelling; the skip policy is suggested only where it applies; the
``datasets`` view reports every format of a dataset's shards.

The Hub tests use the real huggingface_hub client against 127.0.0.1 only (``hub_server``, then stopped: nothing
listens on its port); nothing reaches the internet."""

from __future__ import annotations

import gzip
import json
import logging
import re
import time
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner
from huggingface_hub import close_session
from huggingface_hub import constants as hf_constants
from servers.hub_server import HubServer

from zephon import Pipeline
from zephon.cli import cli
from zephon.config_file import load_plan_config
from zephon.errors import ConfigError, DatasetError, TokenizerError
from zephon.executor.encode.text import Encoder
from zephon.inspection.sql import run_sql
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource, TokenEstimation

FIELD_HINT = "tokenize(field=...) in Python, `field:` under `tokenizer:` in CONFIG, --field for zephon show and zephon tokenize"
SKIP_HINT = 'or skip and count such documents with Pipeline.options(on_bad_document="skip")'


def _missing_path(shown: str) -> str:
    return (
        "tokenizer_id must be an existing directory or tokenizer.json, or a Hub id, got path "
        f"{shown} which does not exist — fix the path"
    )


# ---------------------------------------------------------------- tokenizers: a path is a path, at once
@pytest.mark.parametrize(
    ("tokenizer_id", "shown"),
    [
        ("./tokenizers/mine", "{cwd}/tokenizers/mine"),
        ("{tmp}/bad/../tok.json", "{tmp}/tok.json"),
        ("tokenizers/v2/mine", "{cwd}/tokenizers/v2/mine"),
        ("../elsewhere/./tok", "{parent}/elsewhere/tok"),
    ],
)
def test_a_missing_tokenizer_path_is_named_normalized_without_asking_the_hub(
    gpt2_hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer_id: str, shown: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    names = {"cwd": str(work), "tmp": str(tmp_path), "parent": str(tmp_path)}
    with pytest.raises(TokenizerError) as info:
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_id.format(**names)))
    assert str(info.value) == _missing_path(shown.format(**names))
    assert gpt2_hub.requests == []  # decided locally: no "Repo id must be in the form ..." from the Hub


def test_a_tokenizer_id_that_is_neither_path_nor_hub_id_says_so() -> None:
    with pytest.raises(TokenizerError) as info:
        Encoder(TokenizeSpec(tokenizer_id="my tokenizer"))
    assert str(info.value) == (
        "tokenizer_id must be an existing directory or tokenizer.json, or a Hub id (name or org/name), got "
        "'my tokenizer', which is neither — fix it"
    )


def test_a_tokenizer_directory_without_tokenizer_json_is_shown_normalized(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "x").mkdir()
    with pytest.raises(TokenizerError) as info:
        Encoder(TokenizeSpec(tokenizer_id=str(tmp_path / "x" / ".." / "tok")))
    assert str(info.value) == (
        f"tokenizer directory must contain tokenizer.json, got none in {tmp_path / 'tok'} — save the tokenizer "
        "with save_pretrained() (a fast tokenizer)"
    )


# ---------------------------------------------------------------- tokenizers: an unreachable Hub, at once
def _unreachable(hub: HubServer) -> str:
    """Stop the server: its port, which HF_ENDPOINT and huggingface_hub's constants name, has no listener; the
    client's pooled keep-alive connections go too (a handler thread would still answer on them)."""
    url = hub.url
    hub.stop()
    close_session()
    return url


def test_a_hub_id_without_network_fails_in_one_quick_attempt_with_one_line(hub_server: HubServer) -> None:
    url = _unreachable(hub_server)
    start = time.monotonic()
    with pytest.raises(TokenizerError) as info:
        Encoder(TokenizeSpec(tokenizer_id="gpt2"))
    elapsed = time.monotonic() - start
    assert elapsed < 5, f"{elapsed:.1f} s: huggingface_hub's retry loop (about 75 s) was not avoided"
    assert re.fullmatch(
        re.escape(
            f"tokenizer 'gpt2' must be downloadable from the Hugging Face Hub or cached, got no connection to {url} ("
        )
        + r"ConnectError: [^()\n]+"
        + re.escape(
            ") and no cached copy — pass a local directory or tokenizer.json path, or download it once where the "
            "Hub is reachable and set HF_HUB_OFFLINE=1 to use the cached copy"
        ),
        str(info.value),
    ), str(info.value)


def test_an_unreachable_hub_falls_back_to_the_cached_copy_at_once(
    gpt2_hub: HubServer, caplog: pytest.LogCaptureFixture
) -> None:
    online = Encoder(TokenizeSpec(tokenizer_id="gpt2"))  # downloads into the (isolated) Hugging Face cache
    url = _unreachable(gpt2_hub)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="zephon"):
        cached = Encoder(TokenizeSpec(tokenizer_id="gpt2"))
    assert time.monotonic() - start < 5
    assert cached.fingerprint == online.fingerprint
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "zephon.executor.encode.load"]
    assert warning.startswith(f"the Hugging Face Hub could not be reached (no connection to {url} (ConnectError: ")
    assert warning.endswith("): tokenizer 'gpt2' loaded from the cache")


def test_hf_hub_offline_without_a_cached_copy_is_one_line_and_asks_nothing(
    gpt2_hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerError) as info:
        Encoder(TokenizeSpec(tokenizer_id="gpt2"))
    assert str(info.value) == (
        "tokenizer 'gpt2' must be in the Hugging Face cache while HF_HUB_OFFLINE is set, got no cached copy — "
        "unset HF_HUB_OFFLINE to download it, or pass a local directory or tokenizer.json path"
    )
    assert gpt2_hub.requests == []


# ---------------------------------------------------------------- paths in errors are normalized
def test_a_missing_dataset_path_is_shown_absolute_and_normalized(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bad").mkdir()
    with pytest.raises(DatasetError) as info:
        Dataset.from_path("web", f"{tmp_path}/bad/../data/nope")
    assert str(info.value) == f"dataset 'web': path '{tmp_path}/data/nope' must exist, got nothing there — fix the path"
    monkeypatch.chdir(tmp_path / "bad")
    with pytest.raises(DatasetError) as info:
        Dataset.from_path("web", "./x/../nope/*.parquet")
    assert str(info.value) == (
        f"dataset 'web': glob '{tmp_path}/bad/nope/*.parquet' must match at least one file, got none — check the pattern"
    )


def test_a_path_whose_normal_form_exists_is_shown_as_given(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()  # the OS does not resolve missing/.. : never call the existing data/ missing
    with pytest.raises(DatasetError) as info:
        Dataset.from_path("web", f"{tmp_path}/missing/../data")
    assert str(info.value) == (
        f"dataset 'web': path '{tmp_path}/missing/../data' must exist, got nothing there — fix the path"
    )


def test_a_missing_config_file_is_shown_normalized(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigError) as info:
        load_plan_config(tmp_path / "sub" / ".." / "nope.yaml")
    assert str(info.value) == f"CONFIG file must exist, got nothing at '{tmp_path / 'nope.yaml'}' — fix the path"


# ---------------------------------------------------------------- CONFIG errors name the file once
BASE = "seed: 1\ndatasets:\n  - {name: web, path: data/web}\nmixture: {web: 1}\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("tokenizer: 5", "`tokenizer` must be a mapping with an `id`, got integer 5 — write `{id: gpt2, field: text}`"),
        (
            "packing: {max_length: 1}",
            "`packing.max_length` must be an integer ≥ 2, got integer 1 — write e.g. `max_length: 2049`",
        ),
        (
            "packing: {max_length: 64, algorithm: nope}",
            '`packing.algorithm` must be "wrap", "best_fit" or "homogeneous", got string \'nope\' — use one of them',
        ),
        (
            "packing: {max_length: 64, oversize: cut}",
            '`packing.oversize` must be "split" or "drop", got string \'cut\' — use one of them',
        ),
        (
            "phases: [{start: 0.5, mixture: 5}]",
            "`phases[0].mixture` must be a non-empty mapping of dataset name to weight, got integer 5 — write "
            "`{web: 0.7, code: 0.3}`",
        ),
        (
            "phases: [{start: 0.5, mixture: {web: '1'}}]",
            "`phases[0].mixture.web` must be a number, got string '1' — write e.g. 0.7",
        ),
        (
            "tokenizer: {id: gpt2, field: 3}",
            "`tokenizer.field` must be a non-empty string, got integer 3 — write e.g. `field: text`",
        ),
        (
            "tokenizer: {id: gpt2, add_bos: maybe}",
            "`tokenizer.add_bos` must be true, false or null, got string 'maybe' — write one of them",
        ),
        (
            "tokenizer: {id: ./tokenizers/../mine}",
            "`tokenizer.id` must be an existing directory or tokenizer.json, or a Hub id, got path {root}/mine which "
            "does not exist — fix the path (a relative one is read from the CONFIG file's directory)",
        ),
        (
            "datasets: [{name: web, path: data/../nope}]",
            "dataset 'web': path '{root}/nope' must exist, got nothing there — fix the path",
        ),
    ],
)
def test_every_config_error_names_the_file_once(make_parquet, tmp_path: Path, extra: str, message: str) -> None:
    make_parquet("web", [4])
    base = (
        BASE if not extra.startswith("datasets") else BASE.replace("datasets:\n  - {name: web, path: data/web}\n", "")
    )
    config = tmp_path / "x.yaml"
    config.write_text(base + extra + "\n")
    expected = f"{config}: " + message.replace("{root}", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_plan_config(config)
    assert str(info.value) == expected
    assert str(info.value).count("x.yaml") == 1

    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "plan")])
    assert (result.exit_code, result.output) == (1, f"zephon: error: {expected}\n")


# ---------------------------------------------------------------- hints that fit the caller
def _plan(make_parquet, tmp_path: Path) -> Path:
    web = Dataset.from_path("web", str(make_parquet("web", [6])))
    return StaticMixtureWorkSource(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=0).plan(tmp_path / "plan")


def test_show_with_a_missing_field_names_every_spelling_of_the_text_field(make_parquet, tmp_path: Path) -> None:
    plan = _plan(make_parquet, tmp_path)
    shard = tmp_path / "data" / "web" / "part-00000.parquet"
    result = CliRunner().invoke(cli, ["show", str(plan), "-s", "0", "--batch-size", "2", "--field", "nonexistent"])
    assert (result.exit_code, result.output) == (
        1,
        f"zephon: error: dataset 'web': shard {shard} must have the column 'nonexistent', got columns ['id', 'text'] "
        f"— choose one of them as the text field: {FIELD_HINT}\n",
    )


def _bad_jsonl(tmp_path: Path) -> Path:
    shard = tmp_path / "data" / "web" / "part-0.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text(json.dumps({"text": "alpha beta"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    return shard


def _source(shard: Path, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(shard.parent))],
        mixture=MixtureSpec({"web": 1}),
        seed=0,
        epochs=1,
        shuffle=ShuffleSpec(enabled=False),
        lanes=1,
        **kw,
    )


def _missing_field(shard: Path) -> str:
    return (
        f"dataset 'web': shard {shard} row 1 must have the field 'text', got keys ['body'] — fix the data or choose "
        f"another text field ({FIELD_HINT})"
    )


def test_the_skip_policy_is_suggested_where_it_applies_only(tmp_path: Path, tokenizer_dir: str) -> None:
    shard = _bad_jsonl(tmp_path)
    plan = _source(shard).plan(tmp_path / "plan")
    # A run of an estimated plan can skip: its error says how.
    pipeline = (
        Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=16).batch(microbatch_size=2)
    )
    with pytest.raises(DatasetError) as info:
        list(pipeline)
    assert str(info.value) == f"{_missing_field(shard)}, {SKIP_HINT}"
    # zephon show cannot skip: no Python advice about a run option.
    result = CliRunner().invoke(cli, ["show", str(plan), "-s", "0", "--batch-size", "2"])
    assert (result.exit_code, result.output) == (1, f"zephon: error: {_missing_field(shard)}\n")
    # An exact plan refuses the skip policy; its count pass reads every document and must not suggest it.
    with pytest.raises(DatasetError) as info:
        _source(shard, token_estimation=TokenEstimation(), exact_tokens=True).plan(
            tmp_path / "exact", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=16)
        )
    assert str(info.value) == _missing_field(shard)


# ---------------------------------------------------------------- the datasets view tells mixed formats
def test_the_datasets_view_reports_every_format_of_mixed_compressions(tmp_path: Path) -> None:
    mixed, plain = tmp_path / "mixed", tmp_path / "plain"
    mixed.mkdir()
    plain.mkdir()
    rows = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(4)).encode()

    (mixed / "a.jsonl.gz").write_bytes(gzip.compress(rows, mtime=0))
    (mixed / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(rows))
    (plain / "a.jsonl").write_bytes(rows)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("mixed", str(mixed)), Dataset.from_path("plain", str(plain))],
        mixture=MixtureSpec({"mixed": 1, "plain": 1}),
        seed=0,
    )
    plan = source.plan(tmp_path / "plan")
    _, rows_out = run_sql(plan, "SELECT name, format FROM datasets ORDER BY name")
    assert rows_out == [("mixed", "jsonl.gz,jsonl.zst"), ("plain", "jsonl")]
