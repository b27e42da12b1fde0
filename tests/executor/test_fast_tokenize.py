"""The tiktoken engine: used only when it gives the same ids as ``tokenizers``, silently not otherwise."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from zephon.demo import DEMO_KINDS, generate_demo_documents
from zephon.errors import ConfigError
from zephon.executor import tiktoken_engine
from zephon.executor.tokenize import ENGINE_ENV, Encoder
from zephon.specs import TokenizeSpec

pytest.importorskip("tiktoken")

TRICKY = [
    "",
    " ",
    "\n\n\n",
    "   leading and trailing   ",
    "It's 2024-06-01T12:34:56Z; 1234567890123 ÷ 7 ≈ 176366841731.857 — DON'T, we'll, I'M, they've",
    "def f(x):\n\treturn x ** 2  # comment\r\n\r\n    pass\n",
    "café naïve Zürich 東京 Ελληνικά привет мир 🙂🙂🙂 👩‍👩‍👧 ١٢٣٤٥ ½ Ⅻ",
    "\u00a0\u2009\u3000\u0085\u2028\u000b\u000c\u200b\ufeff mixed whitespace \t\t\t",
    "a<|endoftext|>b <|endoftext|><|endoftext|> end",
    "x" * 5000,
    "ab " * 3000,
]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = " \t\n\r\u00a0abcXYZ0123456789'!?.,;:-_()[]{}<>|/\\\"#$%^&*~`éüß東京ру١٢🙂\u200b\u0301"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(n)]


def demo_documents(count: int = 150) -> list[str]:
    return [doc for kind in DEMO_KINDS for doc in generate_demo_documents(kind, count, seed=11)]


def encode_both(spec: TokenizeSpec, texts: list[str]) -> tuple[Encoder, list[np.ndarray], list[np.ndarray]]:
    fast, slow = Encoder(spec), Encoder(spec, engine="tokenizers")
    return fast, fast.encode(texts), slow.encode(texts)


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.dtype == y.dtype == np.int64
        assert np.array_equal(x, y), f"document {i} differs"


def test_tiktoken_engine_gives_the_demo_tokenizers_ids_on_the_demo_corpus(tokenizer_dir: str) -> None:
    encoder, fast, slow = encode_both(TokenizeSpec(tokenizer_id=tokenizer_dir), demo_documents())
    assert encoder.engine == "tiktoken", encoder.engine_note
    assert_same(fast, slow)


def test_tiktoken_engine_matches_on_tricky_and_random_text(tokenizer_dir: str) -> None:
    texts = TRICKY + random_texts(300)
    encoder, fast, slow = encode_both(TokenizeSpec(tokenizer_id=tokenizer_dir), texts)
    assert encoder.engine == "tiktoken"
    assert_same(fast, slow)
    assert fast[0].tolist() == [0]  # an empty document is its EOS
    assert 0 in fast[8][1:-1].tolist()  # "<|endoftext|>" inside a text is the special token, as in tokenizers


def test_engine_never_changes_the_fingerprint_or_the_specials(tokenizer_dir: str) -> None:
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir, add_bos=True)
    fast, slow = Encoder(spec), Encoder(spec, engine="tokenizers")
    fast.encode(["hello"])
    assert (fast.engine, slow.engine) == ("tiktoken", "tokenizers")
    assert fast.fingerprint == slow.fingerprint
    assert fast.encode(["hello world"])[0].tolist() == slow.encode(["hello world"])[0].tolist()
    assert fast.encode(["hello"])[0][0] == fast.bos_id and fast.encode(["hello"])[0][-1] == fast.eos_id


def test_threads_do_not_change_ids(tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = demo_documents(60) + TRICKY
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    one = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir)).encode(texts)
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    three = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir)).encode(texts)
    assert_same(one, three)


def test_engine_can_be_turned_off_and_refuses_unknown_values(tokenizer_dir: str, monkeypatch) -> None:
    monkeypatch.setenv(ENGINE_ENV, "tokenizers")
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    encoder.encode(["hello"])
    assert encoder.engine == "tokenizers" and ENGINE_ENV in encoder.engine_note
    monkeypatch.setenv(ENGINE_ENV, "fast")
    with pytest.raises(ConfigError, match=f'{ENGINE_ENV} must be "auto" or "tokenizers", got \'fast\''):
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))


def edited_tokenizer(tokenizer_dir: str, tmp_path: Path, edit) -> str:
    config = json.loads(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).to_str())
    edit(config)
    file = tmp_path / "tokenizer.json"
    file.write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}), encoding="utf-8")
    return str(tmp_path)


def test_a_tokenizer_tiktoken_cannot_run_exactly_stays_on_tokenizers(tokenizer_dir: str, tmp_path: Path) -> None:
    def lowercase(config: dict) -> None:
        config["normalizer"] = {"type": "Lowercase"}

    spec = TokenizeSpec(tokenizer_id=edited_tokenizer(tokenizer_dir, tmp_path, lowercase))
    encoder, fast, slow = encode_both(spec, TRICKY)
    assert encoder.engine == "tokenizers"
    assert "normalizer" in encoder.engine_note
    assert_same(fast, slow)


def test_ids_that_do_not_follow_merge_order_are_mapped_back(tokenizer_dir: str, tmp_path: Path) -> None:
    """Token ids permuted (merge results no longer in id order): tiktoken runs on merge-order ranks and a table
    maps them back to the tokenizer's ids."""

    def permute(config: dict) -> None:
        vocab = config["model"]["vocab"]
        ids = sorted(vocab.values())[1:]  # keep id 0, the special token
        shuffled = ids[:]
        random.Random(5).shuffle(shuffled)
        mapping = dict(zip(ids, shuffled, strict=True))
        config["model"]["vocab"] = {t: mapping.get(i, i) for t, i in vocab.items()}

    spec = TokenizeSpec(tokenizer_id=edited_tokenizer(tokenizer_dir, tmp_path, permute))
    encoder, fast, slow = encode_both(spec, demo_documents(40) + TRICKY)
    assert encoder.engine == "tiktoken" and encoder._fast_ids is not None
    assert_same(fast, slow)


