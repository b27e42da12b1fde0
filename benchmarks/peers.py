"""Other data loaders on the same shards, tokenizer, mixture, packing and token budget as the executor.

Imported by ``bench_executor.py`` (``--reference PYTHON``, ``--peers PYTHON``); run as a script by a peer's own
Python (``python peers.py --peer hf-datasets|grain CONFIG_JSON``), so the peers' libraries never have to be in
Zephon's environment:

* **reference** — the published ``zephon==0.2.0`` with its documented API (its own venv: it has our package's name);
* **hf-datasets** — Hugging Face ``datasets`` streaming: one ``load_dataset("parquet", streaming=True)`` per
  dataset, ``interleave_datasets`` with the mixture's probabilities (seed 0, ``all_exhausted``), a batched
  ``map`` of 1,024 texts through ``Tokenizer.encode_batch_fast`` (the library's threads; the fastest call
  ``tokenizers`` has, not the slower ``transformers`` wrapper), ``iter(batch_size=1024)``, then wrap packing
  in numpy (concatenate, cut rows of ``max_length``) and batches of ``microbatch`` rows;
* **grain** — Google Grain: ``ParquetIterDataset`` per dataset, ``IterDataset.mix`` with the weights, a
  per-record ``map`` through ``Tokenizer.encode``, ``ConcatThenSplitIterDataset`` (Grain's wrap packing) and
  ``batch``; on several cores ``mp_prefetch`` with one worker process per core (each a slice of the stream),
  on one core in process.

Every peer mixes by samples, appends EOS to each document, packs with wrap to ``max_length`` and turns each
batch into torch ``input_ids`` / ``labels`` (``rows[:, :-1]``, ``rows[:, 1:]``) as ``to_training`` does; it
stops at the first batch that reaches the token budget (Zephon's own samples plan's tokens). Throughput counts
``rows × max_length`` tokens. Time starts after the imports for the reference (as for Zephon), but before
``datasets`` / ``grain`` are imported for the other two: their first batch and end-to-end figures include
that import (~0.7 s for ``datasets`` on 2 cores). Each peer runs in a subprocess pinned to the cores
(``taskset`` + ``RAYON_NUM_THREADS``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REFERENCE_SCRIPT = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
start = time.perf_counter()
from zephon import Pipeline
from zephon.io import Dataset
from zephon.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation
datasets = [Dataset.from_path(k, f"{cfg['corpus']}/{k}") for k in cfg["weights"]]
extra = {"token_estimation": TokenEstimation()} if cfg["mode"] == "tokens" else {}
ws = StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec(cfg["weights"]), seed=0, chunk_size=4096, **extra)
pipe = (Pipeline(ws).tokenize(tokenizer_id=cfg["tokenizer"], field="text", special_tokens="eos")
        .pack_flat(max_length=cfg["max_length"], algorithm="wrap").batch(microbatch_size=cfg["microbatch"]))
t0 = time.perf_counter(); tokens = 0; first = None; steady = None
for batch in pipe:
    out = batch.to_training(return_labels=True)
    tokens += out["input_ids"].shape[0] * (out["input_ids"].shape[1] + 1)
    if first is None:
        first = time.perf_counter() - t0; steady = time.perf_counter(); steady_tokens = tokens
    if tokens >= cfg["tokens"]:
        break
end = time.perf_counter()
hwm = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print(json.dumps({"seconds": end - t0, "tokens": tokens, "first_batch_s": first,
                  "steady_tok_s": (tokens - steady_tokens) / (end - steady), "peak_rss_mb": hwm / 1024}))
"""

EOS = "<|endoftext|>"


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``). Not ``ru_maxrss``: Linux carries that across ``exec``, so a child
    would report its parent's peak when the parent's was larger (the benchmark's parent builds corpora)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# -- peers (run by the peer's Python) ----------------------------------------------------------------------------


def _shards(cfg: dict, kind: str) -> list[str]:
    return sorted(glob.glob(f"{cfg['corpus']}/{kind}/*.parquet"))


def _hf_batches(cfg: dict) -> Iterator:
    import datasets
    import numpy as np
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    tok = Tokenizer.from_file(str(Path(cfg["tokenizer"]) / "tokenizer.json"))
    eos = tok.token_to_id(EOS)
    streams = [
        datasets.load_dataset("parquet", data_files=_shards(cfg, k), split="train", streaming=True)
        for k in cfg["weights"]
    ]
    mixed = datasets.interleave_datasets(
        streams, probabilities=list(cfg["weights"].values()), seed=0, stopping_strategy="all_exhausted"
    )

    def encode(batch: dict) -> dict:
        return {"ids": [[*e.ids, eos] for e in tok.encode_batch_fast(batch["text"], add_special_tokens=False)]}

    mapped = mixed.map(encode, batched=True, batch_size=1024, remove_columns=streams[0].column_names)
    width, need = cfg["max_length"], cfg["max_length"] * cfg["microbatch"]
    pending: list = []
    held = 0
    for batch in mapped.iter(batch_size=1024):
        pending += [np.asarray(ids, dtype=np.int64) for ids in batch["ids"]]
        held += sum(len(ids) for ids in batch["ids"])
        if held < need:
            continue
        flat = np.concatenate(pending)
        full = len(flat) // need * need
        yield from flat[:full].reshape(-1, cfg["microbatch"], width)
        pending, held = [flat[full:]], len(flat) - full


_GRAIN_TOK = None


