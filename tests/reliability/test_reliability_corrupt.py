"""Bad input and data that changed under a plan: errors name dataset, shard, row and the fix; the skip policy
counts what it skips; whole-shard damage is always an error (docs/reliability.md)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.raw_strings import raw_strings
from tokenizers import Tokenizer

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError
from zephon.executor.read.shard_reader import ShardReader
from zephon.executor.runner import iterate_batches
from zephon.executor.settings import ExecutorSpec
from zephon.io import Dataset
from zephon.plan.records import ShardRef
from zephon.planner.build import seal_bundle
from zephon.specs import BatchSpec, PackSpec, TokenizeSpec
from zephon.storage.local import discover_local_files
from zephon.storage.scan import scan_shard
from zephon.work import MixtureSpec, ShuffleSpec, StaticMixtureWorkSource, TokenEstimation

FIX_SKIP = re.escape('or skip and count such documents with Pipeline.options(on_bad_document="skip")')

# One JSONL shard with a document of every bad kind; rows 0, 7 and 8 are valid (row 7 is empty text).
LINES: list[bytes] = [
    json.dumps({"text": "alpha beta gamma"}).encode(),
    b'{"text": "caf\xe9 latin-1"}',  # row 1: not UTF-8
    b'{"text": "broken',  # row 2: invalid JSON
    b"[1, 2, 3]",  # row 3: not an object
    json.dumps({"body": "no text key"}).encode(),  # row 4: missing field
    json.dumps({"text": None}).encode(),  # row 5: null
    json.dumps({"text": 7}).encode(),  # row 6: not a string
    json.dumps({"text": ""}).encode(),  # row 7: empty text, a valid document
    json.dumps({"text": "omega delta"}).encode(),
]
REASONS = ["not_utf8", "invalid_json", "not_an_object", "missing_field", "null_text", "not_text"]
MESSAGES = [
    r"row 1 must be UTF-8 text, got byte 0xe9 at byte 13 of the line — re-encode the file as UTF-8",
    r"row 2 must be a JSON object, got invalid JSON \(Unterminated string .*\) in '\{\"text\": \"broken' — fix or remove that line",
    r"row 3 must be a JSON object, got a JSON array — fix or remove that line",
    r"row 4 must have the field 'text', got keys \['body'\] — fix the data or choose another text field "
    r"\(tokenize\(field=\.\.\.\) in Python, `field:` under `tokenizer:` in CONFIG, --field for zephon show and zephon tokenize\)",
    r"row 5 field 'text' must be a string, got null — clean the data",
    r"row 6 field 'text' must be a string, got int — clean the data",
]


def write_jsonl(path: Path, lines: list[bytes], *, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def refs_of(path: Path, dataset: str = "web") -> list[ShardRef]:
    refs = []
    for i, f in enumerate(discover_local_files(dataset, str(path))):
        info = scan_shard(dataset, f)
        refs.append(info.placed(shard_id=i, dataset_id=0, dataset=dataset))
    return refs


def read_all(refs: list[ShardRef], **kw) -> list[str | None]:
    reader = ShardReader(refs, "text", capacity=2, **kw)
    try:
        return reader.texts(np.zeros(refs[0].rows, np.int64), np.arange(refs[0].rows))
    finally:
        reader.close()


def one_lane_source(path: Path, **kw) -> StaticMixtureWorkSource:
    """Plan order = row order (no shuffle, one lane, one epoch)."""
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(path))],
        mixture=MixtureSpec({"web": 1}),
        seed=0,
        epochs=1,
        shuffle=ShuffleSpec(enabled=False),
        lanes=1,
        **kw,
    )


def pipeline(plan: Path, tokenizer_dir: str, **options) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .options(**options)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=16)
        .batch(microbatch_size=2)
    )


def stream(batches) -> list[int]:
    return [int(t) for b in batches for i in range(len(b)) for t in b.tokens[i, : b.lengths[i]]]


def encode(tokenizer_dir: str, texts: list[str]) -> list[int]:
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    return [t for text in texts for t in [*tok.encode(text, add_special_tokens=False).ids, 0]]  # demo EOS is 0


# ---------------------------------------------------------------- bad documents: one error each, complete
@pytest.mark.parametrize("row", range(1, 7))
def test_each_bad_document_kind_names_dataset_shard_row_and_fix(tmp_path, row) -> None:
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", [LINES[0], LINES[row]])
    refs = refs_of(shard)
    message = MESSAGES[row - 1].replace(f"row {row}", "row 1")
    with pytest.raises(DatasetError, match=rf"^dataset 'web': shard {re.escape(str(shard))} {message}.*{FIX_SKIP}"):
        read_all(refs, skippable=True)  # a run of an estimated plan: the skip policy is suggested


def test_a_line_of_only_whitespace_is_named_as_such(tmp_path) -> None:
    """An empty line is not a row; a line of spaces or tabs is one, and json's "Expecting value" said nothing of
    what was wrong with it."""
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", [LINES[0], b" \t "])
    with pytest.raises(
        DatasetError,
        match=rf"^dataset 'web': shard {re.escape(str(shard))} row 1 must be a JSON object, got a line of only "
        r"whitespace ' \\t ' — remove it \(an empty line is not a row; one of spaces or tabs is\), " + FIX_SKIP,
    ):
        read_all(refs_of(shard), skippable=True)


def test_skip_policy_returns_none_for_bad_documents_and_counts_each_by_reason(tmp_path, caplog) -> None:
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", LINES)
    seen: list[tuple[str, int, str]] = []
    with caplog.at_level(logging.WARNING, logger="zephon"):
        texts = read_all(
            refs_of(shard), on_bad_document="skip", on_skip=lambda r, row, why: seen.append((r.uri, row, why))
        )
    assert texts == ["alpha beta gamma", None, None, None, None, None, None, "", "omega delta"]
    assert seen == [(str(shard), row, reason) for row, reason in enumerate(REASONS, start=1)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"shard {shard} row 1 must be UTF-8 text" in warnings[0]  # once per shard


def test_a_utf8_byte_order_mark_and_crlf_are_not_errors(tmp_path) -> None:
    shard = tmp_path / "web" / "bom.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b'\xef\xbb\xbf{"text": "first"}\r\n{"text": "second"}\r\n')
    assert read_all(refs_of(shard)) == ["first", "second"]


@pytest.mark.parametrize(
    ("encoding", "suffix", "told"),
    [
        ("utf-16", ".jsonl", r"UTF-16 text \(byte order mark FF FE\), not UTF-8: convert it with iconv -f UTF-16 -t UTF-8"),
        ("utf-16-le", ".jsonl", r"UTF-16 text without a byte order mark \(a NUL byte beside the first character\), not "
         r"UTF-8: convert it with iconv -f UTF-16LE -t UTF-8"),
        ("utf-16-be", ".jsonl", r"UTF-16 text without a byte order mark .* iconv -f UTF-16BE -t UTF-8"),
        ("utf-32", ".jsonl", r"UTF-32 text \(byte order mark FF FE 00 00\), not UTF-8: convert it with iconv -f UTF-32"),
        ("utf-16", ".jsonl.gz", r"UTF-16 text \(byte order mark FF FE\), not UTF-8"),
    ],
)
def test_a_utf16_or_utf32_jsonl_is_refused_when_planned_not_skipped_line_by_line(
    tmp_path, tokenizer_dir, encoding, suffix, told
) -> None:
    """Split on its 0A bytes, such a file is lines of NULs, each invalid JSON: the skip policy would have counted the
    whole file away. It is refused as a file, at planning, in one line naming the encoding and the conversion."""
    text = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(6)).encode(encoding)
    shard = tmp_path / "web" / f"part-0{suffix}"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    with pytest.raises(DatasetError, match=rf"^dataset 'web': shard {re.escape(str(shard))} must be readable jsonl(\.gz)?, got {told}"):
        one_lane_source(shard.parent).plan(tmp_path / "plan")


def test_skip_end_to_end_no_tokens_for_skipped_documents_and_stats_by_reason_and_shard(tmp_path, tokenizer_dir) -> None:
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", LINES)
    plan = one_lane_source(shard.parent).plan(tmp_path / "plan")
    with pytest.raises(DatasetError, match=rf"shard {re.escape(str(shard))} row 1 must be UTF-8"):
        list(pipeline(plan, tokenizer_dir))  # default: raise
    pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    got = stream(pipe)
    # The empty document is valid: it contributes its EOS (the demo tokenizer adds no BOS).
    assert got == encode(tokenizer_dir, ["alpha beta gamma", "", "omega delta"])
    stats = pipe.stats()
    assert stats.skipped == dict.fromkeys(REASONS, 1)
    assert stats.skipped_by_shard == {str(shard): dict.fromkeys(REASONS, 1)}
    assert stats.documents == {"web": 3} and stats.tokens == {"web": len(got)}


def test_skip_resumes_exactly_from_a_state(tmp_path, tokenizer_dir) -> None:
    lines = [json.dumps({"text": f"document {i} " + "word " * (i % 5)}).encode() for i in range(40)]
    for bad in (3, 11, 12, 30):
        lines[bad] = json.dumps({"text": None}).encode()
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", lines)
    plan = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(shard.parent))],
        mixture=MixtureSpec({"web": 1}),
        seed=1,
        epochs=2,
        lanes=2,
    ).plan(tmp_path / "plan")
    full = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    batches = list(full)
    assert full.stats().skipped == {"null_text": 8}  # 4 documents, 2 epochs
    first = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    it = iter(first)
    head = [next(it) for _ in range(5)]
    resumed = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    resumed.load_state_dict(first.state_dict())
    rest = list(resumed)
    assert [b.tokens.tolist() for b in head + rest] == [b.tokens.tolist() for b in batches]


def bad_then_skipped(
    shard: Path, tokenizer_dir: str, plan_dir: Path, *, error: str, kept: list[str], skipped: dict[str, int]
) -> None:
    """A plan of ``shard``'s dataset 'web' fails in one line (``error``: the regex after "dataset 'web': shard
    SHARD "), and under the skip policy gives the tokens of ``kept`` with ``skipped`` counted."""
    plan = one_lane_source(shard.parent).plan(plan_dir)
    with pytest.raises(DatasetError, match=rf"^dataset 'web': shard {re.escape(str(shard))} {error}"):
        list(pipeline(plan, tokenizer_dir))
    pipe = pipeline(plan, tokenizer_dir, on_bad_document="skip")
    assert stream(pipe) == encode(tokenizer_dir, kept)
    assert pipe.stats().skipped == skipped


