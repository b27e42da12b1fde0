"""Wrong values that used to escape as raw Python errors or with wrong advice: each is one ZephonError line
that says what was wrong and what to write instead."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from zephon import Pipeline
from zephon.cli import cli
from zephon.errors import ConfigError, DatasetError
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


@pytest.mark.parametrize("path", ["https://x.org/a.parquet", "ftp://x.org/web/"])
def test_an_unsupported_url_scheme_is_named_not_treated_as_a_missing_local_path(path: str) -> None:
    """s3://, gs:// and az:// are object-store paths (tests/storage/test_objects_*.py); other schemes are named."""
    scheme = path.split("://")[0]
    with pytest.raises(
        DatasetError, match=rf"got {scheme}:// in {re.escape(repr(path))} — {scheme}:// is not supported"
    ) as info:
        Dataset.from_path("web", path)
    assert "\n" not in str(info.value)


def test_a_plain_dict_as_the_mixture_is_refused_with_the_fix(make_parquet) -> None:
    web = Dataset.from_path("web", str(make_parquet("web", [4])))
    with pytest.raises(
        ConfigError, match=r"^mixture must be a MixtureSpec, got dict — wrap the weights in MixtureSpec"
    ):
        StaticMixtureWorkSource(datasets=[web], mixture={"web": 1.0}, seed=0)  # type: ignore[arg-type]


def test_a_work_source_s_parts_of_the_wrong_kind_are_one_line(make_parquet) -> None:
    """shuffle=True and token_estimation=True were accepted (an AttributeError at planning, or a misleading
    'needs a tokenizer'); one Dataset for datasets was a TypeError."""
    from zephon.work import ShuffleSpec, TokenEstimation

    web = Dataset.from_path("web", str(make_parquet("web", [4])))
    base = dict(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=0)
    cases = [
        ({"shuffle": True}, r"^shuffle must be a ShuffleSpec, got True — pass ShuffleSpec\(enabled=True\|False\)"),
        ({"token_estimation": True}, r"^token_estimation must be a TokenEstimation or None, got True — pass "
         r"TokenEstimation\(\) for a token mixture$"),
        ({"datasets": web}, r"^datasets must be a list of Dataset, got one Dataset — pass datasets=\[Dataset"),
        ({"datasets": "data/web"}, r"^datasets must be a list of Dataset, got str"),
    ]  # fmt: skip
    for change, message in cases:
        with pytest.raises(ConfigError, match=message):
            StaticMixtureWorkSource(**{**base, **change})  # type: ignore[arg-type]
    assert StaticMixtureWorkSource(**{**base, "datasets": (d for d in [web])}).datasets == (web,)  # any iterable
    assert StaticMixtureWorkSource(**base, shuffle=ShuffleSpec(enabled=False), token_estimation=TokenEstimation())


def test_load_state_dict_refuses_what_is_not_a_state(make_parquet) -> None:
    web = Dataset.from_path("web", str(make_parquet("web", [4])))
    source = StaticMixtureWorkSource(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=0)
    pipeline = Pipeline(source)
    for bad in (None, [], "state"):
        with pytest.raises(ConfigError, match=r"^state must be the dict that state_dict\(\) returned, got "):
            pipeline.load_state_dict(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"got PosixPath — .*; a file of one: json.load\(open\(path\)\)$"):
        pipeline.load_state_dict(Path("ckpt/state.json"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"got str — .*; JSON text of one: json.loads\(text\)$"):
        pipeline.load_state_dict('{"version": 1}')  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("states", "message"),
    [
        ("state", r"^merge_states needs a list of every rank's state_dict\(\), got str — pass \[state_of_rank_0"),
        ({"version": 1}, r"^merge_states needs a list of every rank's state_dict\(\), got dict"),
        ([{"version": 1}, None], r"^merge_states needs every rank's state_dict\(\) \(a dict each\), got NoneType at "
         r"index 1 — pass the dicts state_dict\(\) returned \(json.load a saved one\)$"),
    ],
)
def test_merge_states_refuses_what_is_not_a_list_of_states(states, message) -> None:
    """A single state, or a None among them: AttributeError / KeyError from inside the merge."""
    from zephon import merge_states

    with pytest.raises(ConfigError, match=message):
        merge_states(states)  # type: ignore[arg-type]


def _small_plan(make_parquet, out) -> None:
    web = Dataset.from_path("web", str(make_parquet("web", [6])))
    StaticMixtureWorkSource(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=0).plan(out)


def test_a_plan_directory_takes_the_users_umask_not_0700(make_parquet, tmp_path) -> None:
    old = os.umask(0o022)
    try:
        _small_plan(make_parquet, tmp_path / "plan")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plan").stat().st_mode) == 0o755


def test_audit_plot_into_a_missing_directory_is_one_line_before_any_work(make_parquet, tmp_path) -> None:
    _small_plan(make_parquet, tmp_path / "plan")
    target = tmp_path / "nodir" / "shares.png"
    result = CliRunner().invoke(cli, ["audit", str(tmp_path / "plan"), "--batch-size", "2", "--plot", str(target)])
    assert result.exit_code == 1
    assert result.output == (
        f"zephon: error: --plot must be a file in an existing directory, got {target} (no directory "
        f"{target.parent}) — create the directory or choose another path\n"
    )
    assert not target.parent.exists()
