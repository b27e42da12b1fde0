"""Ctrl-C at any phase of ``zephon plan``: nothing half-written, the spill directory removed, a rerun clean.

The child is the real CLI in a fresh interpreter; a wrapper patches one planner call to send this process a real
``SIGINT`` at the chosen moment — after the first shard scanned, after a sidecar join wrote its partitions (the
spill directory full), after the first partition joined, after the first count array was saved, after the first
chunk of samples.parquet was written, and (on the two-node Ray cluster) when the first partition's Ray task
returned while the others are queued or running (they are cancelled). Python raises ``KeyboardInterrupt`` at the next instruction, as it does for a Ctrl-C at a terminal.
Every plan kind is interrupted too: a samples plan while writing, a token mixture while estimating, a cost mixture
while its computed cost pass saves, a continuation while writing its parent's kept prefix (each over a partitioned
sidecar selection). After each: the CLI exits 1 with click's ``Aborted!``, ``$TMPDIR`` is empty (no ``zephon-select-*``), no plan and
no temporary bundle exist, and a rerun writes the bytes an uninterrupted plan writes (count arrays saved before
the interrupt are reused: each was written whole, through a rename).

``kill -9`` at controlled moments is tests/reliability/test_reliability_crash.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from zephon.cli import cli

# The child: make MOMENT's call send SIGINT to this process once, then run the CLI with the remaining arguments.
CHILD = r"""
import os, signal, sys
moment = sys.argv[1]
# As at a terminal: a process started in the background by a shell (CI's job runner, `cmd &`) inherits SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler; the test is of Ctrl-C, so put it back.
signal.signal(signal.SIGINT, signal.default_int_handler)

def interrupt_after(owner, name, nth=1):
    real, calls = getattr(owner, name), []
    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == nth:
            os.kill(os.getpid(), signal.SIGINT)
        return out
    setattr(owner, name, wrapped)

if moment == "scan":
    import zephon.planner.prepare as m; interrupt_after(m, "scan_shard", 2)
elif moment == "partitioned":
    import zephon.planner.selection.join as m; interrupt_after(m, "_partition")
elif moment == "joining":
    import zephon.planner.selection.join as m; interrupt_after(m, "_join_part")
elif moment == "counting":
    import zephon.planner.counts.lengths as m; interrupt_after(m, "save_atomic")
elif moment == "writing":
    import zephon.planner.samples_writer as m; interrupt_after(m.SamplesWriter, "write")
elif moment == "estimating":
    import zephon.planner.prepare as m; interrupt_after(m, "estimate_dataset")
elif moment == "costing":
    import zephon.planner.counts.computed as m; interrupt_after(m, "save_atomic")
elif moment == "ray-join":  # the first partition's task returned, the others queued or running
    import ray; interrupt_after(ray, "wait")
from zephon.cli import cli
cli.main(args=sys.argv[2:], prog_name="zephon")
"""

ROWS = 400


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four Parquet shards with an int64 id and a score, a sidecar of quality for most ids, and a CONFIG of an
    exact plan selecting by both (its sidecar join forced into partitions by the test)."""
    root = tmp_path_factory.mktemp("interrupt")
    (root / "data").mkdir()
    (root / "side").mkdir()
    rng = np.random.default_rng(2)
    for s in range(4):
        text = [f"shard {s} doc {r} " + "word " * (r % 9) for r in range(ROWS)]
        ids = pa.array(range(s * ROWS, (s + 1) * ROWS), pa.int64())
        table = pa.table({"id": ids, "text": text, "score": rng.integers(0, 5, ROWS).astype(np.int8)})
        pq.write_table(table, root / "data" / f"part-{s}.parquet", row_group_size=100)
    keys = [k for k in range(4 * ROWS) if k % 5 != 1]
    pq.write_table(
        pa.table({"id": pa.array(keys, pa.int64()), "quality": rng.random(len(keys))}), root / "side" / "q.parquet"
    )
    return root


def _config(corpus: Path, tmp_path: Path, tokenizer_dir: str) -> Path:
    cfg = tmp_path / "work.yaml"
    cfg.write_text(
        f"seed: 5\ndatasets:\n  - {{name: web, path: {corpus / 'data'}, metadata: {corpus / 'side'}, key: id, "
        f'where: "quality > 0.3 AND score >= 1"}}\nmixture: {{web: 1}}\nepochs: 2\nexact_tokens: true\n'
        f"tokenizer: {{id: {tokenizer_dir}, field: text}}\npacking: {{max_length: 65}}\n"
    )
    return cfg


def _tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


MOMENTS = ["scan", "partitioned", "joining", "counting", "writing"]


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_leaves_nothing_half_written_and_a_rerun_writes_the_same_plan(
    corpus, tmp_path, tokenizer_dir, monkeypatch, moment
) -> None:
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "3")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    cfg = _config(corpus, tmp_path, tokenizer_dir)
    out = tmp_path / "plans" / "run"
    args = ["plan", str(cfg), "-o", str(out), "--workers", "1"]
    child = subprocess.run([sys.executable, "-c", CHILD, moment, *args], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1 and child.stderr.strip().endswith("Aborted!"), (child.returncode, child.stderr)
    assert list(scratch.iterdir()) == []  # the selection's spill directory is gone
    leftovers = [p.name for p in out.parent.iterdir()] if out.parent.exists() else []
    assert leftovers in (
        [],
        [".run.lock"],
    )  # no plan, no temporary (the writers' lock stays: see test_reliability_crash)
    cache = os.environ["ZEPHON_CACHE_DIR"]  # the child's: count arrays saved before the interrupt
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "fresh"))  # the uninterrupted reference counts anew
    reference = CliRunner().invoke(cli, [*args[:3], str(tmp_path / "reference"), "--workers", "1"])
    assert reference.exit_code == 0, reference.output
    monkeypatch.setenv("ZEPHON_CACHE_DIR", cache)
    rerun = CliRunner().invoke(cli, args)
    assert rerun.exit_code == 0, rerun.output
    assert _tree(out) == _tree(tmp_path / "reference") and list(scratch.iterdir()) == []