def test_null_parquet_text_is_a_document_error_and_skippable(tmp_path, tokenizer_dir) -> None:
    (tmp_path / "web").mkdir()
    shard = tmp_path / "web" / "part-0.parquet"
    pq.write_table(pa.table({"text": ["one two", None, "", "three"]}), shard, row_group_size=2)
    error = r"row 1 field 'text' must be a string, got null — clean the data"
    bad_then_skipped(
        shard, tokenizer_dir, tmp_path / "plan", error=error, kept=["one two", "", "three"], skipped={"null_text": 1}
    )


def test_a_jsonl_text_with_a_lone_surrogate_is_a_document_error_and_skippable(tmp_path, tokenizer_dir) -> None:
    """JSON's "\\ud800" escape without its pair parses to a string no engine can encode (tokenizers raised a
    TypeError naming nothing): a bad document, not_utf8. An escaped pair is one character and reads as it is."""
    lines = [json.dumps({"text": t}).encode() for t in ["one two", "cut \ud83d emoji", "pair \U0001f600 ok"]]
    assert b"\\ud83d\\ude00" in lines[2] and b"\\ud83d" in lines[1]  # json.dumps escapes them (ensure_ascii)
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", lines)
    error = (
        r"row 1 field 'text' must be text UTF-8 can encode, got a lone surrogate U\+D83D \(a JSON \\u escape "
        r"without its pair\) — fix or remove that line, " + FIX_SKIP
    )
    kept = ["one two", "pair \U0001f600 ok"]
    bad_then_skipped(shard, tokenizer_dir, tmp_path / "plan", error=error, kept=kept, skipped={"not_utf8": 1})


