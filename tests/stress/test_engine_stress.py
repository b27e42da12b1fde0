"""Engine stress: every installed engine (and ``auto``) × five tokenizers × the call patterns of a training job.

Each (setting, tokenizer) runs its patterns in a fresh ``python -X faulthandler`` child
(``support/stress_runner.py``; ``stress_matrix.py`` has the matrix): every run must exit 0 with an empty stderr
and give batches byte-identical to the same pattern under ``ZEPHON_TOKENIZER_ENGINE=tokenizers`` (or, for a
tokenizer ``auto`` itself runs on ``tokenizers``, under ``auto``: ``AUTO_IS_REFERENCE``). A forced
engine may refuse a tokenizer — then with its one line and exit 1, never a crash. The exit patterns end the
process while engine work may be in flight: one batch then a normal exit (0, nothing on stderr), or the user's
own error right after the run starts (1, exactly that line).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from stress.stress_matrix import (
    AUTO_IS_REFERENCE,
    FULL,
    Case,
    Outcome,
    exit_pairs,
    pairs,
    patterns,
    reference_setting,
    run_matrix,
)
from support.stress_runner import EARLY_ERROR

#: Loader and count patterns give the batches of the plain run they load or count for.
REFERENCE_PATTERN = {
    "loader_fork": "direct",
    "loader_spawn": "direct",
    "count_processes": "count_threads",
    "exit_one_batch": "direct",
}


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory, cl100k_converted_dir: str) -> dict[tuple[str, str], Case]:
    started = time.perf_counter()
    cases = run_matrix(tmp_path_factory.mktemp("engine-stress"), Path(cl100k_converted_dir))
    children = sum(c.children for c in cases.values())
    engines = {t: c.outcomes["direct"].engine for (s, t), c in cases.items() if s == "auto"}
    print(f"\nengine stress: {children} children in {time.perf_counter() - started:.1f} s; auto ran {engines}")
    return cases


def explain(outcome: Outcome) -> str:
    return f"status {outcome.status}, exit code {outcome.rc}, stderr:\n{outcome.stderr}"


def reference(matrix: dict[tuple[str, str], Case], tokenizer: str, pattern: str) -> Outcome:
    setting = reference_setting(tokenizer)
    outcome = matrix[setting, tokenizer].outcomes[REFERENCE_PATTERN.get(pattern, pattern)]
    assert outcome.status == "done" and outcome.rc == 0, f"the {setting} reference failed: {explain(outcome)}"
    return outcome


def runs() -> list[tuple[str, str, str]]:
    return [(s, t, p) for s, t in pairs() for p in patterns(s, t)]


@pytest.mark.parametrize(("setting", "tokenizer", "pattern"), runs())
def test_every_run_completes_and_gives_the_tokenizers_batches(matrix, setting, tokenizer, pattern) -> None:
    outcome = matrix[setting, tokenizer].outcomes[pattern]
    if outcome.status == "refused":
        # A forced engine that cannot run this tokenizer exactly: its one line, exit 1 — the run never starts.
        assert setting not in ("auto", "tokenizers"), explain(outcome)
        assert outcome.rc == 1 and outcome.stderr.startswith(f"TokenizerError: ZEPHON_TOKENIZER_ENGINE={setting} ")
        return
    assert (outcome.status, outcome.rc, outcome.stderr) == ("done", 0, ""), explain(outcome)
    assert outcome.digest == reference(matrix, tokenizer, pattern).digest
    if pattern == "direct" and setting != "auto":  # a forced engine that passed its checks is the one that ran
        assert outcome.engine == setting


@pytest.mark.parametrize("tokenizer", [] if FULL else AUTO_IS_REFERENCE)
def test_auto_is_the_reference_only_where_it_runs_tokenizers(matrix, tokenizer) -> None:
    """``auto`` stands in for the ``tokenizers`` reference only while it encodes with ``tokenizers`` itself: an
    engine that starts to run this tokenizer exactly needs the reference child back (``AUTO_IS_REFERENCE``)."""
    assert ("tokenizers", tokenizer) not in pairs()
    assert matrix["auto", tokenizer].outcomes["direct"].engine == "tokenizers"


@pytest.mark.parametrize(("setting", "tokenizer"), exit_pairs())
def test_a_script_that_reads_one_batch_exits_cleanly_with_it(matrix, setting, tokenizer) -> None:
    outcome = matrix[setting, tokenizer].outcomes.get("exit_one_batch")
    if outcome is None:  # the engine refused this tokenizer (test_every_run_...): nothing to exit from
        assert matrix[setting, tokenizer].outcomes["direct"].status == "refused"
        return
    assert (outcome.status, outcome.rc, outcome.stderr) == ("done", 0, ""), explain(outcome)
    assert outcome.first == reference(matrix, tokenizer, "exit_one_batch").first


@pytest.mark.parametrize(("setting", "tokenizer"), exit_pairs())
def test_an_error_right_after_the_run_starts_exits_1_with_that_line_alone(matrix, setting, tokenizer) -> None:
    outcome = matrix[setting, tokenizer].outcomes.get("raise_after_build")
    if outcome is None:
        assert matrix[setting, tokenizer].outcomes["direct"].status == "refused"
        return
    assert (outcome.status, outcome.rc, outcome.stderr) == ("ended", 1, EARLY_ERROR + "\n"), explain(outcome)
