"""Spec values as users pass them. Switches are booleans: a string a config left quoted ("false", "no") is true to
Python and would turn the switch on silently — drop the last step, force BOS, run the count pass, enable the shard
cache. NumPy numbers are numbers: a budget or weights computed with arrays plan exactly as Python's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.specs import BatchSpec, CacheOptions, TokenizeSpec
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None])
def test_a_switch_that_is_not_a_boolean_is_refused_in_one_line(tmp_path, make_parquet, value) -> None:
    data = make_parquet("docs", [4])
    made = {
        "drop_last": lambda v: BatchSpec(microbatch_size=2, drop_last=v),
        "CacheOptions.enabled": lambda v: CacheOptions(enabled=v, root=str(tmp_path)),
        "ShuffleSpec.enabled": lambda v: ShuffleSpec(enabled=v),
        "exact_tokens": lambda v: StaticMixtureWorkSource(
            datasets=[Dataset.from_path("docs", str(data))], mixture=MixtureSpec({"docs": 1.0}), seed=0, exact_tokens=v
        ),
    }
    for name, make in made.items():
        with pytest.raises(ConfigError, match=rf"^{name} must be True or False, got {value!r} \(\w+\) — pass a boolean$"):
            make(value)
    if value is None:  # add_bos alone takes None: the tokenizer's convention
        assert TokenizeSpec(tokenizer_id="t", add_bos=None).add_bos is None
    else:
        with pytest.raises(ConfigError, match=r"^add_bos must be True or False \(or None\), got "):
            TokenizeSpec(tokenizer_id="t", add_bos=value)


def test_planning_switches_are_refused_before_anything_is_written(tmp_path, make_parquet) -> None:
    """overwrite="no" would have replaced an existing bundle; the pipeline's planning options say so at once."""
    from zephon import Pipeline

    data = make_parquet("docs", [4])
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("docs", str(data))], mixture=MixtureSpec({"docs": 1.0}), seed=0
    )
    for kw, name in (({"overwrite": "no"}, "overwrite"), ({"progress": "off"}, "progress"),
                     ({"materialize_selections": 1}, "materialize_selections")):
        with pytest.raises(ConfigError, match=rf"^{name} must be True or False"):
            source.plan(tmp_path / "plan", **kw)
        assert not (tmp_path / "plan").exists()
    with pytest.raises(ConfigError, match=r"^plan_progress must be True or False, got 'no' \(str\)"):
        Pipeline(source).options(plan_progress="no")


def test_python_and_numpy_booleans_are_switches() -> None:
    assert BatchSpec(microbatch_size=2, drop_last=np.bool_(True)).drop_last
    assert not ShuffleSpec(enabled=False).enabled
    assert TokenizeSpec(tokenizer_id="t", add_bos=True).add_bos


def test_numpy_numbers_plan_the_same_bundle_as_python_numbers(tmp_path, make_parquet) -> None:
    """np.int64 seeds and budgets, np.float32 weights, a np.float64 phase start, np.bool_ switches: refused before
    ("seed must be a non-negative integer, got np.int64(5)"), now the very plan of their Python values."""
    from zephon.work import Phase

    data = make_parquet("docs", [6]), make_parquet("more", [6])

    def source(seed, n, weight, start, exact):
        return StaticMixtureWorkSource(
            datasets=[Dataset.from_path("docs", str(data[0])), Dataset.from_path("more", str(data[1]))],
            mixture=MixtureSpec({"docs": weight, "more": 1.0}),
            seed=seed,
            num_documents=n,
            phases=[Phase(start=start, mixture=MixtureSpec({"docs": 1.0}))],
            shuffle=ShuffleSpec(enabled=exact, window_shards=np.int64(2)),
        )

    made = source(np.int64(5), np.int64(10), np.float32(0.75), np.float64(0.5), np.bool_(True)).plan(tmp_path / "np")
    want = source(5, 10, 0.75, 0.5, True).plan(tmp_path / "py")
    assert json.loads((made / "plan.json").read_text())["config_hash"] == json.loads(
        (want / "plan.json").read_text()
    )["config_hash"]
    assert (made / "samples.parquet").read_bytes() == (want / "samples.parquet").read_bytes()
    spec = BatchSpec(microbatch_size=np.int64(2), global_batch_size=np.int32(4), drop_last=np.bool_(False))
    assert (type(spec.microbatch_size), type(spec.global_batch_size), type(spec.drop_last)) == (int, int, bool)


def test_numpy_execution_settings_are_python_numbers() -> None:
    from zephon.executor.settings import ExecutorSpec

    spec = ExecutorSpec(read_chunk=np.int64(7), tokenizer_threads=np.int32(2), dp_rank=np.int64(1), dp_size=np.int64(2))
    assert (spec.read_chunk, spec.tokenizer_threads, spec.rank()) == (7, 2, (1, 2))
    assert all(type(v) is int for v in (spec.read_chunk, spec.tokenizer_threads, spec.dp_rank, spec.dp_size))


def test_a_cache_root_that_cannot_be_a_local_directory_is_one_line(tmp_path) -> None:
    """An empty root (the working directory), a URL, a file; enabled without a root named None as it was given."""
    import pytest as _pytest

    from zephon.errors import ConfigError
    from zephon.io import CacheOptions

    (tmp_path / "afile").write_text("mine")
    cases = [
        (dict(enabled=True), r"^CacheOptions.root must name a local directory, got None — pass a path such as "
         r"'/scratch/zephon-cache' \(ranks of one node may share it\)$"),
        (dict(enabled=True, root=""), r"^CacheOptions.root must name a local directory, got ''"),
        (dict(root="  "), r"^CacheOptions.root must name a local directory, got '  '"),
        (dict(enabled=True, root="s3://b/cache"), r"^CacheOptions.root must be a local directory, got 's3://b/cache' "
         r"— the cache holds local copies of remote shards: pass a local folder$"),
        (dict(enabled=True, root=tmp_path / "afile"), r"^CacheOptions.root must be a directory, got a file at '\S+afile' "
         r"— choose another CacheOptions.root$"),
    ]  # fmt: skip
    for options, message in cases:
        with _pytest.raises(ConfigError, match=message):
            CacheOptions(**options)
    assert CacheOptions(enabled=True, root=tmp_path / "cache").root == str(tmp_path / "cache")  # a Path: its str


def test_a_tokenizer_given_as_a_path_is_its_str(tokenizer_dir) -> None:
    """``Path("tok")`` was refused (``tokenizer_id must be a non-empty string``); it is the same spec as ``"tok"``."""
    from pathlib import Path

    from zephon.specs import TokenizeSpec

    assert TokenizeSpec(tokenizer_id=Path(tokenizer_dir)) == TokenizeSpec(tokenizer_id=str(tokenizer_dir))