def test_parquet_text_that_is_not_utf8_is_a_document_error_and_skippable(tmp_path, tokenizer_dir) -> None:
    (tmp_path / "web").mkdir()
    shard = tmp_path / "web" / "part-0.parquet"
    column = raw_strings([b"one two", b"caf\xe9 latin-1", None, b"three"])
    pq.write_table(pa.table({"text": column}), shard, row_group_size=2)
    error = (
        r"row 1 must be UTF-8 text, got byte 0xe9 at byte 3 of field 'text' — write the column again as UTF-8, fix "
        r"or remove that row, " + FIX_SKIP
    )
    skipped = {"not_utf8": 1, "null_text": 1}
    bad_then_skipped(shard, tokenizer_dir, tmp_path / "plan", error=error, kept=["one two", "three"], skipped=skipped)


# ---------------------------------------------------------------- a shard is not a document: always an error
def test_shard_level_problems_stay_errors_under_skip(tmp_path, tokenizer_dir) -> None:
    (tmp_path / "a").mkdir()
    pq.write_table(pa.table({"body": ["x", "y"]}), tmp_path / "a" / "p.parquet")
    plan = one_lane_source(tmp_path / "a").plan(tmp_path / "plan-a")
    with pytest.raises(
        DatasetError,
        match=r"shard .*p\.parquet must have the column 'text', got columns \['body'\] — choose one of them as the "
        r"text field: tokenize\(field=\.\.\.\) in Python,",
    ):
        list(pipeline(plan, tokenizer_dir, on_bad_document="skip"))

    (tmp_path / "b").mkdir()
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "b" / "p.parquet")
    plan = one_lane_source(tmp_path / "b").plan(tmp_path / "plan-b")
    with pytest.raises(
        DatasetError,
        match=r"column 'text' must hold strings, got int64 — choose a text column as the text field "
        r"\(tokenize\(field=\.\.\.\) in Python,",
    ):
        list(pipeline(plan, tokenizer_dir, on_bad_document="skip"))


