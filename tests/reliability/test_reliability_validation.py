"""Validation: fuzzing of the hf:// parser and the CONFIG loader (only Zephon's own errors escape), and paths
that try to leave their place — Hub listings with ``..`` or absolute paths, symlinks in local datasets,
shard cache keys (more key cases: tests/test_shard_cache.py::test_any_key_gets_a_safe_file_name_inside_the_root).
"""

from __future__ import annotations

import contextlib
import os
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zephon import config_file
from zephon.config_file import load_plan_config, read_config, work_source_from_dict
from zephon.errors import ConfigError, HubError, ZephonError, ZephonWarning
from zephon.io import Dataset
from zephon.storage.hub.client import is_safe_repo_path, resolve_hf_dataset
from zephon.storage.hub.paths import HfPath, parse_hf_path
from zephon.storage.shard_cache_lock import entry_name

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------- the hf:// parser
SEGMENT_CHARS = string.ascii_letters + string.digits + "._-+~@/*?[]%:\\ \t\n\x00é"
near_valid = st.builds(
    lambda parts: "hf://" + "/".join(parts),
    st.lists(st.text(alphabet=SEGMENT_CHARS, max_size=12), min_size=0, max_size=6),
)


@FUZZ
@given(text=st.one_of(st.text(max_size=80), near_valid, st.binary(max_size=20), st.integers(), st.none()))
@example(text="hf://org/name@/train")
@example(text="hf://org/na..me/train")
@example(text="hf://datasets/org/name/data/x.parquet")
@example(text="hf://org/name@" + "a" * 40 + "~parquet/cfg/train")
@example(text="hf://org/name@refs/convert/parquet/train")
def test_hf_path_parser_raises_only_config_errors_and_round_trips(text) -> None:
    try:
        parsed = parse_hf_path(text)
    except ConfigError:
        return
    assert parse_hf_path(str(parsed)) == parsed
    assert ".." not in parsed.repo_id and "/" not in parsed.split


@FUZZ
@given(fields=st.fixed_dictionaries({k: st.text(max_size=10) for k in ("org", "name", "split")}))
def test_hf_path_fields_are_validated_on_construction(fields) -> None:
    with contextlib.suppress(ConfigError):
        HfPath(**fields)


# ---------------------------------------------------------------- the CONFIG loader
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12), st.dates()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4),
    max_leaves=12,
)
TOP_KEYS = list(config_file._TOP_KEYS)  # every key the loader accepts


@pytest.fixture(scope="module")
def web_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-data") / "web"
    root.mkdir()
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), root / "part-0.parquet")
    return root


def valid_config(web_dir: Path) -> dict:
    return {"seed": 1, "datasets": [{"name": "web", "path": str(web_dir)}], "mixture": {"web": 1.0}}


@FUZZ
@given(data=st.dictionaries(st.sampled_from(TOP_KEYS) | st.text(max_size=8), values, max_size=6))
def test_config_dicts_of_anything_raise_only_zephon_errors(data, web_dir) -> None:
    with contextlib.suppress(ZephonError):
        work_source_from_dict(data, base_dir=web_dir.parent, origin="fuzz.yaml")


@FUZZ
@given(key=st.sampled_from([*TOP_KEYS, "datasets.0", "datasets.0.path", "mixture.web"]), value=values)
def test_one_wrong_value_in_a_valid_config_raises_only_zephon_errors(key, value, web_dir) -> None:
    data = valid_config(web_dir)
    if key == "datasets.0":
        data["datasets"][0] = value
    elif key == "datasets.0.path":
        data["datasets"][0]["path"] = value
    elif key == "mixture.web":
        data["mixture"]["web"] = value
    else:
        data[key] = value
    with contextlib.suppress(ZephonError):
        work_source_from_dict(data, base_dir=web_dir.parent, origin="fuzz.yaml")


YAML_CHARS = string.printable + "é\x00\x85\ufeff"


@FUZZ
@given(
    text=st.one_of(st.text(alphabet=YAML_CHARS, max_size=120), st.text(max_size=60)),
    suffix=st.sampled_from([".yaml", ".toml"]),
)
@example(text="a: &x [*x]", suffix=".yaml")
@example(text="!!python/object/apply:os.system ['echo pwned']", suffix=".yaml")
@example(text="a: 1\na: 2", suffix=".yaml")
@example(text="{? [1]: 2}", suffix=".yaml")
@example(text="x = 1979-05-27T07:32:00Z", suffix=".toml")
@example(text="[" * 2000, suffix=".yaml")
def test_config_files_of_arbitrary_text_raise_only_zephon_errors(text, suffix, tmp_path) -> None:
    path = tmp_path / f"fuzz{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(ZephonError):
        load_plan_config(path)