def test_ctrl_c_while_join_tasks_run_on_ray_cancels_them_and_leaves_nothing(
    ray_cluster, corpus, tmp_path, tokenizer_dir, monkeypatch
) -> None:
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "3")
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)  # the child joins the running cluster
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    cfg = _config(corpus, tmp_path, tokenizer_dir)
    out = tmp_path / "run"
    args = ["plan", str(cfg), "-o", str(out), "--engine", "ray"]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, "ray-join", *args], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 1 and child.stderr.strip().endswith("Aborted!"), (child.returncode, child.stderr)
    assert list(scratch.iterdir()) == [] and not out.exists()


#: A cost function on the child's import path (``PYTHONPATH``) and this process's (``syspath_prepend``).
COSTS = "def chars(row):\n    return len(row['text']) / 4\n"

KINDS = {  # plan kind: (CONFIG after `seed` and `datasets`, the moment it is interrupted at)
    "samples": ("num_documents: 900\n", "writing"),
    "tokens": ("num_tokens: 20000\ntoken_estimation: {calibration_samples: 64}\n", "estimating"),
    "cost": ("mixture_unit: cost\nnum_cost: 20000\n", "costing"),
    "continuation": ("num_tokens: 30000\ntoken_estimation: {calibration_samples: 64}\nexact_tokens: true\n", "writing"),
}


def _kind_config(corpus: Path, tmp_path: Path, tokenizer_dir: str, kind: str) -> Path:
    cost = ", cost: {function: 'zephon_interrupt_costs:chars'}" if kind == "cost" else ""
    cfg = tmp_path / f"{kind}.yaml"
    cfg.write_text(
        f"seed: 5\ndatasets:\n  - {{name: web, path: {corpus / 'data'}, metadata: {corpus / 'side'}, key: id, "
        f'where: "quality > 0.3"{cost}}}\nmixture: {{web: 1}}\n{KINDS[kind][0]}'
        + ("" if kind == "cost" else f"tokenizer: {{id: {tokenizer_dir}, field: text}}\npacking: {{max_length: 65}}\n")
    )
    return cfg


@pytest.mark.parametrize("kind", KINDS)
def test_ctrl_c_in_every_plan_kind_leaves_nothing_and_a_rerun_writes_the_same_plan(
    corpus, tmp_path, tokenizer_dir, monkeypatch, kind
) -> None:
    """Samples, token and cost mixtures and a continuation (over a partitioned sidecar selection): a SIGINT while
    writing, estimating, computing costs, or writing the kept prefix of a parent."""
    monkeypatch.setenv("ZEPHON_SELECT_PARTITIONS", "3")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    (tmp_path / "fns").mkdir()
    (tmp_path / "fns" / "zephon_interrupt_costs.py").write_text(COSTS)
    monkeypatch.syspath_prepend(str(tmp_path / "fns"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fns"), os.environ.get("PYTHONPATH", "")]))
    cfg = _kind_config(corpus, tmp_path, tokenizer_dir, kind)
    out = tmp_path / "plans" / "run"
    extra = []
    if kind == "continuation":  # the parent: an exact plan of the same data, 10000 tokens
        parent = tmp_path / "parent.yaml"
        parent.write_text(cfg.read_text().replace("num_tokens: 30000", "num_tokens: 10000"))
        made = CliRunner().invoke(cli, ["plan", str(parent), "-o", str(tmp_path / "parent"), "--workers", "1"])
        assert made.exit_code == 0, made.output
        extra = ["--continue-from", str(tmp_path / "parent"), "--at-step", "3", "--global-batch", "4"]
    args = ["plan", str(cfg), "-o", str(out), "--workers", "1", *extra]
    moment = KINDS[kind][1]
    child = subprocess.run([sys.executable, "-c", CHILD, moment, *args], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1 and child.stderr.strip().endswith("Aborted!"), (child.returncode, child.stderr)
    assert list(scratch.iterdir()) == []
    leftovers = [p.name for p in out.parent.iterdir()] if out.parent.exists() else []
    assert leftovers in ([], [".run.lock"])  # no plan, no temporary
    cache = os.environ["ZEPHON_CACHE_DIR"]
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "fresh"))
    reference = CliRunner().invoke(cli, ["plan", str(cfg), "-o", str(tmp_path / "reference"), "--workers", "1", *extra])
    assert reference.exit_code == 0, reference.output
    monkeypatch.setenv("ZEPHON_CACHE_DIR", cache)
    rerun = CliRunner().invoke(cli, args)
    assert rerun.exit_code == 0, rerun.output
    assert _tree(out) == _tree(tmp_path / "reference") and list(scratch.iterdir()) == []
