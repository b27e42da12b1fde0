"""A sidecar of scores for the demo corpus, so curricula by metadata run offline (docs/curricula.md).

``demo_scores_path(root)`` writes ``root/demo-scores/scores.parquet`` once (beside the shards' ``demo/``
directory, never inside it, so a dataset over that directory never reads it as a shard) and returns its path.
One row per demo document: ``id`` (the shards' key), ``int_score`` (0-5, like FineWeb-Edu's classifier score)
and ``cluster`` (``"<kind>-c<n>"``: every three consecutive documents of a kind share one, a stand-in for
near-duplicate clusters).

The shards themselves are unchanged — a score column inside them would change their bytes, fingerprints and
so every pinned demo plan; a sidecar is also how teams attach scores they compute after the fact.
Scores come from PCG64 raw bits of ``SeedSequence([seed, 0x73636f7265])`` (version-stable), one draw per
document in kind then id order, modulo 6: the same file for the same seed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.demo.corpus import DEMO_KINDS, DEMO_SHARDS
from zephon.demo.dataset import _default_root
from zephon.storage.files import atomic_file

__all__ = ["demo_scores_path", "demo_scores_table"]

_STREAM = 0x73636F7265  # "score"


def demo_scores_table(seed: int = 0) -> pa.Table:
    """The demo's sidecar table (see the module docstring)."""
    ids: list[str] = []
    clusters: list[str] = []
    for kind in DEMO_KINDS:
        shards, per_shard = DEMO_SHARDS[kind]
        for s in range(shards):
            for r in range(per_shard):
                ids.append(f"{kind}-{s}-{r}")
                clusters.append(f"{kind}-c{(s * per_shard + r) // 3}")
    bits = np.random.PCG64(np.random.SeedSequence([seed, _STREAM])).random_raw(len(ids))
    score = (bits % np.uint64(6)).astype(np.int8)
    return pa.table({"id": ids, "int_score": score, "cluster": clusters})


def demo_scores_path(root: str | os.PathLike[str] | None = None, *, seed: int = 0) -> str:
    """Path of the demo's scores sidecar under ``root`` (default: the demo data root), written when missing."""
    base = Path(os.path.expanduser(os.fspath(root if root is not None else _default_root())))
    path = base / "demo-scores" / "scores.parquet"
    table = demo_scores_table(seed)
    if path.is_file():
        try:
            if pq.read_table(path).equals(table):
                return str(path)
        except (OSError, pa.ArrowException):
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "the demo scores sidecar", "or set ZEPHON_DEMO_DIR to a writable directory") as tmp:
        pq.write_table(table, tmp)
    return str(path)
