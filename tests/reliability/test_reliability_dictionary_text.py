"""A text column stored as a dictionary of strings (pandas' ``category``; Arrow ``dictionary<values=string>``)
is read as its strings, by the planner's scans and the executor alike (docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import doc_text  # the shared tiny-text helper

from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def _dataset(root: Path, name: str, *, dictionary: bool) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    texts = pa.array([doc_text("web", 0, r % 7) for r in range(30)])  # repeated texts, as a category column has
    column = texts.dictionary_encode() if dictionary else texts
    pq.write_table(pa.table({"text": column}), folder / "part-0.parquet", row_group_size=8)
    return folder


@pytest.mark.parametrize("exact", [False, True], ids=["estimated", "exact"])
def test_a_category_text_column_plans_and_batches_as_its_strings(tmp_path, tokenizer_dir, exact) -> None:
    runs = []
    for dictionary in (False, True):
        folder = _dataset(tmp_path / str(dictionary), "web", dictionary=dictionary)
        if dictionary:
            assert pa.types.is_dictionary(pq.read_schema(folder / "part-0.parquet").field("text").type)
        web = Dataset.from_path("web", str(folder))
        source = StaticMixtureWorkSource(
            datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=1, **({"exact_tokens": True} if exact else {})
        )
        pipe = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=17)
        runs.append([b.tokens.tolist() for b in pipe.batch(microbatch_size=2)])
    assert runs[0] and runs[1] == runs[0]