def test_config_bytes_that_are_not_utf8_are_a_config_error(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"seed: 1\nname: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"must be readable UTF-8 text, got .* — fix the file"):
        read_config(path)


@FUZZ
@given(data=values.filter(lambda v: isinstance(v, dict)))
def test_a_config_written_as_yaml_loads_or_raises_a_zephon_error(data, tmp_path) -> None:
    path = tmp_path / "round.yaml"
    try:
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
    except (yaml.YAMLError, UnicodeEncodeError):
        return
    with contextlib.suppress(ZephonError):
        load_plan_config(path)


# ---------------------------------------------------------------- paths that try to leave their place
@pytest.mark.parametrize(
    "path, safe",
    [
        ("sample/10BT/000.parquet", True),
        ("a/b.c/d..e.parquet", True),
        ("../x.parquet", False),
        ("sample/../../etc/passwd", False),
        ("/etc/passwd", False),
        ("a//b.parquet", False),
        ("./a.parquet", False),
        ("a/./b.parquet", False),
        ("a\\..\\b.parquet", False),
        ("a\x00b.parquet", False),
        ("a\nb.parquet", False),
        ("", False),
        ("a/", False),
    ],
)
def test_repo_path_check(path, safe) -> None:
    assert is_safe_repo_path(path) is safe


CARD = "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: sample/10BT/*\n---\n"


@pytest.mark.parametrize(
    "evil, readme",
    [
        ("sample/10BT/../../../etc/passwd.parquet", CARD),  # inside the listed directory (card configs)
        ("/etc/passwd.parquet", None),  # a whole-repository listing (no card configs)
        ("../train-0.parquet", None),
        ("train/./x.parquet", None),
    ],
)
def test_a_hub_listing_with_an_unsafe_path_is_refused(hub_server, evil, readme) -> None:
    files = {"sample/10BT/000.parquet": b"PAR1" * 10, "train-0.parquet": b"PAR1" * 10, evil: b"root:x:0:0"}
    commit = hub_server.add_dataset("evil/data", files, readme=readme)
    with pytest.raises(
        HubError,
        match=rf"file paths in the listing of dataset evil/data at commit {commit} must be relative paths inside the repository, got .* — the endpoint returned an unsafe listing; check HF_ENDPOINT",
    ):
        resolve_hf_dataset("hf://evil/data/train")


@pytest.mark.parametrize(
    "key", ["hf/evil/data/" + "0" * 40 + "/../../../../etc/passwd", "hf/o/d/c//etc/shadow", "hf/o/d/c/..\\..\\x"]
)
def test_hub_file_keys_cannot_name_a_path_outside_the_cache(tmp_path, key) -> None:
    name = entry_name(key)
    assert "/" not in name and "\\" not in name and not name.startswith(".") and name not in ("", "..")
    assert (tmp_path / "shards" / name).resolve().parent == (tmp_path / "shards").resolve()


def test_symlinks_in_a_local_dataset_are_read_never_written_and_loops_do_not_hang(tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    pq.write_table(pa.table({"text": ["far away"]}), outside / "real.parquet")
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["here"]}), data / "sub" / "a.parquet")
    os.symlink(outside / "real.parquet", data / "linked.parquet")  # a file link (as in a HF cache snapshot)
    os.symlink(data, data / "sub" / "loop")  # a directory link loop
    os.symlink(outside, data / "dirlink")  # a directory link: followed, once
    before = sorted(p.name for p in outside.iterdir())
    with pytest.warns(ZephonWarning, match=r"skipped the linked directory .*/sub/loop → .*: it loops to or repeats"):
        ds = Dataset.from_path("web", str(data))
    assert [Path(f.uri).name for f in ds.files] == ["real.parquet", "linked.parquet", "a.parquet"]
    assert sorted(p.name for p in outside.iterdir()) == before  # nothing written outside
    cache = Path(os.environ["ZEPHON_CACHE_DIR"])
    assert all(p.resolve().is_relative_to(cache.resolve()) for p in cache.rglob("*"))
