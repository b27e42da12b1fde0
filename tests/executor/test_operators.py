"""User operators: map_transform / map_batch before tokenizing, fingerprinted, checked, counted in exact plans."""

from __future__ import annotations

import copy
import pickle
import random
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import doc_text
from support.chat_data import build_tokenizer

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError
from zephon.executor.encode.text import Encoder
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_LENGTH = 24


def keep_even_upper(record: dict) -> dict | None:
    """Drop odd rows (by the row's own id), upper-case the rest."""
    if int(str(record["id"]).rsplit("-", 1)[-1]) % 2:
        return None
    return {**record, "text": record["text"].upper()}


def upper_all(records: list[dict]) -> list[dict | None]:
    return [keep_even_upper(r) for r in records]


def noisy(record: dict) -> dict:
    return {**record, "text": record["text"] + str(random.random())}


def by_batch_size(records: list[dict]) -> list[dict]:
    return [{**r, "text": f"{len(records)} {r['text']}"} for r in records]


def all_but_last(records: list[dict]) -> list[dict]:
    return records[:-1]


def explode(record: dict) -> dict:
    if record["id"] in (3, "docs-0-3"):
        raise KeyError("missing 'title'")
    return record


def source(path: Path, *, exact: bool = False) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path("docs", str(path))], mixture=MixtureSpec({"docs": 1.0}), seed=4, exact_tokens=exact
    )


def pipe(plan_dir: Path, tok: str, *ops, batch: bool = False) -> Pipeline:
    p = Pipeline.from_plan(plan_dir)
    for op in ops:
        p = p.map_batch(op) if batch else p.map_transform(op)
    return p.tokenize(tokenizer_id=tok).pack_flat(max_length=MAX_LENGTH).batch(microbatch_size=2)


def stream(p: Pipeline) -> list[int]:
    return [t for b in p for r in range(len(b)) for t in b.tokens[r, : b.lengths[r]].tolist()]


def expected_stream(tok: str, texts: list[str]) -> list[int]:
    return [t for ids in Encoder(TokenizeSpec(tokenizer_id=tok)).encode(texts) for t in ids.tolist()]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> str:
    return str(build_tokenizer(tmp_path_factory.mktemp("tok") / "t", eos="</s>"))


def test_map_transform_drops_and_rewrites_and_counts_the_dropped(tmp_path, tok, make_parquet) -> None:
    path = make_parquet("docs", [10, 10])
    planned = source(path).plan(tmp_path / "plan")
    p = pipe(planned, tok, keep_even_upper)
    got = stream(p)
    table = pq.read_table(planned / "samples.parquet")
    shards = {s: f"docs-{i}" for i, s in enumerate(sorted(set(table["shard_id"].to_pylist())))}
    texts = []
    from conftest import doc_text

    for shard, row in zip(table["shard_id"].to_pylist(), table["row"].to_pylist(), strict=True):
        if row % 2 == 0:
            texts.append(doc_text("docs", int(shards[shard].split("-")[1]), row).upper())
    assert p.stats().skipped == {"dropped": 10}
    assert sum(p.stats().documents.values()) == 10
    assert p.stats().tokenizer_engine  # an operator keeps the engine layer underneath
    # the plan's lanes: compare as multisets of documents per lane-independent token counts
    assert sorted(got) == sorted(expected_stream(tok, texts))
    assert stream(pipe(planned, tok, upper_all, batch=True)) == got  # map_batch of the same function: same data
    assert stream(pipe(planned, tok, keep_even_upper).options(read_chunk=3)) == got  # chunking changes nothing


