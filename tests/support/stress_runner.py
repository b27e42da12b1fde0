"""One child process of the engine stress suite (tests/stress/test_engine_stress.py).

``python -X faulthandler tests/support/stress_runner.py CONFIG.json PATTERN [PATTERN ...]`` runs the call
patterns in order with the tokenizer and datasets CONFIG names, under whatever ``ZEPHON_TOKENIZER_ENGINE`` the
parent set. For each pattern it prints ``start PATTERN`` before and ``done PATTERN DIGEST`` after, flushed, so
that a crash names the pattern it died in; DIGEST is the sha256 of every batch's training tensors in order
(``digest``). A pattern that runs a plan also prints ``first PATTERN DIGEST``, the first batch's digest;
``direct`` then prints ``engine direct NAME``, the engine its batches were encoded with.

Every pattern gets a cache of its own (plans, byte lengths, calibration, token counts made anew, so each
pattern really calibrates or counts), sharing only the engine verdicts (``CONFIG["verdicts"]``).

The two exit patterns end the process: ``exit_one_batch`` reads one batch and returns (exit 0) while the
engine may still be prepared; ``raise_after_build`` starts the run (``iter``: the encoder and its engine choice)
and raises ``SystemExit(EARLY_ERROR)`` at once: exit 1 and exactly that line on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from zephon import Pipeline, loader_shutdown
from zephon.errors import TokenizerError
from zephon.io import Dataset
from zephon.loader_shutdown import wait_for_feeders
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

PACK = 65
MICROBATCH = 4
TRAINING: dict[str, Any] = {"return_labels": True, "return_position_ids": True, "return_num_valid_tokens": True}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EARLY_ERROR = "stress: the user's own error right after building the pipeline"
MIXTURE = {"prose": 0.5, "code": 0.3, "short": 0.2}
#: Pattern → the engine its batches were encoded with, for the patterns that report it (``direct``).
ENGINE_USED: dict[str, str] = {}


def digest_of(dicts: Iterable[dict[str, torch.Tensor | int]], first: list[str] | None = None) -> str:
    """sha256 over every batch's training tensors (key, dtype, shape, bytes) in order; ``first`` gets the first
    batch's own digest."""
    whole = hashlib.sha256()
    for i, batch in enumerate(dicts):
        one = hashlib.sha256()
        for key in sorted(batch):
            value = batch[key]
            if isinstance(value, torch.Tensor):
                one.update(f"{key}:{value.dtype}:{tuple(value.shape)}".encode())
                one.update(value.contiguous().numpy().tobytes())
            else:
                one.update(f"{key}={value!r}".encode())
        whole.update(one.digest())
        if i == 0 and first is not None:
            first.append(one.hexdigest())
    return whole.hexdigest()


def source(config: dict[str, Any], **budget: Any) -> StaticMixtureWorkSource:
    data = config["data"]
    return StaticMixtureWorkSource(
        datasets=[Dataset.from_path(name, data[name]) for name in MIXTURE],
        mixture=MixtureSpec(MIXTURE),
        seed=7,
        **budget,
    )


def text_pipeline(config: dict[str, Any], **budget: Any) -> Pipeline:
    return (
        Pipeline(source(config, **budget))
        .tokenize(tokenizer_id=config["tokenizer"])
        .pack_flat(max_length=PACK)
        .batch(microbatch_size=MICROBATCH)
    )


def samples_pipeline(config: dict[str, Any]) -> Pipeline:
    return text_pipeline(config, num_documents=240)


def batches(pipe: Pipeline) -> Iterable[dict[str, torch.Tensor | int]]:
    return (b.to_training(**TRAINING) for b in pipe)