def _grain_encode(record: dict) -> dict:
    """Module level: Grain's worker processes pickle the map function and load the tokenizer once each."""
    import numpy as np
    from tokenizers import Tokenizer

    global _GRAIN_TOK
    if _GRAIN_TOK is None:
        _GRAIN_TOK = (tok := Tokenizer.from_file(os.environ["PEER_TOKENIZER_JSON"]), tok.token_to_id(EOS))
    tok, eos = _GRAIN_TOK
    return {"ids": np.array([*tok.encode(record["text"], add_special_tokens=False).ids, eos], dtype=np.int64)}


def _grain_batches(cfg: dict) -> Iterator:
    import grain
    from grain import experimental as ge

    os.environ["PEER_TOKENIZER_JSON"] = str(Path(cfg["tokenizer"]) / "tokenizer.json")
    sources = [ge.ParquetIterDataset(_shards(cfg, k)) for k in cfg["weights"]]
    mixed = grain.IterDataset.mix(sources, weights=list(cfg["weights"].values()))
    packed = ge.ConcatThenSplitIterDataset(mixed.map(_grain_encode), length_struct={"ids": cfg["max_length"]})
    ds = packed.batch(cfg["microbatch"])
    if cfg["cores"] > 1:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg["cores"]))
    for batch in ds:
        yield batch["ids"]


def run_peer(name: str, cfg: dict) -> dict:
    import torch

    start = time.perf_counter()
    batches = {"hf-datasets": _hf_batches, "grain": _grain_batches}[name](cfg)
    tokens, first, steady, steady_tokens = 0, None, start, 0
    for rows in batches:
        ids = torch.from_numpy(rows)
        out = {"input_ids": ids[:, :-1], "labels": ids[:, 1:].clone()}
        tokens += out["input_ids"].shape[0] * (out["input_ids"].shape[1] + 1)
        if first is None:
            first, steady, steady_tokens = time.perf_counter() - start, time.perf_counter(), tokens
        if tokens >= cfg["tokens"]:
            break
    end = time.perf_counter()
    return {
        "seconds": end - start,
        "tokens": tokens,
        "first_batch_s": first,
        "steady_tok_s": (tokens - steady_tokens) / (end - steady),
        "peak_rss_mb": peak_rss_mb(),
    }


# -- orchestration (run by the benchmark) ------------------------------------------------------------------------


def _pinned(python: str, args: list[str], cores: int, cwd: str) -> dict | str:
    """Run ``python ARGS`` on the first ``cores`` usable cores; the last stdout line as JSON, or why it failed."""
    argv = ["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[:cores])), python, *args]
    env = {**os.environ, "RAYON_NUM_THREADS": str(cores), "PYTHONPATH": "", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd, check=False)
    if out.returncode:
        return f"failed: {out.stderr.strip().splitlines()[-1:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(
    label: str, python: str, names: list[str], modes: tuple[str, ...], *, corpus: Path, tokenizer: Path,
    results: dict, all_cores: int, shape: dict, best: Callable[[list[dict]], dict], rate: Callable[[dict], float],
) -> None:  # fmt: skip
    """Print each peer's figures beside ours (``results`` of the benchmark) on the same budget and cores."""
    print(f"\n{label} ({python}):")
    for name in names:
        for mode in modes:
            for cores in (1, all_cores):
                ours = best(results[(mode, "zephon", cores)])
                cfg = {"corpus": str(corpus), "tokenizer": str(tokenizer), "mode": mode, "cores": cores, **shape}
                cfg["tokens"] = ours["total_tokens"]
                if name == "reference":
                    peer = _pinned(python, ["-c", REFERENCE_SCRIPT, json.dumps(cfg)], cores, cwd="/")
                else:
                    peer = _pinned(python, [__file__, "--peer", name, json.dumps(cfg)], cores, cwd="/")
                if isinstance(peer, str):
                    print(f"  {name:11} {mode:7} {cores} core(s): {peer}")
                    continue
                ours_total = ours["total_tokens"] / ours["total_seconds"]
                print(
                    f"  {name:11} {mode:7} {cores} core(s): {peer['tokens'] / peer['seconds'] / 1e6:.2f} Mtok/s end "
                    f"to end, {peer['steady_tok_s'] / 1e6:.2f} after its first batch ({peer['first_batch_s']:.2f} s), "
                    f"peak RSS {peer['peak_rss_mb']:.0f} MB; ours ÷ {name}: end to end "
                    f"{ours_total * peer['seconds'] / peer['tokens']:.1f}×, after the first batch "
                    f"{rate(ours) / peer['steady_tok_s']:.1f}×"
                )
                same = results.get((mode, "zephon, tokenizers engine", cores))
                if same:  # the same tokenizer library as the peer
                    slow = best(same)
                    print(
                        f"  {'':11} {'':7} {cores} core(s): ours with the tokenizers engine ÷ {name}: end to end "
                        f"{slow['total_tokens'] / slow['total_seconds'] * peer['seconds'] / peer['tokens']:.1f}×, "
                        f"after the first batch {rate(slow) / peer['steady_tok_s']:.1f}×"
                    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", required=True, choices=["hf-datasets", "grain"])
    parser.add_argument("config", help="JSON: corpus, tokenizer, weights, max_length, microbatch, tokens, cores")
    parsed = parser.parse_args()
    print(json.dumps(run_peer(parsed.peer, json.loads(parsed.config))))
    sys.stdout.flush()
    os._exit(0)  # Grain's worker processes and shared memory need no orderly teardown here