def test_a_filter_in_an_exact_plan_is_in_the_count_pass(tmp_path, tok, make_jsonl) -> None:
    from zephon.executor.operators import Operator

    path = make_jsonl("docs", [12])
    op = Operator.of("map_transform", keep_even_upper)
    spec = TokenizeSpec(tokenizer_id=tok)
    planned = source(path, exact=True).plan(
        tmp_path / "plan", tokenize=spec, pack=PackSpec(max_length=MAX_LENGTH), operators=(op,)
    )
    table = pq.read_table(planned / "samples.parquet").to_pydict()
    from conftest import doc_text

    texts = {r: doc_text("docs", 0, r).upper() for r in range(12) if r % 2 == 0}
    lengths = {r: len(ids) for r, ids in zip(texts, Encoder(spec).encode(list(texts.values())), strict=True)}
    for row, tokens in zip(table["row"], table["tokens"], strict=True):
        assert tokens == lengths.get(row, 0)  # odd rows were dropped by the count pass: 0 tokens
    ordered = [texts[r] for r in table["row"] if r in texts]
    assert stream(pipe(planned, tok, keep_even_upper)) == expected_stream(tok, ordered)
    with pytest.raises(ConfigError, match=r"an exact plan must run with the operators it was counted with, got none"):
        list(pipe(planned, tok))
    with pytest.raises(
        ConfigError,
        match=r"got map_transform test_operators.upper_all_one \(planned with map_transform test_operators.keep_even_upper\)",
    ):

        def upper_all_one(record: dict) -> dict:
            return record

        upper_all_one.__qualname__ = "upper_all_one"
        list(pipe(planned, tok, upper_all_one))


#: What ``per_process`` does differs between processes, as a choice made with Python's salted hash() would.
PROCESS = {"drop_odd": False, "shout": False}


def per_process(record: dict) -> dict | None:
    if PROCESS["drop_odd"] and int(str(record["id"])[-1]) % 2:
        return None
    return {**record, "text": record["text"].upper()} if PROCESS["shout"] else record


def test_an_exact_plan_whose_operators_act_otherwise_in_training_is_refused_naming_the_row(
    tmp_path, tok, make_jsonl, monkeypatch
) -> None:
    """Same source, same fingerprint, other output (the start-up check runs in one process, so it cannot see
    it): a planned document dropped now, or given other tokens, is one line naming its row — not a TypeError
    from the engine on a None text."""
    from zephon.executor.operators import Operator

    planned = source(make_jsonl("docs", [12]), exact=True).plan(
        tmp_path / "plan",
        tokenize=TokenizeSpec(tokenizer_id=tok),
        pack=PackSpec(max_length=MAX_LENGTH),
        operators=(Operator.of("map_transform", per_process),),
    )
    assert stream(pipe(planned, tok, per_process))  # as planned: runs
    monkeypatch.setitem(PROCESS, "drop_odd", True)
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'docs': shard \S+part-00000.jsonl row \d*[13579] must be a document, as when the exact plan "
        r"counted its tokens, got it dropped by the operators now — operators must give the same output in every "
        r"process: make their choices from the record with a stable hash \(hashlib\), not Python's hash\(\)",
    ):
        list(pipe(planned, tok, per_process))
    monkeypatch.setitem(PROCESS, "drop_odd", False)
    monkeypatch.setitem(PROCESS, "shout", True)
    with pytest.raises(DatasetError, match=r"tokens as counted at planning, got \d+ — the data, the tokenizer or an "
                       r"operator's output changed; re-plan$"):
        list(pipe(planned, tok, per_process))


def test_a_nondeterministic_map_transform_is_refused_at_start_up(tmp_path, tok, make_parquet) -> None:
    planned = source(make_parquet("docs", [8])).plan(tmp_path / "plan")
    with pytest.raises(ConfigError, match=r"^map_transform test_operators.noisy must be deterministic .* at dataset"):
        list(pipe(planned, tok, noisy))
    with pytest.raises(
        ConfigError, match=r"map_batch test_operators.by_batch_size must be deterministic .* own record"
    ):
        list(pipe(planned, tok, by_batch_size, batch=True))
    # One output short is a miscount, not randomness (its halves lose two: the start-up check saw them differ).
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'docs': shard \S+ row \d+: map_batch test_operators.all_but_last must return a list of \d+ "
        r"records \(one per record, None to drop one\), got \d+ — return one output per input$",
    ):
        list(pipe(planned, tok, all_but_last, batch=True))


def drop_everything(record: dict) -> None:
    return None


