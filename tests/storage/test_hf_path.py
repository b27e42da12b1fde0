"""The hf:// path grammar: hf://{org}/{name}[@[{revision}][~{source}]]/[{config}/]{split}."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon.errors import ConfigError
from zephon.storage.hub.paths import HfPath, is_hf_path, parse_hf_path

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train",
            HfPath(org="HuggingFaceFW", name="fineweb-edu", config="sample-10BT", split="train"),
        ),
        (
            "hf://HuggingFaceFW/fineweb-edu@v1.4.0/sample-10BT/train",
            HfPath(org="HuggingFaceFW", name="fineweb-edu", revision="v1.4.0", config="sample-10BT", split="train"),
        ),
        (
            "hf://yahma/alpaca-cleaned@~parquet/train",
            HfPath(org="yahma", name="alpaca-cleaned", source="parquet", split="train"),
        ),
        (
            f"hf://org/name@{SHA}~original/cfg/train",
            HfPath(org="org", name="name", revision=SHA, source="original", config="cfg", split="train"),
        ),
        (
            "hf://wikimedia/wikipedia/20231101.en/train",
            HfPath(org="wikimedia", name="wikipedia", config="20231101.en", split="train"),
        ),
        (
            "hf://org/name@release_2-b.1/validation",
            HfPath(org="org", name="name", revision="release_2-b.1", split="validation"),
        ),
    ],
)
def test_parse_examples(text: str, expected: HfPath) -> None:
    parsed = parse_hf_path(text)
    assert parsed == expected
    assert str(parsed) == text
    assert parse_hf_path(str(parsed)) == parsed


def test_repo_id_and_pinned() -> None:
    path = parse_hf_path("hf://HuggingFaceFW/fineweb-edu@v1.4.0/sample-10BT/train")
    assert path.repo_id == "HuggingFaceFW/fineweb-edu"
    assert not path.is_pinned
    assert dataclasses.replace(path, revision=SHA, source="original").is_pinned
    assert str(dataclasses.replace(path, revision=None, source="parquet")) == (
        "hf://HuggingFaceFW/fineweb-edu@~parquet/sample-10BT/train"
    )


def test_is_hf_path() -> None:
    assert is_hf_path("hf://a/b/train")
    assert is_hf_path("hf://garbage")  # scheme only: parse_hf_path reports what is wrong
    assert not is_hf_path("s3://bucket/key")
    assert not is_hf_path("/data/shards")
    assert not is_hf_path(None)


def test_datasets_file_form_is_refused_with_the_right_form() -> None:
    with pytest.raises(ConfigError) as info:
        parse_hf_path("hf://datasets/HuggingFaceFW/fineweb-edu/sample-10BT/train")
    assert str(info.value) == (
        "hf:// Zephon paths must name a dataset split, not a file, got the hf://datasets/ file-path form "
        "'hf://datasets/HuggingFaceFW/fineweb-edu/sample-10BT/train' — use "
        "hf://HuggingFaceFW/fineweb-edu/sample-10BT/train, not hf://datasets/HuggingFaceFW/fineweb-edu/sample-10BT/train"
    )


def test_datasets_file_path_gets_the_generic_form() -> None:
    with pytest.raises(
        ConfigError,
        match=r"use hf://\{org\}/\{name\}/\[\{config\}/\]\{split\}, not "
        r"hf://datasets/org/name@main/data/train-0000\.parquet$",
    ):
        parse_hf_path("hf://datasets/org/name@main/data/train-0000.parquet")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3://org/name/train", "hf:// path must start with 'hf://', got 's3://org/name/train'"),
        ("hf://org/name", "hf:// path must name a split, got 'hf://org/name' — append '/{split}'"),
        (
            "hf://org",
            "hf:// path must name a dataset and a split, got only the organization in 'hf://org' — write 'hf://org/{name}/{split}', e.g. 'hf://org/NAME/train'",
        ),
        ("hf://org//train", "got an empty name in 'hf://org//train'"),
        ("hf://org/name/", "got an empty split in 'hf://org/name/'"),
        ("hf://org/name//train", "got an empty config in 'hf://org/name//train'"),
        ("hf:///name/train", "got an empty org in 'hf:///name/train'"),
        ("hf://org/name@/train", "'@' must be followed by a revision and/or '~source', got nothing"),
        ("hf://org/name@~foo/train", "hf:// source must be one of original, parquet, got 'foo'"),
        ("hf://org/name@main~/train", "hf:// source must be one of original, parquet, got ''"),
        ("hf://org/name@a~parquet~original/train", "at most one '~source'"),
        ("hf://org/name@a@b/train", "at most one '@'"),
        ("hf://org/name~parquet/train", "hf:// source must follow '@'"),
        ("hf://org/name/cfg/train/extra", "hf:// path must have at most 4 segments (org/name/config/split), got 5"),
        (
            "hf://org/name@refs/convert/parquet/train",
            "got 5 in 'hf://org/name@refs/convert/parquet/train' — "
            "revisions cannot contain '/' and paths name a split, not a "
            "file; read branch refs/convert/parquet with @~parquet;",
        ),
        ("hf://org/na me/train", "hf:// name must be letters, digits, '.', '-', '_'"),
        ("hf://-org/name/train", "hf:// org must be letters"),
        ("hf://org/name@v1!/train", "hf:// revision must be a branch, tag or commit sha"),
        ("hf://org/name/c$fg/train", "hf:// config must be letters, digits"),
        ("hf://org/name/tra in", "hf:// split must be a split name"),
        (
            "hf://org/name/train.parquet",
            "got 'train.parquet' in 'hf://org/name/train.parquet' (a path names a split, not a file)",
        ),
    ],
)
def test_malformed_paths_name_the_wrong_part(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_hf_path(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match="hf:// source must be one of original, parquet, got 'csv'"):
        HfPath(org="org", name="name", source="csv", split="train")
    with pytest.raises(ConfigError, match="hf:// revision must be"):
        HfPath(org="org", name="name", revision="refs/convert/parquet", split="train")


def test_frozen_and_hashable() -> None:
    path = parse_hf_path("hf://org/name/train")
    with pytest.raises(dataclasses.FrozenInstanceError):
        path.split = "test"  # type: ignore[misc]
    assert {path: 1}[parse_hf_path("hf://org/name/train")] == 1


_part = st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,8}[A-Za-z0-9])?", fullmatch=True).filter(
    lambda s: "--" not in s and ".." not in s
)


@given(
    org=_part,
    name=_part,
    revision=st.none() | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,6}(?:\.[0-9]{1,2}){0,2}", fullmatch=True),
    source=st.none() | st.sampled_from(["original", "parquet"]),
    config=st.none() | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_+-]{0,8}(?:\.[a-z]{2})?", fullmatch=True),
    split=st.from_regex(r"[A-Za-z0-9_]{1,8}", fullmatch=True),
)
def test_round_trip(
    org: str, name: str, revision: str | None, source: str | None, config: str | None, split: str
) -> None:
    path = HfPath(org=org, name=name, revision=revision, source=source, config=config, split=split)
    assert parse_hf_path(str(path)) == path
