"""A text column in any of Arrow's string layouts — plain, a dictionary of strings (pandas' ``category``), large
strings (Polars), string views (Polars' and DuckDB's Arrow, written as they are) — is read as its strings, by the
planner's scans and the executor alike, and a record's view columns reach user operators as plain values
(docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import doc_text  # the shared tiny-text helper

from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource

LAYOUTS = {
    "string": lambda texts: texts,
    "dictionary": lambda texts: texts.dictionary_encode(),
    "large_string": lambda texts: texts.cast(pa.large_string()),
    "string_view": lambda texts: texts.cast(pa.string_view()),
}


def _dataset(root: Path, name: str, layout: str, **columns: pa.Array) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    texts = pa.array([doc_text("web", 0, r % 7) for r in range(30)])  # repeated texts, as a category column has
    pq.write_table(pa.table({"text": LAYOUTS[layout](texts), **columns}), folder / "part-0.parquet", row_group_size=8)
    return folder


def _source(folder: Path, **options: object) -> StaticMixtureWorkSource:
    web = Dataset.from_path("web", str(folder))
    return StaticMixtureWorkSource(datasets=[web], mixture=MixtureSpec({"web": 1.0}), seed=1, **options)


@pytest.mark.parametrize("exact", [False, True], ids=["estimated", "exact"])
def test_a_text_column_in_any_string_layout_plans_and_batches_as_its_strings(tmp_path, tokenizer_dir, exact) -> None:
    runs = {}
    for layout in LAYOUTS:
        folder = _dataset(tmp_path / layout, "web", layout)
        stored = pq.read_schema(folder / "part-0.parquet").field("text").type
        assert layout == "string" or stored != pa.string()  # written as the layout, read back as it
        source = _source(folder, **({"exact_tokens": True} if exact else {}))
        pipe = Pipeline(source).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=17)
        runs[layout] = [b.tokens.tolist() for b in pipe.batch(microbatch_size=2)]
    assert runs["string"] and all(run == runs["string"] for run in runs.values())


def test_view_columns_reach_an_operator_as_plain_values(tmp_path, tokenizer_dir) -> None:
    """A record run (user operators) reads every column; views are taken like the offset layouts."""
    blobs = [bytes([r]) * (1 + r % 3) for r in range(30)]
    runs, kinds = [], set()
    for layout, blob_type in (("string", pa.binary()), ("string_view", pa.binary_view())):
        folder = _dataset(tmp_path / layout, "web", layout, blob=pa.array(blobs, blob_type))

        def tag(record: dict) -> dict:
            kinds.add((type(record["text"]), type(record["blob"])))
            return {**record, "text": f"{record['text']} {len(record['blob'])}"}

        pipe = Pipeline(_source(folder)).map_transform(tag).tokenize(tokenizer_id=tokenizer_dir).pack_flat(max_length=17)
        runs.append([b.tokens.tolist() for b in pipe.batch(microbatch_size=2)])
    assert kinds == {(str, bytes)}
    assert runs[0] and runs[1] == runs[0]