def direct(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    """The plain run; once its batches are read, ``ENGINE_USED["direct"]`` names the engine that encoded them."""
    os.environ["ZEPHON_READ_AHEAD"] = "off"
    pipe = samples_pipeline(config)
    yield from batches(pipe)
    ENGINE_USED["direct"] = pipe.stats().tokenizer_engine


def read_ahead(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    """A token mixture calibrated on each dataset's documents (``primer="measure"``), read ahead on a thread."""
    os.environ["ZEPHON_READ_AHEAD"] = "on"
    estimation = TokenEstimation(primer="measure", calibration_samples=96, calibration_shards_max=2)
    return batches(text_pipeline(config, num_tokens=6000, token_estimation=estimation))


def exact(config: dict[str, Any], name: str) -> Iterable[dict[str, torch.Tensor | int]]:
    """An exact plan: the count pass on 2 workers, then a run of it (read-ahead at its default)."""
    os.environ.pop("ZEPHON_READ_AHEAD", None)
    from zephon.specs import PackSpec, TokenizeSpec

    plan = source(config, num_documents=240, exact_tokens=True).plan(
        Path(os.environ["ZEPHON_CACHE_DIR"]) / f"plan-{name}",
        tokenize=TokenizeSpec(tokenizer_id=config["tokenizer"]),
        pack=PackSpec(max_length=PACK),
        workers=2,
        overwrite=True,
    )
    return batches(
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=config["tokenizer"])
        .pack_flat(max_length=PACK)
        .batch(microbatch_size=MICROBATCH)
    )


def count_threads(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    """The count pass as the engine takes it: threads of this process when it releases the GIL, else worker
    processes (``tokenizers``, kitoken)."""
    return exact(config, "threads")


def count_processes(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    """The count pass in worker processes (``zephon.planner.counts.worker``) whatever the engine: each worker
    chooses its own engine under the same ``ZEPHON_TOKENIZER_ENGINE``."""
    from zephon.executor.encode.text import Encoder

    Encoder.releases_gil = property(lambda self: False)  # type: ignore[assignment,method-assign]
    return exact(config, "processes")


def chat(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    os.environ.pop("ZEPHON_READ_AHEAD", None)
    ws = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("chat", config["chat"])], mixture=MixtureSpec({"chat": 1.0}), seed=3
    )
    pipe = (
        Pipeline(ws)
        .tokenize_chat(tokenizer_id=config["tokenizer"], chat_template=CHATML)
        .pack_flat(max_length=PACK)
        .batch(microbatch_size=MICROBATCH)
    )
    return (b.to_training(**TRAINING, return_loss_mask=True) for b in pipe)


def loader(config: dict[str, Any], context: str) -> Iterable[dict[str, torch.Tensor | int]]:
    """A torch DataLoader with 2 workers (the plan is made in this process first, as a training script does); its
    feeder threads waited for at the end, as docs/training.md says for a DataLoader of one's own, since the
    process exits right after (a "leaked semaphore" warning otherwise, now and then: zephon.loader_shutdown)."""
    os.environ.pop("ZEPHON_READ_AHEAD", None)
    pipe = samples_pipeline(config)
    pipe.plan_dir  # noqa: B018  (plans now, in this process)
    dataset = pipe.to_torch_dataset(**TRAINING)
    items = iter(DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context))
    yield from items
    loader_shutdown.FEEDER_WAIT_S = 60.0  # a loaded CI machine: the feeders must exit, however slowly
    wait_for_feeders(items)


def loader_fork(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    return loader(config, "fork")


def loader_spawn(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    return loader(config, "spawn")


def exit_one_batch(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    os.environ.pop("ZEPHON_READ_AHEAD", None)
    first = next(iter(samples_pipeline(config)))
    return [first.to_training(**TRAINING)]


def raise_after_build(config: dict[str, Any]) -> Iterable[dict[str, torch.Tensor | int]]:
    os.environ.pop("ZEPHON_READ_AHEAD", None)
    iter(samples_pipeline(config))  # the run starts: the encoder is built and its engine is being chosen
    raise SystemExit(EARLY_ERROR)


PATTERNS: dict[str, Callable[[dict[str, Any]], Iterable[dict[str, torch.Tensor | int]]]] = {
    "direct": direct,
    "read_ahead": read_ahead,
    "count_threads": count_threads,
    "count_processes": count_processes,
    "chat": chat,
    "loader_fork": loader_fork,
    "loader_spawn": loader_spawn,
    "exit_one_batch": exit_one_batch,
    "raise_after_build": raise_after_build,
}


def fresh_cache(work: Path, pattern: str, verdicts: Path) -> None:
    """A cache of the pattern's own whose engine verdicts are the session's (``tokenizer-engines/``)."""
    root = work / pattern
    root.mkdir(parents=True, exist_ok=True)
    link = root / "tokenizer-engines"
    if not link.exists():
        link.symlink_to(verdicts, target_is_directory=True)
    os.environ["ZEPHON_CACHE_DIR"] = str(root)


def main(argv: list[str]) -> None:
    config = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    for pattern in argv[1:]:
        print(f"start {pattern}", flush=True)
        fresh_cache(Path(config["work"]), pattern, Path(config["verdicts"]))
        first: list[str] = []
        started = time.perf_counter()
        try:
            whole = digest_of(PATTERNS[pattern](config), first)
        except TokenizerError as exc:  # a forced engine refused: one line, as the CLI prints it
            print(f"TokenizerError: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        print(f"first {pattern} {first[0]}", flush=True)
        print(f"done {pattern} {whole} {time.perf_counter() - started:.2f}", flush=True)
        if pattern in ENGINE_USED:
            print(f"engine {pattern} {ENGINE_USED[pattern]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