def lift_meta_text(record: dict) -> dict:
    return {**record, "text": record["meta"]["text"]}


def test_a_dotted_field_into_a_nested_column_says_how_to_lift_it(tmp_path, tokenizer_dir) -> None:
    """``meta.text`` names no column or key; where ``meta`` is one, the error says to lift the field with a
    map_transform — and the map_transform it spells out gives the batches of the same texts in a plain column."""
    texts = ["one two", "three"]
    for kind in ("pq", "js", "plain"):
        (tmp_path / kind).mkdir()
    meta = pa.StructArray.from_arrays([pa.array(texts), pa.array([1, 2])], names=["text", "n"])
    pq.write_table(pa.table({"meta": meta}), tmp_path / "pq" / "p.parquet")
    (tmp_path / "js" / "p.jsonl").write_text("".join(json.dumps({"meta": {"text": t}}) + "\n" for t in texts))
    pq.write_table(pa.table({"text": texts}), tmp_path / "plain" / "p.parquet")
    want = stream(pipeline(one_lane_source(tmp_path / "plain").plan(tmp_path / "plan-plain"), tokenizer_dir))
    lift = r"; 'meta\.text' reads as a field inside 'meta', which fields do not reach — lift it with a map_transform "
    lift += r"returning \{\*\*record, 'text': record\['meta'\]\['text'\]\} and tokenize field 'text' \(Python\), or "
    lift += r"write it to a column of its own"
    told = {
        "pq": r"must have the column 'meta\.text', got columns \['meta'\] — .*",
        "js": r"must have the field 'meta\.text', got keys \['meta'\] — .*",
    }
    for kind, message in told.items():
        plan = one_lane_source(tmp_path / kind).plan(tmp_path / f"plan-{kind}")
        nested = Pipeline.from_plan(plan).tokenize(tokenizer_id=tokenizer_dir, field="meta.text")
        with pytest.raises(DatasetError, match=message + lift):
            list(nested.pack_flat(max_length=16).batch(microbatch_size=2))
        lifted = Pipeline.from_plan(plan).map_transform(lift_meta_text).tokenize(tokenizer_id=tokenizer_dir)
        assert want and stream(lifted.pack_flat(max_length=16).batch(microbatch_size=2)) == want
    with pytest.raises(DatasetError) as plain:  # no dotted name: the message as before
        list(pipeline(one_lane_source(tmp_path / "pq").plan(tmp_path / "plan-pq-text"), tokenizer_dir))
    assert "must have the column 'text', got columns ['meta']" in str(plain.value) and "lift it" not in str(plain.value)


