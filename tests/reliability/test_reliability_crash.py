"""Crash safety: ``kill -9`` of real ``zephon plan`` and ``zephon count`` processes at controlled moments.

The child is the real CLI in a fresh interpreter; a wrapper patches one standard-library call to touch a marker
file and sleep at the chosen moment (after writing half of ``plan.json``; just before the bundle directory is
renamed into place; between a count array's temporary and its rename), and the test kills it with SIGKILL.

Covered elsewhere, and not repeated here:

* a download killed mid-write into the shard cache —
  tests/test_shard_cache.py::test_killed_download_is_never_visible_and_its_leftover_is_cleaned;
* four processes hammering one cache directory with a limit smaller than the data (no corruption, limit held,
  no deadlock, bounded time) —
  tests/test_shard_cache.py::test_four_processes_share_a_small_cache_without_corruption_or_deadlock.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from zephon import Pipeline
from zephon.cli import cli
from zephon.errors import PlanFormatError

# The child: patch one call to pause at MOMENT, then run the CLI with the remaining arguments.
CHILD = r"""
import os, pathlib, sys, time
marker, moment = pathlib.Path(sys.argv[1]), sys.argv[2]

def pause():
    marker.touch()
    time.sleep(120)

if moment == "half-plan-json":  # killed after writing N bytes of the bundle's last file
    real_write_text = pathlib.Path.write_text
    def write_text(self, data, *args, **kwargs):
        if self.name == "plan.json":
            with open(self, "w", encoding="utf-8") as f:
                f.write(data[: len(data) // 2])
                f.flush()
            pause()
        return real_write_text(self, data, *args, **kwargs)
    pathlib.Path.write_text = write_text
else:  # "before-rename" (the bundle directory) or "count-rename" (the second per-shard count array)
    real_replace, calls = os.replace, []
    def replace(src, dst, *args, **kwargs):
        src, dst = os.fspath(src), os.fspath(dst)
        if moment == "before-rename" and ".tmp-" in os.path.basename(src):
            pause()
        if moment == "count-rename" and "token-counts" in dst:
            calls.append(dst)
            if len(calls) == 2:
                pause()
        return real_replace(src, dst, *args, **kwargs)
    os.replace = replace

from zephon.cli import cli
cli.main(args=sys.argv[3:], prog_name="zephon")
"""


def run_until_paused(tmp_path: Path, moment: str, args: list[str]) -> subprocess.Popen:
    """Start the CLI child and return it once it is paused at ``moment`` (the caller kills it)."""
    marker = tmp_path / f"paused-{moment}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(marker), moment, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),  # ZEPHON_CACHE_DIR of this test
    )
    deadline = time.monotonic() + 30
    while not marker.exists():
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"child ended (exit {child.returncode}) before {moment}: {out.decode()} {err.decode()}")
        assert time.monotonic() < deadline, f"child never reached {moment}"
        time.sleep(0.02)
    return child


def kill9(child: subprocess.Popen) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    assert child.returncode == -signal.SIGKILL


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Three Parquet shards and a CONFIG for them (with the demo tokenizer)."""
    data = tmp_path / "data"
    data.mkdir()
    for shard in range(3):
        texts = [f"shard {shard} document {i} " + "word " * (i % 7) for i in range(60)]
        pq.write_table(pa.table({"text": texts}), data / f"part-{shard}.parquet", row_group_size=20)
    return data


def config(tmp_path: Path, corpus: Path, tokenizer_dir: str) -> Path:
    cfg = tmp_path / "work.yaml"
    cfg.write_text(
        f"seed: 5\ndatasets:\n  - {{name: web, path: {corpus}}}\nmixture: {{web: 1}}\nepochs: 2\n"
        f"tokenizer: {{id: {tokenizer_dir}, field: text}}\n"
    )
    return cfg


@pytest.mark.parametrize("moment", ["half-plan-json", "before-rename"])
def test_killed_plan_never_leaves_a_visible_partial_bundle_and_a_rerun_succeeds(
    tmp_path, corpus, tokenizer_dir, moment
) -> None:
    cfg = config(tmp_path, corpus, tokenizer_dir)
    reference = tmp_path / "reference"
    assert CliRunner().invoke(cli, ["plan", str(cfg), "-o", str(reference)]).exit_code == 0
    out = tmp_path / "plans" / "run"
    child = run_until_paused(tmp_path, moment, ["plan", str(cfg), "-o", str(out)])
    try:
        assert not out.exists()  # while it writes, only a hidden temporary sibling exists
        (tmp,) = [p for p in out.parent.iterdir() if p.name.startswith(".run.tmp-") and p.is_dir()]
        assert (tmp / "samples.parquet").is_file()
    finally:
        kill9(child)
    assert not out.exists()
    with pytest.raises(PlanFormatError, match="must contain plan.json"):
        Pipeline.from_plan(out)
    rerun = CliRunner().invoke(cli, ["plan", str(cfg), "-o", str(out)])
    assert rerun.exit_code == 0, rerun.output
    for name in ("plan.json", "shards.parquet", "samples.parquet"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    # The rerun removed the killed run's temporary and its writer mark (the writer is gone).
    # (The writers' lock, .run.lock, stays: empty, and removing it would race with the next writer.)
    assert sorted(p.name for p in out.parent.iterdir()) == [".run.lock", "run"]


def test_a_live_or_foreign_writers_temporary_is_left_alone(tmp_path) -> None:
    from zephon.planner.build import WRITER_SUFFIX, sweep_stale_temporaries

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = socket.gethostname()
    marks = {"live": f"{here} {os.getpid()}", "foreign": "another-host 1", "dead": f"{here} {dead.pid}", "bare": None}
    for name, mark in marks.items():
        (tmp_path / f".run.tmp-{name}").mkdir()
        if mark is not None:
            (tmp_path / f".run.tmp-{name}{WRITER_SUFFIX}").write_text(mark)
    assert sweep_stale_temporaries(tmp_path / "run") == [tmp_path / ".run.tmp-dead"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".run.tmp-bare",
        ".run.tmp-foreign",
        f".run.tmp-foreign{WRITER_SUFFIX}",
        ".run.tmp-live",
        f".run.tmp-live{WRITER_SUFFIX}",
    ]


def test_killed_overwrite_leaves_no_partial_bundle(tmp_path, corpus, tokenizer_dir) -> None:
    cfg = config(tmp_path, corpus, tokenizer_dir)
    out = tmp_path / "plans" / "run"
    assert CliRunner().invoke(cli, ["plan", str(cfg), "-o", str(out)]).exit_code == 0
    old_samples = (out / "samples.parquet").read_bytes()
    cfg.write_text(cfg.read_text().replace("seed: 5", "seed: 6"))
    child = run_until_paused(tmp_path, "before-rename", ["plan", str(cfg), "-o", str(out), "--overwrite"])
    kill9(child)
    # Between the two renames of --overwrite the path holds nothing (never a mix of old and new files); the
    # old bundle is whole in a hidden sibling (docs/reliability.md says how to restore it).
    assert not out.exists()
    (old,) = [p for p in out.parent.iterdir() if p.name.startswith(".run.old-")]
    assert (old / "samples.parquet").read_bytes() == old_samples and (old / "plan.json").is_file()
    assert CliRunner().invoke(cli, ["plan", str(cfg), "-o", str(out), "--overwrite"]).exit_code == 0
    assert '"seed": 6' in (out / "plan.json").read_text()


def test_killed_count_reuses_finished_shards_and_a_rerun_completes(tmp_path, corpus, tokenizer_dir) -> None:
    cfg = config(tmp_path, corpus, tokenizer_dir)
    child = run_until_paused(tmp_path, "count-rename", ["count", str(cfg), "--workers", "1", "--no-progress"])
    counts = Path(os.environ["ZEPHON_CACHE_DIR"]) / "token-counts"
    try:
        finished = sorted(p.name for p in counts.iterdir() if ".tmp" not in p.name)
        assert len(finished) == 1  # the first shard's array is in place; the second is a temporary
    finally:
        kill9(child)
    leftovers = [p.name for p in counts.iterdir() if ".tmp" in p.name]
    assert len(leftovers) == 1 and leftovers[0].endswith(".tmp.npy")
    rerun = CliRunner().invoke(cli, ["count", str(cfg), "--workers", "1", "--no-progress"])
    assert rerun.exit_code == 0, rerun.output
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    texts = [t for f in sorted(corpus.glob("*.parquet")) for t in pq.read_table(f).column("text").to_pylist()]
    total = sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))
    assert rerun.output.splitlines()[0] == f"counted 2 shards (1 cached): {total} tokens"
    again = CliRunner().invoke(cli, ["count", str(cfg), "--workers", "1", "--no-progress"])
    assert again.output.splitlines()[0] == f"counted 0 shards (3 cached): {total} tokens"
