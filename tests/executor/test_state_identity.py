"""A state is a function of the batches handed out alone: the state after a batch is the same, byte for byte,
with any ``num_workers``, read-ahead, tokenizer threads and resume — never how far the plan happened to be read.

Lane cursors (``zephon.executor.pack.lanes``): inside a document, it and the tokens emitted; between documents,
one past the last document emitted whole. Before, a lane with nothing buffered stated how far its reader had
read, or the first document pushed after it ran dry — positions that depend on chunks and workers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from support.demo_plans import code_and_short_plan

import zephon
from zephon import Pipeline
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource

MAX_LENGTH = 65
GLOBAL = 8


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> dict[str, tuple[Path, str | None]]:
    """``mixed``: short documents beside code files (lanes far apart, rows ending on document ends); ``empty``:
    one text in five empty, tokenized with no BOS/EOS — documents of no token between and inside rows."""
    root = tmp_path_factory.mktemp("state-identity")
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    mixed = code_and_short_plan(root, tokenizer_dir, MAX_LENGTH)  # the plan of test_lane_blocks.py
    web = root / "web"
    web.mkdir()
    rows = [{"text": "" if r % 5 == 2 else f"document {r} " + "word " * (r % 17)} for r in range(1500)]
    (web / "part-0.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tokenize = TokenizeSpec(tokenizer_id=tokenizer_dir, special_tokens="none")
    empty = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web))],
        mixture=MixtureSpec({"web": 1}),
        seed=3,
        shuffle=ShuffleSpec(enabled=False),
    ).plan(root / "empty", tokenize=tokenize, pack=PackSpec(max_length=MAX_LENGTH))
    return {"mixed": (mixed, None), "empty": (empty, "none")}


def _pipeline(plan: tuple[Path, str | None], tokenizer_dir: str, micro: int = 4) -> Pipeline:
    path, special = plan
    return (
        Pipeline.from_plan(path)
        .tokenize(tokenizer_id=tokenizer_dir, special_tokens=special)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=micro, global_batch_size=GLOBAL)
    )


def _run(pipe: Pipeline) -> list[tuple[Any, ...]]:
    """Every batch (ids, lengths, pieces) and the state after it."""
    return [
        (batch.tokens.tobytes(), batch.lengths.tolist(), batch.pieces.tolist(), pipe.state_dict()) for batch in pipe
    ]


@pytest.mark.parametrize("kind", ["mixed", "empty"])
def test_states_are_the_same_with_any_read_ahead_threads_and_resume(
    monkeypatch: pytest.MonkeyPatch, plans: dict[str, tuple[Path, str | None]], tokenizer_dir: str, kind: str
) -> None:
    want = _run(_pipeline(plans[kind], tokenizer_dir))
    assert len(want) > 20
    between = [w for w in want[: len(want) // 2] if any(c[1] == 0 for c in w[-1]["lane_cursors"].values())]
    assert between  # states in the first half with a lane between documents: the cursors this is about
    with monkeypatch.context() as settings:
        settings.setenv("ZEPHON_READ_AHEAD", "off")
        assert _run(_pipeline(plans[kind], tokenizer_dir)) == want
    assert _run(_pipeline(plans[kind], tokenizer_dir).options(tokenizer_threads=1)) == want
    for k in (1, 2, 7, len(want) // 2, len(want) - 1):  # resumed after batch k: the rest of the run, states too
        resumed = _pipeline(plans[kind], tokenizer_dir)
        resumed.load_state_dict(want[k - 1][-1])
        assert _run(resumed) == want[k:], f"resumed after batch {k}"


@pytest.mark.parametrize("kind", ["mixed", "empty"])
def test_the_loaders_state_is_the_pipelines_with_any_workers(
    plans: dict[str, tuple[Path, str | None]], tokenizer_dir: str, kind: str
) -> None:
    direct = _pipeline(plans[kind], tokenizer_dir)
    want = [direct.state_dict() for _ in direct]
    for workers in (0, 1, 2, 3):
        loader = _pipeline(plans[kind], tokenizer_dir).dataloader(num_workers=workers)
        assert [loader.state_dict() for _ in loader] == want, f"{workers} workers"


@pytest.mark.parametrize("kind", ["mixed", "empty"])
def test_two_ranks_states_merged_are_the_one_rank_state_after_every_step(
    plans: dict[str, tuple[Path, str | None]], tokenizer_dir: str, kind: str
) -> None:
    """The state is rank-independent: at dp 2 (each rank half of every global batch) the ranks' states merged
    after each step are the state of one rank taking whole global batches, but for ``dp_size`` and
    ``microbatch_size`` (how the run cuts its steps, not where it stands)."""
    one = _pipeline(plans[kind], tokenizer_dir, micro=GLOBAL)
    want = [one.state_dict() for _ in one]
    ranks = [_pipeline(plans[kind], tokenizer_dir).options(dp_rank=r, dp_size=2) for r in range(2)]
    states = [[rank.state_dict() for _ in rank] for rank in ranks]
    merged = [zephon.merge_states(list(pair)) for pair in zip(*states, strict=True)]
    assert [{**m, "dp_size": 1, "microbatch_size": GLOBAL} for m in merged] == want


def test_a_state_in_the_earlier_form_resumes_to_the_same_batches(
    plans: dict[str, tuple[Path, str | None]], tokenizer_dir: str
) -> None:
    """States saved before cursors were canonical named, for a lane between documents, any position from one past
    its last document up to its next one (how far the plan was read): each resumes to the same batches."""
    want = _run(_pipeline(plans["mixed"], tokenizer_dir))
    samples = pq.read_table(plans["mixed"][0] / "samples.parquet", columns=["position", "deal"]).to_pydict()
    lanes = want[0][-1]["lanes"]
    of = {lane: [p for p, d in zip(samples["position"], samples["deal"], strict=True) if d % lanes == lane]
          for lane in range(lanes)}  # fmt: skip
    earlier = []  # (batch, the state after it in the earlier form) where that form differs
    for k in range(1, len(want)):
        state = json.loads(json.dumps(want[k - 1][-1]))
        for lane, (position, skip) in state["lane_cursors"].items():
            if skip == 0:  # the lane's next document, as the earlier form stated it once it was read
                nxt = min((p for p in of[int(lane)] if p >= position), default=len(samples["position"]))
                state["lane_cursors"][lane] = [nxt, 0]
        if state != want[k - 1][-1]:
            earlier.append((k, state))
    assert len(earlier) >= 3
    for k, state in earlier[:: max(1, len(earlier) // 3)]:
        resumed = _pipeline(plans["mixed"], tokenizer_dir)
        resumed.load_state_dict(state)
        assert [entry[:-1] for entry in _run(resumed)] == [entry[:-1] for entry in want[k:]], f"after batch {k}"
