"""Chat data: masks from real templates survive packing, dp sizes and resume; labels follow the mask."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from support.chat_data import (
    CHATML,
    CHATML_TAGGED,
    INST,
    UNDIFFABLE,
    build_tokenizer,
    conversation,
    write_jsonl,
    write_parquet,
)

from zephon import Pipeline
from zephon.errors import DatasetError, TokenizerError
from zephon.executor.engines import CANDIDATES
from zephon.io import Dataset
from zephon.specs import ChatSpec, PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_LENGTH = 48
TEMPLATES = {"chatml": (CHATML, "<|im_end|>"), "tagged": (CHATML_TAGGED, "<|im_end|>"), "inst": (INST, "</s>")}


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        messages = conversation(i)
        messages[0 if messages[0]["role"] == "user" else 1]["content"] = f"id{i} " + messages[1]["content"]
        out.append({"messages": messages})
    return out


def conversation_of(text: str, data: list[dict]) -> list[dict]:
    return data[int(re.search(r"id(\d+) ", text).group(1))]["messages"]


@pytest.fixture(scope="module")
def chat_tokenizers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat-tok")
    return {name: build_tokenizer(root / name, template=t, eos=eos) for name, (t, eos) in TEMPLATES.items()}


def plan(root: Path, data: Path, tok: Path, *, exact: bool = False, algorithm: str = "wrap", fmt: str = "") -> Path:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("chat", str(data))],
        mixture=MixtureSpec({"chat": 1.0}),
        seed=3,
        exact_tokens=exact,
        lanes=4,
    )
    spec = TokenizeSpec(tokenizer_id=str(tok), field="messages", chat=ChatSpec())
    return source.plan(
        root / f"plan-{exact}-{algorithm}{fmt}",
        tokenize=spec,
        pack=PackSpec(max_length=MAX_LENGTH, algorithm=algorithm),
    )


def pipe(plan_dir: Path, tok: Path, *, algorithm: str = "wrap", rank: int = 0, size: int = 1) -> Pipeline:
    return (
        Pipeline.from_plan(plan_dir)
        .options(dp_rank=rank, dp_size=size)
        .tokenize_chat(tokenizer_id=str(tok))
        .pack_flat(max_length=MAX_LENGTH, algorithm=algorithm)
        .batch(microbatch_size=4 // size, global_batch_size=4)
    )


def documents(batches) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every plan document's tokens and loss mask, put back together from the pieces of the batches."""
    parts: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for b in batches:
        assert b.loss_mask is not None
        for row, offset, position, start, length in b.pieces.tolist():
            cut = slice(offset, offset + length)
            parts.setdefault(position, []).append((start, b.tokens[row, cut], b.loss_mask[row, cut]))
    out = {}
    for position, pieces in parts.items():
        pieces.sort(key=lambda p: p[0])
        out[position] = (np.concatenate([p[1] for p in pieces]), np.concatenate([p[2] for p in pieces]))
    return out


def masked_runs(tokens: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [tokens[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True)]


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_masked_tokens_decode_exactly_to_the_assistant_turns(tmp_path, chat_tokenizers, name, fmt) -> None:
    from tokenizers import Tokenizer

    data = rows(40)
    path = (write_jsonl if fmt == "jsonl" else write_parquet)(tmp_path / "data", data)
    tok = chat_tokenizers[name]
    decoder = Tokenizer.from_file(str(tok / "tokenizer.json"))
    eot = TEMPLATES[name][1]
    docs = documents(pipe(plan(tmp_path, path, tok), tok))
    assert len(docs) == 40
    for tokens, mask in docs.values():
        messages = conversation_of(decoder.decode(tokens.tolist(), skip_special_tokens=False), data)
        runs = [decoder.decode(r.tolist(), skip_special_tokens=False) for r in masked_runs(tokens, mask)]
        expected = [m["content"] + eot for m in messages if m["role"] == "assistant"]
        assert [r.lstrip(" ") for r in runs] == expected  # INST puts a space before a reply: template text


def test_masks_are_identical_after_wrap_and_best_fit_across_dp_sizes_and_resume(tmp_path, chat_tokenizers) -> None:
    tok = chat_tokenizers["chatml"]
    path = write_parquet(tmp_path / "data", rows(60))
    estimated = plan(tmp_path, path, tok)
    exact = plan(tmp_path, path, tok, exact=True)
    best = plan(tmp_path, path, tok, exact=True, algorithm="best_fit")
    reference = documents(pipe(estimated, tok))
    assert len(reference) == 60

    def same(got: dict) -> None:
        assert sorted(got) == sorted(reference)
        for k, (t, m) in got.items():
            assert np.array_equal(t, reference[k][0]) and np.array_equal(m, reference[k][1])

    same(documents(pipe(exact, tok)))
    same(documents(pipe(best, tok, algorithm="best_fit")))
    for kind, algorithm in ((estimated, "wrap"), (exact, "wrap"), (best, "best_fit")):
        two = [b for r in range(2) for b in pipe(kind, tok, algorithm=algorithm, rank=r, size=2)]
        same(documents(two))
        first = pipe(kind, tok, algorithm=algorithm)
        head = []
        for b in first:
            head.append(b)
            if b.step == 3:
                break
        state = first.state_dict()
        resumed = pipe(kind, tok, algorithm=algorithm)
        resumed.load_state_dict(state)
        whole = [b for b in pipe(kind, tok, algorithm=algorithm)]
        tail = list(resumed)
        assert [b.step for b in tail] == [b.step for b in whole if b.step > 3]
        for a, b in zip(tail, [b for b in whole if b.step > 3], strict=True):
            assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.loss_mask, b.loss_mask)


