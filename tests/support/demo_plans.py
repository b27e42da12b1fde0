"""Estimated plans several executor tests share.

* ``code_and_short_plan``: the demo corpus's short documents beside its code files (0.4 / 0.6 of the tokens,
  seed 5, 30,000 tokens) — lanes far apart, rows ending on document ends, some lanes running dry near the end.
  Used by tests/executor/test_lane_blocks.py and test_state_identity.py.
* ``texts_plan``: one JSONL shard of the texts given (None: a null text, a bad document), planned in row order
  over 4 lanes. Used by test_lane_blocks.py, test_loader_stats.py and test_worker_errors.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource, TokenEstimation


def code_and_short_plan(root: Path, tokenizer_dir: str, max_length: int) -> Path:
    """Write the demo corpus under ``root / "data"`` and the plan under ``root / "plan"``; returns the plan."""
    from zephon.demo import write_demo_dataset

    write_demo_dataset(root / "data")
    source = StaticMixtureWorkSource(
        datasets=[
            Dataset.from_path("code", str(root / "data" / "demo" / "code-*.parquet")),
            Dataset.from_path("short", str(root / "data" / "demo" / "short-*.parquet")),
        ],
        mixture=MixtureSpec({"code": 0.6, "short": 0.4}),
        seed=5,
        token_estimation=TokenEstimation(calibration_samples=64),
        num_tokens=30_000,
    )
    return source.plan(
        root / "plan", tokenize=TokenizeSpec(tokenizer_id=tokenizer_dir), pack=PackSpec(max_length=max_length)
    )


def texts_plan(data: Path, texts: list[str | None], plan: Path) -> Path:
    """Write ``texts`` as the one shard ``data / "part-0.jsonl"`` of dataset ``data.name`` (a None text is written
    null) and plan it alone, unshuffled (plan order = row order), over 4 lanes, under ``plan``; returns the plan."""
    data.mkdir(parents=True)
    (data / "part-0.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path(data.name, str(data))],
        mixture=MixtureSpec({data.name: 1}),
        seed=0,
        shuffle=ShuffleSpec(enabled=False),
        lanes=4,
    )
    return source.plan(plan)