def test_truncated_parquet_is_refused_at_plan_and_at_run_time(tmp_path, tokenizer_dir) -> None:
    (tmp_path / "web").mkdir()
    shard = tmp_path / "web" / "p.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(50)]}), shard)
    data = shard.read_bytes()
    plan = one_lane_source(shard.parent).plan(tmp_path / "plan")
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        DatasetError,
        match=rf"shard {re.escape(str(shard))} changed since planning: size must be {len(data)} bytes, got {len(data) // 2} — restore the planned data or re-plan",
    ):
        list(pipeline(plan, tokenizer_dir, on_bad_document="skip"))
    with pytest.raises(
        DatasetError, match=r"must be a readable Parquet file, got .*PAR1.* — re-export or remove the file"
    ):
        one_lane_source(shard.parent).plan(tmp_path / "plan2")


def test_a_corrupt_parquet_page_names_the_row_group_and_rows(tmp_path, tokenizer_dir) -> None:
    (tmp_path / "web").mkdir()
    shard = tmp_path / "web" / "p.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(40)]}), shard, row_group_size=10, compression="none")
    plan = one_lane_source(shard.parent).plan(tmp_path / "plan")
    offset = pq.ParquetFile(shard).metadata.row_group(2).column(0).data_page_offset
    data = bytearray(shard.read_bytes())
    data[offset : offset + 8] = b"\xff" * 8  # the page header: same size, same footer
    shard.write_bytes(bytes(data))
    with pytest.raises(
        DatasetError,
        match=r"row group 2 \(rows 20-29\) must decode, got .* the file is corrupt: restore it from its source or re-export it",
    ):
        list(pipeline(plan, tokenizer_dir, on_bad_document="skip"))