def test_labels_are_ignored_outside_the_mask_and_across_documents(tmp_path, chat_tokenizers) -> None:
    tok = chat_tokenizers["tagged"]
    path = write_jsonl(tmp_path / "data", rows(30))
    for batch in pipe(plan(tmp_path, path, tok), tok):
        t = batch.to_training(
            return_labels=True,
            return_loss_mask=True,
            return_attention_mask=True,
            return_num_valid_tokens=True,
            return_position_ids=True,
        )
        width = batch.tokens.shape[1]
        real = np.arange(width)[None, :] < batch.lengths[:, None]
        starts = batch.doc_start.copy()
        starts[:, 0] = True
        expected = batch.loss_mask[:, 1:] & real[:, 1:] & ~starts[:, 1:]
        labels = t["labels"].numpy()
        assert np.array_equal(labels != -100, expected)
        assert np.array_equal(labels[expected], batch.tokens[:, 1:][expected])
        assert np.array_equal(t["loss_mask"].numpy(), expected)
        assert int(t["num_valid_tokens"]) == int(expected.sum())
        assert np.array_equal(t["attention_mask"].numpy(), real[:, :-1].astype(np.int64))
        assert t["input_ids"].shape == (len(batch), width - 1)
        assert int(t["position_ids"][0, 0]) == 0
    plain = batch.to_training()
    assert set(plain) == {"input_ids", "labels"} and plain["labels"].dtype == torch.int64


def test_alpaca_and_sharegpt_layouts_map_to_messages(tmp_path, chat_tokenizers) -> None:
    from tokenizers import Tokenizer

    tok = chat_tokenizers["chatml"]
    decoder = Tokenizer.from_file(str(tok / "tokenizer.json"))
    alpaca = [
        {"instruction": f"Say {i}", "input": "" if i % 2 else f"ctx {i}", "output": f"Answer {i}."} for i in range(12)
    ]
    share = [
        {"conversations": [{"from": "human", "value": f"Hi {i}"}, {"from": "gpt", "value": f"Yo {i}!"}]}
        for i in range(12)
    ]
    for layout, data, answers in (
        ("alpaca", alpaca, {f"Answer {i}." for i in range(12)}),
        ("sharegpt", share, {f"Yo {i}!" for i in range(12)}),
    ):
        path = write_parquet(tmp_path / layout, data)
        source = StaticMixtureWorkSource(
            datasets=[Dataset.from_path("d", str(path))], mixture=MixtureSpec({"d": 1.0}), seed=1
        )
        p = (
            Pipeline(source)
            .tokenize_chat(tokenizer_id=str(tok), layout=layout)
            .pack_flat(max_length=MAX_LENGTH)
            .batch(microbatch_size=2)
        )
        got = set()
        for tokens, mask in documents(p).values():
            (run,) = masked_runs(tokens, mask)
            got.add(decoder.decode(run.tolist(), skip_special_tokens=False).removesuffix("<|im_end|>"))
            text = decoder.decode(tokens.tolist(), skip_special_tokens=False)
            assert text.startswith("<|im_start|>user\n")
        assert got == answers
    with_input = build_text(tok, layout="alpaca", record=alpaca[0])
    assert "<|im_start|>user\nSay 0\n\nctx 0<|im_end|>" in with_input


