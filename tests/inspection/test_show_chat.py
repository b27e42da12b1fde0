"""``zephon show`` on chat plans: each document's conversation turn by turn, for the three chat layouts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.chat_data import build_tokenizer, conversation, write_jsonl, write_parquet

from zephon.cli.app import cli
from zephon.inspection.show import show_step
from zephon.io import Dataset
from zephon.specs import ChatSpec, PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory) -> str:
    return str(build_tokenizer(tmp_path_factory.mktemp("tok") / "chatml"))


def messages_rows(n: int) -> list[dict]:
    return [{"messages": conversation(i)} for i in range(n)]


def expected_text(messages: list[dict]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def exact_chat_plan(tmp_path, data, tok: str, layout: str):
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("chat", str(data))], mixture=MixtureSpec({"chat": 1.0}), seed=2, exact_tokens=True
    )
    spec = TokenizeSpec(tokenizer_id=tok, chat=ChatSpec(layout=layout))
    return source.plan(tmp_path / f"plan-{layout}", tokenize=spec, pack=PackSpec(max_length=MAX_LENGTH))


def previews_of(plan_dir, steps: int | None = None) -> dict[tuple[str, int], str]:
    """Every document's preview over all steps, by (shard, row)."""
    first = show_step(plan_dir, 0, batch_size=2)
    out = {}
    for step in range(first.steps if steps is None else steps):
        for r in show_step(plan_dir, step, batch_size=2).rows:
            out[(r.shard, r.row)] = r.text
    return out


def flat(text: str) -> str:
    from zephon.inspection.show import preview

    return preview(text)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_show_renders_each_turn_of_a_messages_plan(tmp_path, chat_tok, fmt) -> None:
    rows = messages_rows(10)
    data = (write_parquet if fmt == "parquet" else write_jsonl)(tmp_path / "data", rows)
    plan_dir = exact_chat_plan(tmp_path, data, chat_tok, "messages")
    got = previews_of(plan_dir)
    per = 5  # write_* split 10 rows into 2 shards of 5
    expected = {(f"part-{i // per}.{fmt}", i % per): flat(expected_text(rows[i]["messages"])) for i in range(10)}
    assert got == expected
    assert all(t.startswith(("system: ", "user: ")) for t in got.values())  # turns, not a list's repr


def test_show_renders_sharegpt_and_alpaca_plans_with_their_roles(tmp_path, chat_tok) -> None:
    share = [
        {"conversations": [{"from": "human", "value": f"Hi {i}"}, {"from": "gpt", "value": f"Yo {i}!"}]}
        for i in range(6)
    ]
    alpaca = [{"instruction": f"Say {i}", "input": "" if i % 2 else f"ctx {i}", "output": f"A{i}."} for i in range(6)]
    share_plan = exact_chat_plan(tmp_path, write_parquet(tmp_path / "share", share), chat_tok, "sharegpt")
    alpaca_plan = exact_chat_plan(tmp_path, write_parquet(tmp_path / "alpaca", alpaca), chat_tok, "alpaca")
    assert set(previews_of(share_plan).values()) == {f"user: Hi {i}⏎assistant: Yo {i}!" for i in range(6)}
    assert set(previews_of(alpaca_plan).values()) == {
        f"user: Say {i}⏎⏎ctx {i}⏎assistant: A{i}." if i % 2 == 0 else f"user: Say {i}⏎assistant: A{i}."
        for i in range(6)
    }


def test_zephon_show_prints_conversations_and_a_bad_row_is_shown_not_fatal(tmp_path, chat_tok) -> None:
    rows = messages_rows(6)
    plan_dir = exact_chat_plan(tmp_path, write_parquet(tmp_path / "data", rows), chat_tok, "messages")
    runner = CliRunner()
    out = runner.invoke(cli, ["show", str(plan_dir), "--step", "0", "--batch-size", "2", "--format", "json"])
    assert out.exit_code == 0, out.output
    texts = [d["text"] for d in json.loads(out.output)["documents"]]
    assert texts and all(t in {flat(expected_text(r["messages"])) for r in rows} for t in texts)
    table = runner.invoke(cli, ["show", str(plan_dir), "--step", "0", "--batch-size", "2"])
    assert table.exit_code == 0 and "assistant: " in table.output
    # a plan without a tokenizer (a sample mixture) previews the column named with --field the same way
    bad = [*rows, {"messages": [{"role": "wizard", "content": "x"}]}]
    data = write_parquet(tmp_path / "bad", bad, shards=1)
    samples = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("chat", str(data))], mixture=MixtureSpec({"chat": 1.0}), seed=2
    ).plan(tmp_path / "samples")
    got = {r.row: r.text for s in range(7) for r in show_step(samples, s, batch_size=1, field="messages").rows}
    assert got[6].startswith("<not a conversation: field 'messages' message 0 role must be")
    assert got[0] == flat(expected_text(rows[0]["messages"]))


def test_a_list_column_of_another_name_is_shown_as_a_conversation(tmp_path) -> None:
    rows = [{"dialog": conversation(i), "text": f"plain {i}"} for i in range(3)]
    data = write_parquet(tmp_path / "data", rows, shards=1)
    plan_dir = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("chat", str(data))], mixture=MixtureSpec({"chat": 1.0}), seed=2
    ).plan(tmp_path / "plan")
    dialog = {r.row: r.text for s in range(3) for r in show_step(plan_dir, s, batch_size=1, field="dialog").rows}
    assert dialog == {i: flat(expected_text(rows[i]["dialog"])) for i in range(3)}
    text = {r.row: r.text for s in range(3) for r in show_step(plan_dir, s, batch_size=1).rows}
    assert text == {i: f"plain {i}" for i in range(3)}
