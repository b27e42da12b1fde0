"""Progress bars (``zephon.storage.progress``): one rule decides when they show, and they never change a plan.

The rule: ``progress=True/False`` wins; ``None`` draws bars only when stderr is a terminal, not in CI, not under
pytest, and ``ZEPHON_PROGRESS`` can force either way. Every long step (scan, byte sizing, calibration, count
pass, Hub listing and download) draws through it; a bar goes to stderr and plans are byte-identical with and
without bars.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from servers.hub_fixtures import FINEWEB
from servers.hub_server import HubServer

import zephon.storage.progress as progress_module
from zephon.cli import cli
from zephon.errors import ConfigError
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.storage.hub.client import download_remote_file, resolve_hf_dataset
from zephon.storage.progress import progress_bar, show_progress, track
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> _Terminal:
    """Make stderr a terminal with nothing in the environment speaking against bars. Called in the test body:
    pytest sets PYTEST_CURRENT_TEST again after the fixtures ran."""
    stream = _Terminal()
    monkeypatch.setattr("sys.stderr", stream)
    for name in ("CI", "PYTEST_CURRENT_TEST", "ZEPHON_PROGRESS", "TERM"):
        monkeypatch.delenv(name, raising=False)
    return stream


@pytest.fixture
def no_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bars appear at once instead of after DELAY_S seconds, so a test's short steps draw them."""
    monkeypatch.setattr(progress_module, "DELAY_S", 0.0)


def test_an_explicit_choice_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_PROGRESS", "1")
    assert show_progress(False) is False
    monkeypatch.setenv("ZEPHON_PROGRESS", "0")
    assert show_progress(True) is True
    with pytest.raises(ConfigError, match=r"progress must be True, False or None, got 'yes' — pass a bool"):
        show_progress("yes")  # type: ignore[arg-type]


def test_default_draws_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_a_terminal(monkeypatch)
    assert show_progress() is True
    assert show_progress(None) is True
    monkeypatch.setattr("sys.stderr", io.StringIO())  # a pipe or a file
    assert show_progress() is False
    monkeypatch.setattr("sys.stderr", None)  # pythonw
    assert show_progress() is False


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("CI", "true", False),
        ("CI", "1", False),
        ("CI", "false", True),
        ("CI", "", True),
        ("PYTEST_CURRENT_TEST", "tests/x.py::t (call)", False),
        ("TERM", "dumb", False),
        ("ZEPHON_PROGRESS", "0", False),
        ("ZEPHON_PROGRESS", "off", False),
        ("ZEPHON_PROGRESS", "1", True),
    ],
)
def test_environment_on_a_terminal(monkeypatch: pytest.MonkeyPatch, name: str, value: str, shown: bool) -> None:
    _on_a_terminal(monkeypatch)
    monkeypatch.setenv(name, value)
    assert show_progress() is shown


def test_zephon_progress_1_draws_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    monkeypatch.setenv("ZEPHON_PROGRESS", "1")
    assert show_progress() is True


def test_under_pytest_the_default_is_quiet() -> None:
    assert show_progress() is False  # PYTEST_CURRENT_TEST is set, whatever stderr is


def test_a_bar_waits_before_it_shows_and_is_erased(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _on_a_terminal(monkeypatch)
    with progress_bar(total=3, desc="quick step", unit="shard") as bar:
        bar.update(3)
    assert terminal.getvalue() == ""  # finished within DELAY_S: nothing drawn, nothing to erase


def test_track_yields_the_items_unchanged(monkeypatch: pytest.MonkeyPatch, no_delay: None) -> None:
    terminal = _on_a_terminal(monkeypatch)
    assert list(track(iter("abc"), total=3, desc="letters", unit="letter")) == ["a", "b", "c"]
    assert "letters" in terminal.getvalue()
    quiet = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stderr", quiet)
        assert list(track(range(3), total=None, desc="numbers")) == [0, 1, 2]
    assert quiet.getvalue() == ""


def _corpus(make: Callable[..., Path], *, exact: bool = False) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("a", make("a", [30, 20, 25])), Dataset.from_path("b", make("b", [40, 10]))],
        mixture=MixtureSpec({"a": 0.6, "b": 0.4}),
        seed=5,
        token_estimation=TokenEstimation(calibration_samples=16),
        exact_tokens=exact,
    )