def build_text(tok: Path, *, layout: str, record: dict) -> str:
    from zephon.executor.encode.encoders import make_encoder

    encoder = make_encoder(TokenizeSpec(tokenizer_id=str(tok), field="messages", chat=ChatSpec(layout=layout)))
    return encoder.final(record).text


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, r"row 1: field 'messages' message 0 role must be one of"),
        ({"messages": []}, r"row 1: field 'messages' must hold at least one message, got an empty list"),
        ({"messages": "hi"}, r"row 1: field 'messages' must be a list of \{role, content\} objects, got str"),
        (
            {"messages": [{"role": "user", "content": "only a question"}]},
            r"row 1: a conversation must have an assistant turn",
        ),
        (
            {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]},
            r"row 1: field .messages. message 0 content must be a string, got int — fix the record, or skip",
        ),
        (  # content parts (OpenAI / Hugging Face multimodal shape): the fix is named, not "fix the record"
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}, {"role": "assistant", "content": "a"}]},
            r"row 1: field 'messages' message 0 content must be a string, got a list of 1 content part\(s\) "
            r"\(\{type, \.\.\.\}\) — join the text parts into one string in a map_transform",
        ),
        (  # the conversation under another key: the record's keys are named
            {"conversations": [{"from": "human", "value": "x"}]},
            r"row 1: field 'messages' must be a list of \{role, content\} objects, got a record without it \(keys "
            r"\['conversations'\]\) — name",
        ),
        (
            {"messages": [{"from": "human", "value": "x"}]},
            r"row 1: field 'messages' message 0 must be \{role, content\}, got \['from', 'value'\] — fix the record or "
            r"use layout='sharegpt'",
        ),
        (  # a cut emoji: JSON's "\ud83d" escape without its pair, which no engine can encode
            {"messages": [{"role": "user", "content": "cut \ud83d emoji"}, {"role": "assistant", "content": "a"}]},
            r"row 1 field 'messages' must be text UTF-8 can encode, got a lone surrogate U\+D83D \(a JSON \\u escape "
            r"without its pair\) — fix or remove that line, or skip and count",
        ),
        (  # in a record run every string of the record is read: the field that holds it is named
            {"messages": conversation(1), "source": ["ok", "cut \udc00 tail"]},
            r"row 1 field 'source' must be text UTF-8 can encode, got a lone surrogate U\+DC00",
        ),
    ],
)
def test_a_bad_conversation_is_one_line_naming_dataset_shard_and_row(tmp_path, chat_tokenizers, record, message):
    tok = chat_tokenizers["chatml"]
    data = rows(4)
    data[1] = record
    path = write_jsonl(tmp_path / "data", data, shards=1)
    planned = plan(tmp_path, path, tok)
    with pytest.raises(DatasetError, match=r"^dataset 'chat': shard .*part-0\.jsonl " + message) as info:
        list(pipe(planned, tok))
    assert "\n" not in str(info.value)
    skipping = pipe(planned, tok).options(on_bad_document="skip")
    assert len(documents(list(skipping))) == 3
    assert sum(skipping.stats().skipped.values()) == 1
    # ids from the verified engine, offsets derived from them (checked against tokenizers' on the first batch)
    stats = skipping.stats()
    fastest = next((e for e in CANDIDATES if e not in stats.refused_engines), None)
    assert stats.tokenizer_engine == fastest, stats.refused_engines
    assert not any(name.endswith("for chat") for name in stats.refused_engines)


def test_a_template_without_tags_or_consistent_prefixes_is_refused_never_an_empty_mask(tmp_path, chat_tokenizers):
    tok = chat_tokenizers["chatml"]
    path = write_jsonl(tmp_path / "data", rows(4), shards=1)
    p = pipe(plan(tmp_path, path, tok), tok)
    bad = p.tokenize_chat(tokenizer_id=str(tok), chat_template=UNDIFFABLE)
    with pytest.raises(DatasetError, match=r"row \d+: the chat template must render each turn as a prefix of the next"):
        list(bad)
    every = p.tokenize_chat(tokenizer_id=str(tok), chat_template=UNDIFFABLE, loss_on="all")
    for tokens, mask in documents(list(every)).values():
        assert mask.all() and len(tokens)


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path, tokenizer_dir) -> None:
    from zephon.executor.encode.encoders import make_encoder

    with pytest.raises(TokenizerError, match=r"must have a chat template for tokenize_chat, got none — pass"):
        make_encoder(TokenizeSpec(tokenizer_id=tokenizer_dir, field="messages", chat=ChatSpec()))


LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN_LIKE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if loop.first and message.role == 'system' %}{%- continue %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize(("template", "eot"), [(LLAMA3, "<|eot_id|>"), (QWEN_LIKE, "<|im_end|>")])
def test_common_template_shapes_mask_exactly_the_replies(chat_tokenizers, template, eot) -> None:
    from zephon.executor.encode.encoders import make_encoder
    from zephon.executor.encode.flags import LOSS, untag

    tok = chat_tokenizers["chatml"]
    encoder = make_encoder(TokenizeSpec(tokenizer_id=str(tok), field="messages", chat=ChatSpec(chat_template=template)))
    data = [conversation(i) for i in range(30)]
    if template is LLAMA3:  # a conversation the assistant opens (the Qwen-like template cannot render none)
        data.append([{"role": "assistant", "content": "I start."}])
    chats = [encoder.final({"messages": m}) for m in data]
    for messages, ids in zip(data, encoder.encode(chats), strict=True):
        tokens, _, mask = untag(ids[None, :], np.zeros((1, len(ids)), dtype=bool))
        assert ((ids["flags"] & LOSS) != 0).any()
        runs = [
            encoder.tokenizer.decode(r.tolist(), skip_special_tokens=False) for r in masked_runs(tokens[0], mask[0])
        ]
        assert runs == [m["content"].strip() + eot for m in messages if m["role"] == "assistant"]


@pytest.mark.parametrize(
    ("layout", "column"), [("messages", "messages"), ("alpaca", "instruction"), ("sharegpt", "conversations")]
)
def test_a_hand_built_chat_spec_reads_its_layouts_column_unless_a_field_is_given(layout, column) -> None:
    assert TokenizeSpec(tokenizer_id="t", chat=ChatSpec(layout=layout)).field == column
    assert TokenizeSpec(tokenizer_id="t", field="dialog", chat=ChatSpec(layout=layout)).field == "dialog"
    assert TokenizeSpec(tokenizer_id="t").field == "text"


def test_an_exact_plan_from_a_hand_built_sharegpt_spec_trains_on_the_replies(tmp_path, chat_tokenizers) -> None:
    from tokenizers import Tokenizer

    tok = chat_tokenizers["chatml"]
    share = [
        {"conversations": [{"from": "human", "value": f"Hi {i}"}, {"from": "gpt", "value": f"Yo {i}!"}]}
        for i in range(8)
    ]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("d", str(write_parquet(tmp_path / "share", share)))],
        mixture=MixtureSpec({"d": 1.0}),
        seed=1,
        exact_tokens=True,
    )
    spec = TokenizeSpec(tokenizer_id=str(tok), chat=ChatSpec(layout="sharegpt"))  # no field: "conversations"
    plan_dir = source.plan(tmp_path / "p", tokenize=spec, pack=PackSpec(max_length=MAX_LENGTH))
    p = Pipeline.from_plan(plan_dir).tokenize_chat(tokenizer_id=str(tok), layout="sharegpt")
    decoder = Tokenizer.from_file(str(tok / "tokenizer.json"))
    replies = set()
    for tokens, mask in documents(p.pack_flat(max_length=MAX_LENGTH).batch(microbatch_size=2)).values():
        (run,) = masked_runs(tokens, mask)
        replies.add(decoder.decode(run.tolist(), skip_special_tokens=False))
    assert replies == {f"Yo {i}!<|im_end|>" for i in range(8)}


def test_a_template_that_renders_none_of_the_content_is_refused_and_one_that_reshapes_it_is_not() -> None:
    """Jinja renders a key the messages lack as nothing: a template reading ``m.text`` rendered the role tags only,
    and the run trained on them. Any word of any message in the rendering passes (case aside), so templates that
    trim, upper-case or drop a turn's reasoning still render."""
    from zephon.executor.encode.chat_render import BadRecord, ChatRenderer

    messages = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "<think>sum</think>Four."}]
    typo = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.text }}<|im_end|>\n{% endfor %}"
    for loss_on in ("assistant", "all"):
        with pytest.raises(BadRecord, match=r"^the chat template must render the messages' content, got a rendering "
                           r"without any of it \('<\|im_start\|>user\\n<\|im_end\|>.*'\) — does it read another key"):
            ChatRenderer(typo, ChatSpec(loss_on=loss_on), {}).render(messages)
    upper = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n{% endfor %}"
    drops = (  # a reasoning template's history: what precedes </think> left out
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
        "{% endfor %}"
    )
    for template in (CHATML, upper, drops):
        assert ChatRenderer(template, ChatSpec(), {}).render(messages).spans
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]  # no word of 3: not checked
    assert ChatRenderer(typo, ChatSpec(loss_on="all"), {}).render(short).text.startswith("<|im_start|>user")
