"""tokenize options: special-token modes and per-document max_tokens (truncate or split)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.chat_data import build_tokenizer

from zephon import Pipeline
from zephon.errors import ConfigError, DatasetError
from zephon.executor.encode.encoders import TextEncoder, make_encoder
from zephon.executor.encode.flags import FLAGGED, SEGMENT
from zephon.executor.encode.text import Encoder
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

TEXTS = ["the model", "a", "", "why how the a model data token train loss mask chat user reply helpful answer"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> str:
    return str(build_tokenizer(tmp_path_factory.mktemp("tok") / "t", eos="</s>"))


def test_default_settings_keep_the_seed_encoder_and_its_fingerprint(tokenizer_dir) -> None:
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    encoder = make_encoder(spec)
    assert type(encoder) is Encoder
    assert encoder.fingerprint == Encoder(spec).fingerprint


@pytest.mark.parametrize(
    ("mode", "head", "tail"),
    [("bos_eos", ["<s>"], ["</s>"]), ("bos", ["<s>"], []), ("eos", [], ["</s>"]), ("none", [], [])],
)
def test_special_token_modes_add_exactly_their_tokens(tok, mode, head, tail) -> None:
    encoder = make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens=mode))
    t = encoder.tokenizer
    for text, ids in zip(TEXTS, encoder.encode(TEXTS), strict=True):
        body = t.encode(text, add_special_tokens=False).ids
        assert ids.tolist() == [t.token_to_id(x) for x in head] + body + [t.token_to_id(x) for x in tail]
    fingerprints = {
        make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens=m)).fingerprint
        for m in ("bos_eos", "bos", "eos", "none")
    }
    assert len(fingerprints) == 4


def test_tokenizer_default_adds_what_the_tokenizer_adds(tokenizer_dir) -> None:
    encoder = make_encoder(TokenizeSpec(tokenizer_id=tokenizer_dir, special_tokens="tokenizer_default"))
    t = encoder.tokenizer
    for text, ids in zip(TEXTS, encoder.encode(TEXTS), strict=True):
        assert ids.tolist() == t.encode(text, add_special_tokens=True).ids


def test_max_tokens_truncates_keeping_the_special_tokens(tok) -> None:
    encoder = make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens="bos_eos", max_tokens=5))
    bos, eos = encoder.tokenizer.token_to_id("<s>"), encoder.tokenizer.token_to_id("</s>")
    for text, ids in zip(TEXTS, encoder.encode(TEXTS), strict=True):
        body = encoder.tokenizer.encode(text, add_special_tokens=False).ids
        assert ids.tolist() == [bos, *body[:3], eos]


def test_max_tokens_split_makes_segments_of_one_document(tok) -> None:
    encoder = make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens="eos", max_tokens=4, long_documents="split"))
    assert isinstance(encoder, TextEncoder) and encoder.flags
    eos = encoder.tokenizer.token_to_id("</s>")
    long = TEXTS[3]
    (ids,) = encoder.encode([long])
    body = encoder.tokenizer.encode(long, add_special_tokens=False).ids
    pieces = [body[i : i + 3] for i in range(0, len(body), 3)]
    expected = [t for p in pieces for t in [*p, eos]]
    assert ids.dtype == FLAGGED and ids["id"].tolist() == expected  # int32 ids, the flags beside them
    assert np.flatnonzero(ids["flags"] & SEGMENT).tolist() == list(range(4, len(expected), 4))


def test_max_tokens_must_leave_room_for_text(tok) -> None:
    with pytest.raises(ConfigError, match=r"max_tokens must leave room for text after 2 special tokens, got 2"):
        make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens="bos_eos", max_tokens=2))
    with pytest.raises(ConfigError, match=r"special_tokens must be one of bos_eos, bos, eos, none, tokenizer_default"):
        TokenizeSpec(tokenizer_id=tok, special_tokens="both")


@pytest.mark.parametrize("exact", [False, True])
def test_split_documents_restart_positions_and_labels_in_the_pipeline(tmp_path: Path, tok, make_jsonl, exact) -> None:
    path = make_jsonl("docs", [30])
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("docs", str(path))],
        mixture=MixtureSpec({"docs": 1.0}),
        seed=2,
        exact_tokens=exact,
    )
    spec = TokenizeSpec(tokenizer_id=tok, special_tokens="eos", max_tokens=6, long_documents="split")
    planned = source.plan(tmp_path / "plan", tokenize=spec, pack=PackSpec(max_length=17))
    p = (
        Pipeline.from_plan(planned)
        .tokenize(tokenizer_id=tok, special_tokens="eos", max_tokens=6, long_documents="split")
        .pack_flat(max_length=17)
        .batch(microbatch_size=2)
    )
    eos = make_encoder(spec).tokenizer.token_to_id("</s>")
    segments = 0
    for batch in p:
        assert batch.tokens.max() < 1 << 40  # flags cleared
        t = batch.to_training(return_position_ids=True, ignore_document_boundaries=True)
        pos = t["position_ids"].numpy()
        for r in range(len(batch)):
            n = int(batch.lengths[r])
            if n < 2:  # an empty row past the end of the plan
                continue
            row = batch.tokens[r, :n]
            # every segment is at most 6 tokens and ends with EOS: position ids never reach 6
            assert pos[r, : n - 1].max() < 6
            after_eos = np.flatnonzero(row[:-1] == eos) + 1
            assert batch.doc_start[r, after_eos].all()
            labels = t["labels"].numpy()[r]
            assert (labels[after_eos - 1] == -100).all()
            # every other token trains: split runs carry flags for segments only, and their unset LOSS bits were
            # taken for a loss mask that trained on nothing (every label -100)
            trains = np.setdiff1d(np.arange(n - 1), after_eos - 1)
            assert len(trains) and (labels[trains] == row[1:][trains]).all()
            segments += int(batch.doc_start[r, :n].sum())
        assert batch.loss_mask is None
        assert (batch.to_training()["labels"].numpy() != -100).sum() >= batch.lengths.sum() - 2 * len(batch)
    assert segments > 30  # more segments than documents: long documents were split


def test_a_pad_token_at_id_0_is_the_pad_id_not_eos(tok) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tok))  # the chat test tokenizer: <|endoftext|> (id 0) pads
    assert encoder.tokenizer.token_to_id("<|endoftext|>") == 0
    assert encoder.pad_id == 0 != encoder.eos_id


def test_an_exact_plan_of_empty_texts_without_special_tokens_is_refused_as_it_is_written(tmp_path: Path, tok) -> None:
    """Every document counted 0 tokens: the plan has no row to pack (its padding fraction divided by zero)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "empty").mkdir()
    pq.write_table(pa.table({"text": [""] * 6}), tmp_path / "empty" / "a.parquet")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("empty", str(tmp_path / "empty"))],
        mixture=MixtureSpec({"empty": 1.0}),
        seed=2,
        exact_tokens=True,
    )
    with pytest.raises(
        DatasetError,
        match=r"^an exact plan must hold tokens to train on, got 0 tokens in its 6 "
        r"documents \(empty texts, and no BOS or EOS added\) — check the text field",
    ):
        source.plan(
            tmp_path / "plan",
            tokenize=TokenizeSpec(tokenizer_id=tok, special_tokens="none"),
            pack=PackSpec(max_length=17),
        )
    assert not (tmp_path / "plan").exists()