def test_operators_that_drop_every_document_say_so_without_naming_a_skip_policy(tmp_path, tok, make_parquet) -> None:
    """No on_bad_document policy was set: the run's end names the operators, not the text field and the data."""
    from zephon.executor.operators import Operator

    data = make_parquet("docs", [8])
    planned = source(data).plan(tmp_path / "plan")
    with pytest.raises(
        DatasetError,
        match=r"^the operators must leave documents to train on, got all 8 documents of the plan dropped \(returned "
        r"None\) — check when the map_transform/map_batch functions return None$",
    ):
        list(pipe(planned, tok, drop_everything))
    with pytest.raises(  # an exact plan counts with the operators: refused as it is planned (a ZeroDivisionError)
        DatasetError,
        match=r"^the operators must leave documents to train on, got all 8 documents of the plan dropped \(returned "
        r"None\) when the exact plan counted them — check when",
    ):
        source(data, exact=True).plan(
            tmp_path / "exact",
            tokenize=TokenizeSpec(tokenizer_id=tok),
            pack=PackSpec(max_length=MAX_LENGTH),
            operators=(Operator.of("map_transform", drop_everything),),
        )
    assert not (tmp_path / "exact").exists()


def test_an_operator_fingerprint_mismatch_on_resume_is_refused(tmp_path, tok, make_parquet) -> None:
    planned = source(make_parquet("docs", [16])).plan(tmp_path / "plan")
    first = pipe(planned, tok, keep_even_upper)
    for b in first:
        if b.step == 1:
            break
    state = first.state_dict()
    assert state["operators"][0]["name"] == "test_operators.keep_even_upper"
    again = pipe(planned, tok, keep_even_upper)
    again.load_state_dict(state)  # same operator: accepted
    with pytest.raises(ConfigError, match=r"operators map_transform test_operators.keep_even_upper \(this pipeline: "):
        pipe(planned, tok).load_state_dict(state)
    versioned = Pipeline.from_plan(planned).map_transform(keep_even_upper, version=2)
    versioned = versioned.tokenize(tokenizer_id=tok).pack_flat(max_length=MAX_LENGTH).batch(microbatch_size=2)
    with pytest.raises(ConfigError, match=r"\(this pipeline: map_transform test_operators.keep_even_upper \(version 2"):
        versioned.load_state_dict(state)
    plain = pipe(planned, tok)
    for b in plain:
        if b.step == 1:
            break
    with pytest.raises(ConfigError, match=r"operators none \(this pipeline: map_transform"):
        pipe(planned, tok, keep_even_upper).load_state_dict(plain.state_dict())


def test_an_operator_that_raises_is_one_line_with_dataset_shard_row(tmp_path, tok, make_jsonl) -> None:
    planned = source(make_jsonl("docs", [6])).plan(tmp_path / "plan")
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'docs': shard \S+part-00000.jsonl row 3: map_transform "
        r"test_operators.explode must return a record or None, got KeyError: .*— fix the function",
    ):
        list(pipe(planned, tok, explode))
    skipping = pipe(planned, tok, explode).options(on_bad_document="skip")
    list(skipping)
    assert skipping.stats().skipped == {"operator_error": 1}


def cut_emoji_at(target: str):
    """An operator that leaves half an emoji (a lone surrogate, U+D83D) at the end of one record's text."""

    def cut_emoji(record: dict) -> dict:
        return {**record, "text": record["text"] + " \ud83d"} if record["id"] == target else record

    return cut_emoji