def test_a_mismatch_on_the_first_documents_falls_back_for_good(tokenizer_dir: str, monkeypatch) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    real = Encoder._fast_run

    def wrong_on_z(self: Encoder, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ranks, sizes = real(self, texts)  # each text's ranks, then a separator
        ranks, ends = ranks.copy(), np.cumsum(sizes)
        for t, a, b in zip(texts, (ends - sizes).tolist(), ends.tolist(), strict=True):
            ranks[a : b - 1] += 1 if "zz" in t else 0
        return ranks, sizes

    monkeypatch.setattr(Encoder, "_fast_run", wrong_on_z)
    texts = ["plain text", "buzz zz", "more"]
    reference = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="tokenizers").encode(texts)
    assert_same(encoder.encode(texts), reference)
    assert encoder.engine == "tokenizers"
    assert "first documents" in encoder.engine_note
    assert_same(encoder.encode(texts), reference)


def test_a_mismatch_on_the_probe_text_keeps_tokenizers(tokenizer_dir: str, monkeypatch) -> None:
    real = Encoder._fast_run

    def last_token_lost(self: Encoder, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ranks, sizes = real(self, texts)
        lost = (np.cumsum(sizes) - 2)[sizes > 1]  # each non-empty text's last token (before its separator)
        return np.delete(ranks, lost), sizes - (sizes > 1)

    monkeypatch.setattr(Encoder, "_fast_run", last_token_lost)
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    assert encoder._fast is None and "probe" in encoder.engine_note
    assert encoder.encode(["hello world"])[0].tolist() == encoder.encode(["hello world"])[0].tolist()


def test_the_engine_is_cached_and_a_broken_cache_is_rebuilt(tokenizer_dir: str, _isolated_cache: Path) -> None:
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    texts = demo_documents(20)
    expected = Encoder(spec, engine="tokenizers").encode(texts)
    assert_same(Encoder(spec).encode(texts), expected)
    files = list((_isolated_cache / "tokenizer-engines").glob("*.npz"))
    assert len(files) == 1
    assert_same(Encoder(spec).encode(texts), expected)  # from the cache
    files[0].write_bytes(b"not a zip file")
    warm = Encoder(spec)
    assert_same(warm.encode(texts), expected)
    assert warm.engine == "tiktoken"
    assert tiktoken_engine._load_plan(files[0])  # rewritten, readable again


def test_encoder_pickles_without_its_threads(tokenizer_dir: str) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    texts = demo_documents(10)
    before = encoder.encode(texts)
    copy = pickle.loads(pickle.dumps(encoder))
    assert copy.engine == "tiktoken"
    assert_same(copy.encode(texts), before)
