"""A Zephon error inside a DataLoader worker reaches the training loop as iterating the pipeline raises it: its
own one line (not torch's "Caught DatasetError in DataLoader worker process 0." and the worker's traceback),
after every batch before it (``zephon.loader_pieces.WorkerError``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from support.demo_plans import texts_plan

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.executor.pack import calibration

MAX_LENGTH = 33


def plan_with_nulls(root: Path, nulls: set[int], rows: int) -> Path:
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    texts = [None if r in nulls else f"doc {r} " + "word " * (r % 9) for r in range(rows)]
    return texts_plan(root / "web", texts, root / "plan")


def pipeline(plan: Path, tokenizer_dir: str, micro: int, policy: str) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(on_bad_document=policy, read_chunk=4)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=micro, global_batch_size=4)
    )


def until_error(batches: Any) -> tuple[list[bytes], BaseException | None]:
    got: list[bytes] = []
    try:
        for batch in batches:
            tensors = batch if isinstance(batch, dict) else batch.to_training()
            got.append(b"".join(tensors[k].numpy().tobytes() for k in sorted(tensors) if torch.is_tensor(tensors[k])))
    except Exception as exc:  # compared below, whatever it is
        return got, exc
    return got, None


@pytest.mark.parametrize(("micro", "workers"), [(4, 0), (4, 2), (2, 2)])
def test_a_bad_document_stops_the_loader_after_the_same_batches_with_the_same_one_line(
    tmp_path, tokenizer_dir, micro, workers, monkeypatch
) -> None:
    monkeypatch.setattr(calibration, "CALIBRATION_UNITS", 0)  # else the calibration reads this small plan whole
    plan = plan_with_nulls(tmp_path, {2400}, 2600)  # past the calibration's first 2,048 documents
    want, error = until_error(pipeline(plan, tokenizer_dir, micro, "raise"))
    assert isinstance(error, DatasetError) and len(want) > 10  # batches, then the document's error
    assert "row 2400" in str(error)
    got, raised = until_error(pipeline(plan, tokenizer_dir, micro, "raise").dataloader(num_workers=workers))
    assert type(raised) is DatasetError
    assert str(raised) == str(error) and "\n" not in str(raised)  # not "Caught DatasetError in DataLoader worker"
    assert got == want


def test_a_share_skipped_whole_is_raised_in_its_one_line_with_the_counts_so_far(tmp_path, tokenizer_dir) -> None:
    plan = plan_with_nulls(tmp_path, set(range(48)), 48)
    for workers in (0, 2):
        pipe = pipeline(plan, tokenizer_dir, 4, "skip")
        got, raised = until_error(pipe.dataloader(num_workers=workers))
        assert got == [] and type(raised) is DatasetError, raised
        assert str(raised).startswith('on_bad_document="skip" must leave documents to train on, got all ')
        assert "\n" not in str(raised)
        # the worker that raised brought its counts: the loader's stats hold them, as the pipeline's would
        skipped = pipe.stats().skipped.get("null_text", 0)
        assert (skipped == 48) if workers == 0 else (0 < skipped <= 48), (workers, pipe.stats().skipped)


def test_an_error_crosses_as_its_public_class_with_its_message() -> None:
    import pickle

    from zephon.errors import TokenizerError
    from zephon.executor.engines.spot_check import EngineMismatch
    from zephon.executor.records.collate import RecordError
    from zephon.loader_pieces import WorkerError

    for exc, kind in (
        (RecordError("record 3 must be a dict — fix", 3), DatasetError),  # arguments of its own: not picklable as is
        (EngineMismatch("engine x gave other ids — y", engine="x", index=1, detail="d"), TokenizerError),
        (DatasetError("dataset 'web': shard s row 7 — fix"), DatasetError),
    ):
        crossed = pickle.loads(pickle.dumps(WorkerError.of(exc))).exception()
        assert type(crossed) is kind and str(crossed) == str(exc)


def test_where_a_bad_document_stops_a_run_depends_on_the_plan_alone(tmp_path, tokenizer_dir, monkeypatch) -> None:
    """Under "raise" the error came when reading met the document: how far reading had run ahead of packing —
    the read chunk, and with workers the lanes each reads — moved it by hundreds of batches (2114 batches in
    process, 2325 through 2 workers, 2764 with read_chunk=4 on a 4,000-document plan). It now comes before the
    first batch whose rows reach the document in its lane: the batch at which the skip policy counts it."""
    monkeypatch.setattr(calibration, "CALIBRATION_UNITS", 0)  # past the calibration: its first 2,048 documents
    plan = plan_with_nulls(tmp_path, {2400}, 2600)

    def pipe(policy: str, read_chunk: int | None = None) -> Pipeline:
        options = {"on_bad_document": policy} | ({"read_chunk": read_chunk} if read_chunk else {})
        return (
            Pipeline.from_plan(plan)
            .options(**options)
            .tokenize(tokenizer_id=tokenizer_dir)
            .pack_flat(max_length=MAX_LENGTH)
            .batch(microbatch_size=4, global_batch_size=8)
        )

    skipping = pipe("skip")
    counted_at = next(k for k, _ in enumerate(skipping) if skipping.stats().skipped)  # the batch that moved past it
    whole, _ = until_error(pipe("skip"))
    for read_chunk in (None, 4, 64):
        got, raised = until_error(pipe("raise", read_chunk))
        assert type(raised) is DatasetError and "row 2400" in str(raised), raised
        assert len(got) == counted_at and got == whole[:counted_at], (read_chunk, len(got), counted_at)
    for workers in (1, 3):  # worker counts that split this rank's lanes
        got, raised = until_error(pipe("raise").dataloader(num_workers=workers))
        assert type(raised) is DatasetError and "row 2400" in str(raised), raised
        assert got == whole[:counted_at], (workers, len(got), counted_at)
