"""benchmarks/bench_cut.py's measurement runs on this checkout (the cut it times is the one the executor uses)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_cut


def test_the_cut_is_timed_on_the_documents_given(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 40, size=500)
    np.savez(tmp_path / "sizes.npz", sizes=sizes, ids=rng.integers(0, 1000, size=int(sizes.sum())).astype(np.int32))
    assert bench_cut.measure(str(tmp_path / "sizes.npz"), (17, 4, 12, 4)) > 0