def test_an_operator_output_no_engine_can_encode_is_one_line_with_dataset_shard_row(tmp_path, tok, make_parquet) -> None:
    """Looked for only once the engine and tokenizers refuse a batch (encode.surrogates): a document among the
    calibration's first ones, one deep in the run's chunks, in a DataLoader worker, under the skip policy, and in an
    exact plan's count pass — each named by dataset, shard and row, never tokenizers' TypeError."""
    path = make_parquet("docs", [1500, 1500], row_group_size=500)
    planned = source(path).plan(tmp_path / "plan")
    table = pq.read_table(planned / "samples.parquet", columns=["shard_id", "row"])
    shard_of = {s: i for i, s in enumerate(sorted(set(table["shard_id"].to_pylist())))}

    def expected(position: int) -> tuple[str, str]:
        shard, row = shard_of[table["shard_id"][position].as_py()], table["row"][position].as_py()
        text = doc_text("docs", shard, row)
        return f"docs-{shard}-{row}", (
            rf"^dataset 'docs': shard \S+part-{shard:05d}.parquet row {row}: the text to tokenize must be encodable as "
            rf"UTF-8, got a lone surrogate U\+D83D at character {len(text) + 1} — if a map_transform/map_batch made "
            r"it, fix the function \(text.encode\('utf-8', 'replace'\).decode\(\) replaces them\); else fix or remove"
        )

    for position in (5, len(table) - 1):  # among the calibration's 2,048 documents, and past them
        target, message = expected(position)
        with pytest.raises(DatasetError, match=message):
            list(pipe(planned, tok, cut_emoji_at(target)))
        with pytest.raises(DatasetError, match=message):  # found after the reader's skip decisions: raised
            list(pipe(planned, tok, cut_emoji_at(target)).options(on_bad_document="skip"))
    with pytest.raises(DatasetError, match=message):
        list(pipe(planned, tok, cut_emoji_at(target)).dataloader(num_workers=1))

    from zephon.executor.operators import Operator

    exact = source(path, exact=True)
    with pytest.raises(DatasetError, match=message):  # the count pass
        exact.plan(
            tmp_path / "exact",
            tokenize=TokenizeSpec(tokenizer_id=tok),
            pack=PackSpec(max_length=MAX_LENGTH),
            operators=(Operator.of("map_transform", cut_emoji_at(target)),),
        )


def test_an_operator_pickle_cannot_send_to_a_spawned_worker_is_one_line(tmp_path, tok, make_parquet) -> None:
    """A lambda or a function defined inside another cannot reach a worker started by spawn (the pipeline goes
    through multiprocessing's pickler): refused naming the operator as it is pickled, before any worker starts; a
    module-level function is sent; copying the pipeline, a plain pickle and a forked worker are left as they were."""
    planned = source(make_parquet("docs", [8])).plan(tmp_path / "plan")

    def local_clean(record: dict) -> dict:
        return record

    for fn, name in ((lambda r: r, r"<lambda>"), (local_clean, r"local_clean")):
        message = (
            rf"^map_transform test_operators\.test_an_operator_pickle_cannot_send_to_a_spawned_worker_is_one_line\."
            rf"<locals>\.{name} must be picklable to reach another process \(a DataLoader worker started by spawn or "
            r"forkserver\), got \w+: .* — define it at module level \(not a lambda, not a function inside another\), "
            r"or use num_workers=0 or multiprocessing_context='fork'$"
        )
        with pytest.raises(ConfigError, match=message):
            ForkingPickler.dumps(pipe(planned, tok, fn))
        with pytest.raises(ConfigError, match=message):
            next(iter(pipe(planned, tok, fn).dataloader(num_workers=1, multiprocessing_context="spawn")))
        assert len(list(pipe(planned, tok, fn).dataloader(num_workers=1))) > 0  # forked: nothing pickled
        assert stream(copy.deepcopy(pipe(planned, tok, fn))) == stream(pipe(planned, tok, fn))
    again = pickle.loads(ForkingPickler.dumps(pipe(planned, tok, keep_even_upper)))
    assert stream(again) == stream(pipe(planned, tok, keep_even_upper))


def test_without_operators_nothing_changes(tmp_path, tokenizer_dir, make_parquet) -> None:
    planned = source(make_parquet("docs", [8])).plan(tmp_path / "plan")
    p = pipe(planned, tokenizer_dir)
    batches = list(p)
    assert "operators" not in p.state_dict()
    assert all(b.loss_mask is None for b in batches)
    for b in batches:  # labels as before masks existed: the next token, -100 only on padding
        expected = b.tokens[:, 1:].copy()
        expected[np.arange(1, b.tokens.shape[1])[None, :] >= b.lengths[:, None]] = -100
        assert np.array_equal(b.to_training()["labels"].numpy(), expected)


def to_messages(record: dict) -> dict:
    return {"messages": [{"role": "user", "content": record["q"]}, {"role": "assistant", "content": record["a"]}]}


