"""``zephon.records``: the collates of record pipelines (a ``Pipeline`` without ``.tokenize()``, docs/records.md).

* ``default_collate`` — what ``.batch(collate=None)`` does: numbers and equal-shape arrays stacked into tensors,
  bytes, strings and ragged values kept as lists (``zephon.executor.records.collate``);
* ``TokenRows`` — records that carry token lists (a caption behind image placeholder tokens) as padded or packed
  rows: ``input_ids``, ``labels`` (-100 on placeholders, padding and record boundaries), ``attention_mask``,
  ``position_ids``, ``cu_seqlens``, and the other keys by ``default_collate``
  (``zephon.executor.records.token_rows``);
* ``computed_cost("mypkg.costs:image_cost", expression=None)`` — a dataset's ``cost=`` computed by a planning pass
  that calls the function on each sample (``zephon.recipe.computed_cost``; docs/records.md, "Computed costs");
* ``RecordError(message, index)`` — what a collate raises to refuse the ``index``-th record it was given: the run
  puts the record's dataset, shard and row before the message.

Example::

    collate = TokenRows(max_length=49, ignore_ids=(image_id,), pack=True)
    pipe = Pipeline(source).map_transform(to_tokens, seeded=True).batch(microbatch_size=8, collate=collate)
"""

from zephon.executor.records.collate import RecordError, default_collate
from zephon.executor.records.token_rows import TokenRows
from zephon.recipe.computed_cost import ComputedCost, computed_cost

__all__ = ["ComputedCost", "RecordError", "TokenRows", "computed_cost", "default_collate"]
