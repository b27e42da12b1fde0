"""``torch.distributed.checkpoint`` (DCP): the pipeline's state as one rank-independent value under one key.

DCP writes tensors from the ranks that own them, but a non-tensor value (bytes, a string, a number) only from
the coordinator, rank 0, and every rank reads rank 0's value back. A per-rank loader state therefore vanishes
when the data-parallel size changes (torchtitan #409 "DataLoader state is empty for dp rank 16"). Zephon's state
is rank-independent once merged: ``Pipeline.state_dict()`` gathers every rank's lane cursors, so rank 0's value
holds every lane and resumes any data-parallel size dividing the global batch. DCP also flattens nested dicts
into one key per leaf and loads only the keys its template holds, so the state travels as one JSON string:
``{"zephon_state": "<json>"}`` (``zephon.integrations.state_text``).

Example::

    import torch.distributed.checkpoint as dcp
    data = DataCheckpoint(pipeline)          # or DataCheckpoint(pipeline.dataloader(num_workers=2))
    dcp.save({"model": model_state, "data": data}, checkpoint_id="ckpt/step-100")   # every rank (a collective)
    ...                                                                              # later, on any dp size
    dcp.load({"model": model_state, "data": data}, checkpoint_id="ckpt/step-100")
    for batch in pipeline: ...                                                       # resumes at step 100

Saving under ``torch.distributed`` is a collective (DCP calls ``state_dict()`` on every rank): checkpoint all
ranks together, at a step boundary to resume on another data-parallel size.
"""

from __future__ import annotations

from typing import Any

from zephon.integrations.consumed import ConsumedLoader
from zephon.integrations.state_text import pack, unpack
from zephon.integrations.versions import require_tested


class DataCheckpoint:
    """A DCP ``Stateful`` (and an object ``accelerator.register_for_checkpointing`` takes) over a ``Pipeline``, a
    ``Pipeline.dataloader()`` or a ``ConsumedLoader`` (then ``consumed()`` says how many microbatches of the
    iteration training took; the default counts every one handed out)."""

    def __init__(self, source: Any, *, consumed: Any = None) -> None:
        require_tested("torch")
        self.source = source
        self.consumed = consumed

    def state_dict(self) -> dict[str, str]:
        """``{"zephon_state": JSON}``: the merged state (a collective under torch.distributed)."""
        if isinstance(self.source, ConsumedLoader):
            taken = self.consumed() if self.consumed is not None else self.source.handed
            return pack(self.source.state_after(taken))
        return pack(self.source.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the source's next iteration where the saved state was taken (refused in one line when it is
        another plan's, tokenizer's or packing's, or not a Zephon state)."""
        self.source.load_state_dict(unpack(state_dict, "the checkpoint's data state"))