def _bundle(plan_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(plan_dir.iterdir())}


@pytest.mark.parametrize("exact", [False, True], ids=["estimated", "exact"])
def test_bars_never_change_a_plan(
    monkeypatch: pytest.MonkeyPatch,
    no_delay: None,
    make_parquet: Callable[..., Path],
    tokenizer_dir: str,
    tmp_path: Path,
    exact: bool,
) -> None:
    terminal = _on_a_terminal(monkeypatch)
    source = _corpus(make_parquet, exact=exact)
    tokenize = TokenizeSpec(tokenizer_id=tokenizer_dir)
    pack = PackSpec(max_length=65)
    source.plan(tmp_path / "quiet", tokenize=tokenize, pack=pack, progress=False)
    assert terminal.getvalue() == ""
    for root in ("cache-a", "cache-b"):  # cold caches: the bars follow the work, not cache hits
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ZEPHON_CACHE_DIR", str(tmp_path / root))
            source.plan(tmp_path / root / "plan", tokenize=tokenize, pack=pack, progress=None if exact else True)
    drawn = terminal.getvalue()
    assert "scanning shards" in drawn
    if exact:
        assert "counting tokens" in drawn
    else:
        assert "sizing documents of a" in drawn and "calibrating b" in drawn
    assert (
        _bundle(tmp_path / "quiet") == _bundle(tmp_path / "cache-a" / "plan") == _bundle(tmp_path / "cache-b" / "plan")
    )


def test_the_count_pass_draws_a_bar_with_one_worker_or_several(
    monkeypatch: pytest.MonkeyPatch,
    no_delay: None,
    make_parquet: Callable[..., Path],
    tokenizer_dir: str,
    tmp_path: Path,
) -> None:
    terminal = _on_a_terminal(monkeypatch)
    from zephon.executor.encode.text import Encoder
    from zephon.planner.counts.lengths import token_counts
    from zephon.planner.prepare import shard_refs

    refs = [r for group in shard_refs(_corpus(make_parquet), progress=False) for r in group]
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    totals = []
    for workers, root in ((1, "one"), (2, "two")):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ZEPHON_CACHE_DIR", str(tmp_path / root))
            arrays, report = token_counts(refs, spec, Encoder(spec), workers=workers, progress=True)
            totals.append([a.tolist() for a in arrays])
            assert report.counted == len(refs)
        assert terminal.getvalue().count("counting tokens") >= 1
        terminal.seek(0)
        terminal.truncate()
    assert totals[0] == totals[1]


def test_cli_output_off_a_terminal_holds_no_bar(make_parquet: Callable[..., Path], tmp_path: Path) -> None:
    config = tmp_path / "mix.yaml"
    config.write_text(
        f"seed: 1\ndatasets:\n  - {{name: a, path: {make_parquet('a', [5, 5])}}}\nmixture: {{a: 1}}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(cli, ["plan", str(config), "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("planned 10 documents from 1 dataset (2 shards)")
    assert "\r" not in result.output and "shard/s" not in result.output


def test_hub_listing_and_download_draw_bars_and_write_the_same_bytes(
    reference_hub: tuple[HubServer, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    no_delay: None,
    tmp_path: Path,
) -> None:
    terminal = _on_a_terminal(monkeypatch)
    hub = reference_hub[0]
    resolved = resolve_hf_dataset("hf://HuggingFaceFW/fineweb-edu/sample-10BT/train")
    assert f"listing {FINEWEB}" in terminal.getvalue()
    file = resolved.files[0]
    download_remote_file(file, str(tmp_path / "shown.parquet"))
    assert "downloading 000_00000.parquet" in terminal.getvalue()
    download_remote_file(file, str(tmp_path / "quiet.parquet"), progress=False)
    expected = hub.files_at(FINEWEB)[file.path_in_repo]
    assert (tmp_path / "shown.parquet").read_bytes() == (tmp_path / "quiet.parquet").read_bytes() == expected
