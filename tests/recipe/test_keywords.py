"""A mistyped keyword of the documented API is one line naming the closest known keyword, as a CONFIG file's
unknown key is (``zephon.keywords``); the right keywords, positional arguments and ``dataclasses.replace`` work
as before."""

from __future__ import annotations

import dataclasses
import re

import pytest

from zephon import Pipeline
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.keywords import known_keywords
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, Phase, ShuffleSpec, StaticMixtureWorkSource, TokenEstimation


def _message(name: str, key: str, close: str | None) -> str:
    hint = rf" \(did you mean `{close}`\?\)" if close else ""
    return rf"^{re.escape(name)}\(\) keywords must be among [a-z_, ]+, got unknown `{key}`{hint} — fix the spelling or remove it$"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> StaticMixtureWorkSource:
    folder = tmp_path_factory.mktemp("data")
    (folder / "a.jsonl").write_text('{"text": "one"}\n')
    return StaticMixtureWorkSource(datasets=[Dataset.from_path("web", folder)], mixture=MixtureSpec({"web": 1.0}), seed=1)


@pytest.mark.parametrize(
    ("call", "name", "key", "close"),
    [
        (lambda p: p.batch(micro_batch_size=8), "Pipeline.batch", "micro_batch_size", "microbatch_size"),
        (lambda p: p.batch(microbatch_size=8, dropLast=True), "Pipeline.batch", "dropLast", "drop_last"),
        (lambda p: p.tokenize(tokenizer="gpt2"), "Pipeline.tokenize", "tokenizer", "tokenizer_id"),
        (lambda p: p.pack_flat(max_len=2048), "Pipeline.pack_flat", "max_len", "max_length"),
        (lambda p: p.options(read_chunks=64), "Pipeline.options", "read_chunks", "read_chunk"),
        (lambda p: p.options(shuffle=True), "Pipeline.options", "shuffle", None),
        (lambda p: p.map_transform(str.strip, versoin=2), "Pipeline.map_transform", "versoin", "version"),
    ],
)
def test_a_pipeline_method_names_the_keyword_meant(source, call, name, key, close) -> None:
    with pytest.raises(ConfigError, match=_message(name, key, close)):
        call(Pipeline(source))


def test_the_constructors_users_write_name_the_keyword_meant(source, tmp_path) -> None:
    web = source.datasets[0]
    cases = [
        (lambda: StaticMixtureWorkSource(dataset=[web], mixture=MixtureSpec({"web": 1})), "StaticMixtureWorkSource",
         "dataset", "datasets"),
        (lambda: Dataset.from_path("web", tmp_path, wher="len(text) > 3"), "Dataset.from_path", "wher", "where"),
        (lambda: ShuffleSpec(window=8), "ShuffleSpec", "window", "window_shards"),
        (lambda: TokenEstimation(calibration_sample=64), "TokenEstimation", "calibration_sample",
         "calibration_samples"),
        (lambda: Phase(start_step=10, mixture=MixtureSpec({"web": 1})), "Phase", "start_step", "start"),
        (lambda: MixtureSpec(weight={"web": 1}), "MixtureSpec", "weight", "weights"),
        (lambda: TokenizeSpec(tokenizer="gpt2"), "TokenizeSpec", "tokenizer", "tokenizer_id"),
        (lambda: PackSpec(max_len=2048), "PackSpec", "max_len", "max_length"),
        (lambda: source.plan(tmp_path / "p", overwrites=True), "StaticMixtureWorkSource.plan", "overwrites",
         "overwrite"),
    ]  # fmt: skip
    for make, name, key, close in cases:
        with pytest.raises(ConfigError, match=_message(name, key, close)):
            make()
    assert not (tmp_path / "p").exists()


def test_right_keywords_positional_arguments_and_replace_work_as_before(source) -> None:
    assert MixtureSpec({"web": 2}).weights == {"web": 2}
    spec = TokenizeSpec(tokenizer_id="gpt2", max_tokens=8)
    assert dataclasses.replace(spec, max_tokens=16).max_tokens == 16
    assert dataclasses.replace(source, seed=2).seed == 2
    assert type(dataclasses.replace(source, seed=2)) is StaticMixtureWorkSource
    assert Pipeline(source).batch(microbatch_size=2).executor_spec().batch.microbatch_size == 2


def test_a_function_of_any_keyword_is_left_as_it_is() -> None:
    def anything(**kw: object) -> dict:
        return kw

    assert known_keywords(anything) is anything