@pytest.mark.parametrize("fmt", ["gz", "zst"])
def test_truncated_compressed_jsonl_is_a_clear_error_not_a_raw_eoferror(tmp_path, fmt) -> None:
    import zstandard

    (tmp_path / "web").mkdir()
    data = b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n" for i in range(200))
    blob = gzip.compress(data, mtime=0) if fmt == "gz" else zstandard.ZstdCompressor().compress(data)
    good = tmp_path / "web" / f"p.jsonl.{fmt}"
    good.write_bytes(blob)
    ref = refs_of(good)[0]
    kind = "gzip" if fmt == "gz" else "zstd"
    # Planning refuses a truncated file...
    cut = tmp_path / "cut" / f"p.jsonl.{fmt}"
    cut.parent.mkdir()
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(
        DatasetError,
        match=rf"^dataset 'web': shard {re.escape(str(cut))} must be readable jsonl\.{fmt}, got a truncated {kind} stream .* — re-export or remove the file",
    ):
        refs_of(cut)
    # ...and so does the reader (for a shard whose fingerprint cannot be checked, e.g. a plan of another tool).
    good.write_bytes(blob[: len(blob) // 2] + bytes(len(blob) - len(blob) // 2))
    unchecked = dataclasses.replace(ref, fingerprint="")
    with pytest.raises(
        DatasetError,
        match=rf"shard {re.escape(str(good))} must be a complete jsonl\.{fmt} file, got a (truncated|corrupt) {kind} stream",
    ):
        read_all([unchecked])


def test_exact_plans_refuse_the_skip_policy(tmp_path, tokenizer_dir) -> None:
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", [LINES[0], LINES[8]])
    tok = TokenizeSpec(tokenizer_id=tokenizer_dir)
    plan = one_lane_source(shard.parent, token_estimation=TokenEstimation(), exact_tokens=True).plan(
        tmp_path / "plan", tokenize=tok, pack=PackSpec(max_length=16)
    )
    spec = ExecutorSpec(
        tokenize=tok, pack=PackSpec(max_length=16), batch=BatchSpec(microbatch_size=2), on_bad_document="skip"
    )
    with pytest.raises(
        ConfigError,
        match=r'on_bad_document must be "raise" for an exact plan, got \'skip\' — its token counts, offsets and packing include every document',
    ):
        next(iterate_batches(plan, spec))
    with pytest.raises(ConfigError, match=r'on_bad_document must be "raise" or "skip", got \'drop\''):
        Pipeline.from_plan(plan).options(on_bad_document="drop")


# ---------------------------------------------------------------- data that changed under a plan
def test_jsonl_changed_with_the_same_size_is_refused_by_its_fingerprint(tmp_path, tokenizer_dir) -> None:
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", [LINES[0], LINES[8]])
    plan = one_lane_source(shard.parent).plan(tmp_path / "plan")
    before = json.loads((plan / "plan.json").read_text())
    shard.write_bytes(shard.read_bytes().replace(b"alpha", b"ALPHA"))
    with pytest.raises(
        DatasetError,
        match=rf"shard {re.escape(str(shard))} changed since planning: its bytes must match fingerprint blake2b:\w+, got blake2b:\w+ — restore the planned data or re-plan",
    ):
        list(pipeline(plan, tokenizer_dir))
    assert before["format_version"] == 2


def test_parquet_rewritten_with_the_same_size_is_refused_by_its_footer(tmp_path, tokenizer_dir) -> None:
    (tmp_path / "web").mkdir()
    shard = tmp_path / "web" / "p.parquet"

    def write(texts: list[str]) -> None:
        pq.write_table(pa.table({"text": texts}), shard, compression="none", use_dictionary=False)

    write(["apple pie", "banana split", "cherry tart"])
    size = shard.stat().st_size
    plan = one_lane_source(shard.parent).plan(tmp_path / "plan")
    write(["apricot p", "banana split", "cherry tart"])
    assert shard.stat().st_size == size  # same size: only the footer (statistics) tells
    with pytest.raises(
        DatasetError,
        match=r"changed since planning: its Parquet footer \(row groups, offsets, statistics\) must match fingerprint pqfooter:\w+, got pqfooter:\w+ — restore",
    ):
        list(pipeline(plan, tokenizer_dir))


def test_a_row_count_other_than_planned_is_refused(tmp_path, tokenizer_dir) -> None:
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", [LINES[0], LINES[8]])
    plan = one_lane_source(shard.parent).plan(tmp_path / "plan")
    table = pq.read_table(plan / "shards.parquet")
    rows = pa.array([r + 1 for r in table.column("rows").to_pylist()], pa.int64())
    pq.write_table(table.set_column(table.schema.get_field_index("rows"), "rows", rows), plan / "shards.parquet")
    seal_bundle(plan)  # the bundle says 3 rows as if planned so: the shard's own check refuses it
    with pytest.raises(DatasetError, match=r"changed since planning: rows \(non-empty lines\) must be 3, got 2"):
        list(pipeline(plan, tokenizer_dir))


def test_a_removed_shard_is_refused_by_name(tmp_path, tokenizer_dir) -> None:
    shard = write_jsonl(tmp_path / "web" / "part-0.jsonl", [LINES[0]])
    plan = one_lane_source(shard.parent).plan(tmp_path / "plan")
    shard.unlink()
    with pytest.raises(
        DatasetError,
        match=rf"^dataset 'web': shard {re.escape(str(shard))} must exist as planned, got No such file or directory — restore the file or re-plan",
    ):
        list(pipeline(plan, tokenizer_dir))


# A Hub branch that moved after planning: the plan still reads its pinned commit —
# tests/test_hub_pipeline.py::test_a_moved_branch_does_not_change_what_a_plan_reads.