def test_an_estimated_run_of_empty_texts_without_special_tokens_is_refused_not_zero_steps(tmp_path: Path, tok) -> None:
    """Every calibration document tokenized to nothing: the run's length measured 0 steps, and it ended silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "empty").mkdir()
    pq.write_table(pa.table({"text": [""] * 6}), tmp_path / "empty" / "a.parquet")
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("empty", str(tmp_path / "empty"))], mixture=MixtureSpec({"empty": 1.0}), seed=2
    )
    spec = TokenizeSpec(tokenizer_id=tok, special_tokens="none")
    plan = source.plan(tmp_path / "plan", tokenize=spec, pack=PackSpec(max_length=17))
    pipe = (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tok, special_tokens="none")
        .pack_flat(max_length=17)
        .batch(microbatch_size=2)
    )
    message = (
        r"^an estimated plan's first 6 documents must hold tokens to measure the run's length on, got 0 tokens "
        r"\(empty texts with no BOS or EOS added, or a token store.s documents of no id\) — check the text field 'text' and the data, or plan with "
        r"exact_tokens=True"
    )
    with pytest.raises(DatasetError, match=message):
        pipe.num_steps()
    with pytest.raises(DatasetError, match=message):
        next(iter(pipe))
    with_eos = Pipeline.from_plan(plan).tokenize(tokenizer_id=tok, special_tokens="eos").pack_flat(max_length=17)
    with_eos = with_eos.batch(microbatch_size=2)
    assert sum(int(b.lengths.sum()) for b in with_eos) == 6  # one EOS a document: a run, as before