def test_a_map_transform_can_feed_tokenize_chat(tmp_path, tok) -> None:
    from support.chat_data import write_parquet
    from tokenizers import Tokenizer

    data = write_parquet(tmp_path / "qa", [{"q": f"What is {i}?", "a": f"It is {i}."} for i in range(10)])
    planned = source(data).plan(tmp_path / "plan")
    p = (
        Pipeline.from_plan(planned)
        .map_transform(to_messages)
        .tokenize_chat(tokenizer_id=tok)
        .pack_flat(max_length=MAX_LENGTH)
        .batch(microbatch_size=2)
    )
    decoder = Tokenizer.from_file(f"{tok}/tokenizer.json")
    answers = []
    for b in p:
        for r in range(len(b)):
            row = b.tokens[r][b.loss_mask[r]]
            answers.append(decoder.decode(row.tolist(), skip_special_tokens=False))
    assert sorted("".join(answers).split("<|im_end|>"))[1:] == sorted(f"It is {i}." for i in range(10))


def test_an_exact_plan_counts_the_documents_its_operators_dropped_per_dataset(tmp_path, tok, make_jsonl) -> None:
    import json

    from zephon.cli.plan_commands import plan_summary
    from zephon.executor.operators import Operator
    from zephon.plan.manifest import read_manifest

    def drop_odd_docs(record: dict) -> dict | None:  # odd rows of "docs" dropped; every "more" row kept
        return None if record["text"].startswith("docs ") and record["id"] % 2 else record

    datasets = [Dataset.from_path(n, str(make_jsonl(n, [12, 5]))) for n in ("docs", "more")]
    exact = StaticMixtureWorkSource(
        datasets=datasets, mixture=MixtureSpec({"docs": 0.5, "more": 0.5}), seed=4, exact_tokens=True
    )
    spec, pack = TokenizeSpec(tokenizer_id=tok), PackSpec(max_length=MAX_LENGTH)
    op = Operator.of("map_transform", drop_odd_docs)
    planned = exact.plan(tmp_path / "plan", tokenize=spec, pack=pack, operators=(op,))
    table = pq.read_table(planned / "samples.parquet").to_pydict()
    names = {d["id"]: d["name"] for d in json.loads((planned / "plan.json").read_text())["datasets"]}
    zeros, odd = {"docs": 0, "more": 0}, 0
    for dataset_id, row, tokens in zip(table["dataset_id"], table["row"], table["tokens"], strict=True):
        zeros[names[dataset_id]] += tokens == 0
        odd += names[dataset_id] == "docs" and row % 2
    assert zeros == {"docs": odd, "more": 0} and odd > 0
    manifest = read_manifest(planned)
    assert {d.name: d.dropped_by_operators for d in manifest.datasets} == zeros
    assert any(
        line.startswith("  docs ") and line.endswith(f"dropped by operators {zeros['docs']}")
        for line in plan_summary(manifest, str(planned))
    )
    plain = exact.plan(tmp_path / "plain", tokenize=spec, pack=pack)
    assert "dropped_by_operators" not in (plain / "plan.json").read_text()
    assert all(d.dropped_by_operators is None for d in read_manifest(plain).datasets)
    assert not any("dropped by operators" in line for line in plan_summary(read_manifest(plain), str(plain)))


def test_an_operator_whose_file_no_longer_matches_its_code_is_hashed_from_its_code(tmp_path: Path) -> None:
    # Code run with exec under a file's name (a docs page, an edited notebook): at the function's lines the file
    # holds an unclosed bracket, so inspect.getsource raises tokenize.TokenError; the hash falls back to the code.
    from zephon.executor.operators import source_hash

    page = tmp_path / "page.md"
    page.write_text("text (\n" * 3, encoding="utf-8")
    namespace: dict = {}
    exec(compile("def fn(record):\n    return record\n", str(page), "exec"), namespace)
    again: dict = {}
    exec(compile("def fn(record):\n    return record\n", str(page), "exec"), again)
    assert source_hash(namespace["fn"]) == source_hash(again["fn"])
    assert len(source_hash(namespace["fn"])) == 64
