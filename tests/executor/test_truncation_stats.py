"""``long_documents="truncate"`` cuts are counted as they are handed out: ``RunStats.truncated`` (documents) and
``truncated_tokens`` (tokens cut), per dataset — the same for any plan kind, read chunk, read-ahead, DataLoader
workers, and across a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.chat_data import build_tokenizer

from zephon import Pipeline
from zephon.executor.encode.encoders import make_encoder
from zephon.executor.truncations import Truncations
from zephon.io import Dataset
from zephon.specs import PackSpec, TokenizeSpec
from zephon.work import MixtureSpec, StaticMixtureWorkSource

MAX_TOKENS = 9  # with BOS and EOS: bodies of 7 tokens


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> str:
    return str(build_tokenizer(tmp_path_factory.mktemp("tok") / "t", eos="</s>"))


def _write(root: Path, name: str, words: list[int]) -> Path:
    """A JSONL dataset whose document ``r`` has ``words[r]`` words."""
    vocab = ["the", "model", "data", "token", "train", "loss", "chat", "reply"]
    folder = root / name
    folder.mkdir(parents=True)
    lines = [json.dumps({"text": " ".join(vocab[(r + k) % len(vocab)] for k in range(n))}) for r, n in enumerate(words)]
    (folder / "part-00000.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module", params=[False, True], ids=["estimated", "exact"])
def planned(request, tmp_path_factory, tok) -> tuple[Path, Path, dict[str, tuple[int, int]]]:
    """A plan of two datasets (one with long documents, one without) and, per dataset, the documents longer than
    the limit and the tokens the limit cuts from them — computed here from the texts, by the tokenizer itself."""
    root = tmp_path_factory.mktemp("trunc")
    web = _write(root / "data", "web", [3 + (r * 7) % 20 for r in range(60)])
    code = _write(root / "data", "code", [1 + r % 5 for r in range(40)])
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("web", str(web)), Dataset.from_path("code", str(code))],
        mixture=MixtureSpec({"web": 0.6, "code": 0.4}),
        seed=4,
        exact_tokens=request.param,
    )
    spec = TokenizeSpec(tokenizer_id=tok, special_tokens="bos_eos", max_tokens=MAX_TOKENS)
    plan = Path(source.plan(root / "plan", tokenize=spec, pack=PackSpec(max_length=16)))
    body = make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens="none")).tokenizer
    samples = pq.read_table(plan / "samples.parquet", columns=["dataset_id", "shard_id", "row"]).to_pylist()
    names = json.loads((plan / "plan.json").read_text())["datasets"]
    texts = {n["name"]: (root / "data" / n["name"] / "part-00000.jsonl").read_text().splitlines() for n in names}
    want: dict[str, tuple[int, int]] = {}
    for s in samples:
        name = names[s["dataset_id"]]["name"]
        n = len(body.encode(json.loads(texts[name][s["row"]])["text"], add_special_tokens=False).ids)
        if n > MAX_TOKENS - 2:
            docs, cut = want.get(name, (0, 0))
            want[name] = (docs + 1, cut + n - (MAX_TOKENS - 2))
    assert set(want) == {"web"}  # code's documents all fit
    return plan, root, want


def _pipeline(plan: Path, tok: str) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tok, special_tokens="bos_eos", max_tokens=MAX_TOKENS)
        .pack_flat(max_length=16)
        .batch(microbatch_size=2, drop_last=False)
    )


def _counts(pipe: Pipeline) -> dict[str, tuple[int, int]]:
    stats = pipe.stats()
    assert set(stats.truncated) == set(stats.truncated_tokens)
    return {name: (stats.truncated[name], stats.truncated_tokens[name]) for name in stats.truncated}


@pytest.mark.parametrize("read_chunk", [3, 1024])
def test_a_run_counts_each_truncated_document_and_the_tokens_cut_by_dataset(planned, tok, read_chunk) -> None:
    plan, _, want = planned
    pipe = _pipeline(plan, tok).options(read_chunk=read_chunk)
    seen_first: set[int] = set()
    counted = []
    for batch in pipe:
        assert batch.pieces is not None
        seen_first |= {int(p["position"]) for p in batch.pieces if p["doc_start"] == 0}
        counted.append(sum(pipe.stats().truncated.values()))
    assert _counts(pipe) == want
    assert counted == sorted(counted) and counted[0] < counted[-1]  # counted as handed out, not all at once


def test_a_dataloader_with_workers_counts_the_same(planned, tok) -> None:
    plan, _, want = planned
    pipe = _pipeline(plan, tok)
    for _ in pipe.dataloader(num_workers=2, multiprocessing_context="fork"):
        pass
    assert _counts(pipe) == want


def test_a_resumed_run_counts_the_rest(planned, tok) -> None:
    plan, _, want = planned
    first = _pipeline(plan, tok)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    before = _counts(first)
    it.close()
    rest = _pipeline(plan, tok)
    rest.load_state_dict(state)
    for _ in rest:
        pass
    after = _counts(rest)
    total = {
        n: (before.get(n, (0, 0))[0] + after.get(n, (0, 0))[0], before.get(n, (0, 0))[1] + after.get(n, (0, 0))[1])
        for n in want
    }
    # a document cut short whose first token came before the state counts in the first run only; one the state
    # splits counts its whole cut there too (the cut is the document's, counted with its first token)
    assert total == want


def test_only_truncation_reports_a_cut(tok) -> None:
    texts = ["the model data token train loss chat reply the model", "the", ""]
    body = make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens="none")).tokenizer
    long = len(body.encode(texts[0], add_special_tokens=False).ids)
    assert long > MAX_TOKENS
    cut = make_encoder(TokenizeSpec(tokenizer_id=tok, special_tokens="bos_eos", max_tokens=MAX_TOKENS))
    assert cut.encode_flat(texts).cut.tolist() == [long - (MAX_TOKENS - 2), 0, 0]
    assert cut.encode_flat(texts[1:]).cut is None  # nothing cut: nothing to hold
    for spec in (
        TokenizeSpec(tokenizer_id=tok, special_tokens="bos_eos"),
        TokenizeSpec(tokenizer_id=tok, special_tokens="bos_eos", max_tokens=MAX_TOKENS, long_documents="split"),
        TokenizeSpec(tokenizer_id=tok),
    ):
        assert getattr(make_encoder(spec).encode_flat(texts), "cut", None) is None


def test_held_documents_are_counted_once_and_dropped_when_passed(monkeypatch) -> None:
    import numpy as np

    from zephon.executor import truncations
    from zephon.executor.pack.rows import make_pieces
    from zephon.executor.settings import RunStats

    monkeypatch.setattr(truncations, "DROP_AT", 1)  # look for documents to forget as soon as 2 are held
    held, stats = Truncations(), RunStats()
    held.add(np.array([4, 5, 6]), np.array([0, 1, 0]), np.array([3, 0, 2]))
    held.add(np.array([6, 9]), np.array([0, 1]), np.array([2, 8]))  # 6 fetched again: held once
    assert len(held) == 3
    held.count(stats, ["web", "code"], make_pieces([(0, 0, 6, 5, 4), (0, 4, 9, 0, 3)]))  # 6 not from its start
    assert (stats.truncated, stats.truncated_tokens) == ({"code": 1}, {"code": 8})
    held.count(stats, ["web", "code"], make_pieces([(0, 0, 4, 0, 4)]))
    assert (stats.truncated, stats.truncated_tokens) == ({"code": 1, "web": 1}, {"code": 8, "web": 3})
    held.drop_before(7)  # one held: below the limit, nothing looked at
    assert len(held) == 1
    held.add(np.array([8, 12]), np.array([1, 1]), np.array([1, 1]))
    held.drop_before(9)  # 6's first token was another process's, 8's too: forgotten; 12 kept
    assert len(held) == 1
    held.count(stats, ["web", "code"], make_pieces([(0, 0, 12, 0, 4)]))
    assert (stats.truncated, stats.truncated_tokens) == ({"code": 2, "web": 1}, {"code": 9, "web": 3})


def test_a_chat_run_counts_the_conversations_cut_too(tmp_path) -> None:
    from support.chat_data import conversation, write_jsonl

    from zephon.specs import ChatSpec

    tok = build_tokenizer(tmp_path / "chat-tok")
    data = write_jsonl(tmp_path / "chat", [{"messages": conversation(i)} for i in range(40)])
    source = StaticMixtureWorkSource(datasets=[Dataset.from_path("chat", str(data))], mixture=MixtureSpec({"chat": 1}), seed=3)
    chat = TokenizeSpec(tokenizer_id=str(tok), field="messages", chat=ChatSpec())
    plan = source.plan(tmp_path / "plan", tokenize=chat, pack=PackSpec(max_length=48))
    whole = make_encoder(chat)
    rows = [json.loads(line) for f in sorted(data.glob("*.jsonl")) for line in f.read_text().splitlines()]
    sizes = whole.encode_flat([whole.converter.final(r) for r in rows]).sizes
    limit = int(sorted(sizes)[len(sizes) // 2])  # about half the conversations are longer
    pipe = (
        Pipeline.from_plan(plan)
        .tokenize_chat(tokenizer_id=str(tok), max_tokens=limit)
        .pack_flat(max_length=48)
        .batch(microbatch_size=2, drop_last=False)
    )
    for _ in pipe:
        pass
    longer = sizes[sizes > limit]
    assert 0 < len(longer) < len(sizes)
    assert _counts(pipe) == {"chat": (len(longer), int((longer - limit).sum()))}
