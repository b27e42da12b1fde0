"""Record pipelines over local WebDataset shards: bytes/s against a bare ``tarfile`` read, and Pillow decoding in
DataLoader workers.

Run: python benchmarks/bench_records.py [--shards 8] [--samples 100] [--jpegs 768] [--microbatch 32] [--repeats 5]
[--rounds 4] [--plan-shards 10000]

Data, written deterministically (seed 0) under ``$ZEPHON_BENCH_DIR`` (reused by later runs) or a temporary
directory, then planned once each (a samples plan, every sample once, shuffled as by default):

* ``raw``: ``--shards`` plain ``.tar`` shards of ``--samples`` samples, ``{key}.jpg`` = random bytes of 20-200 KB
  (uniform) and ``{key}.txt`` = a caption of ~40 bytes — the no-decode case (~110 KB a sample);
* ``jpeg``: 4 shards of ``--jpegs`` samples in all, ``{key}.jpg`` = a real JPEG of noise smoothed at a random
  scale, 224-420 px a side, quality 85-95 (about 20-130 KB), and ``{key}.txt``.

(a) **No decoding.** ``Pipeline.from_plan(raw).batch(microbatch_size=M)`` (default collate: the bytes stay a
list), every batch's ``jpg`` and ``txt`` bytes counted, against a bare read of the same members in the same
process: each shard opened with ``tarfile`` and every member's payload read (``tar.extractfile(m).read()``), in
shard order. Both read from the page cache (one untimed run of each first). ``--repeats`` alternations;
prints the best bytes/s of each and the ratio run ÷ bare, best ÷ best and by alternation as median (min–max)
(the issue's bar: ≥ 0.8×).

(b) **Pillow decoding.** ``map_transform`` decodes each JPEG, converts it to RGB and resizes it to 128×128
(``uint8`` arrays, stacked by the default collate); ``Pipeline.dataloader(num_workers=0/1/2)`` iterates the
whole plan — a new loader each time, so its workers' start-up (fork, opening the plan, the operators' start-up
check) is included — against the same decode in a bare ``tarfile`` loop in this process. ``--rounds`` rounds of
the four, the order rotated each round; prints samples/s and CPU ms a sample (this process and its joined
workers) and the cores it kept busy (CPU seconds ÷ seconds), and the ratios 1 ÷ 0 and 2 ÷ 1 workers within each
round. Workers scale a run only when the machine gives the run's processes more cores: Linux's autogroup
scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) shares the CPU between sessions, so on a busy machine
a session's workers share its one slice ("cores busy" stays flat as workers are added).

(c) **Planning many shards.** ``--plan-shards`` small tar shards (4 samples each) planned in this process; prints
the time and the positioned reads (``os.pread``, the header walk: one a member and one for the end) and bytes
read a shard — headers only, never a payload.

Prints the machine's cores and load average before and after: on a shared machine the worker ratios mean
little when the load exceeds the cores.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

SIDE = 128


def caption(rng: np.random.Generator) -> bytes:
    words = ["a", "small", "red", "blue", "cat", "dog", "on", "the", "grass", "near", "water", "photo"]
    return " ".join(rng.choice(words, size=8)).encode()


def noise_jpeg(rng: np.random.Generator) -> bytes:
    """A JPEG of smoothed noise, 224-420 px a side, quality 85-95: about 20-130 KB."""
    side = int(rng.integers(224, 421))
    pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.0))))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=int(rng.integers(85, 96)))
    return out.getvalue()


def write_shards(folder: Path, shards: int, samples: int, image: Callable[[np.random.Generator], bytes]) -> int:
    """``shards`` tar shards of ``samples`` samples each, sample ``i`` of shard ``s`` from ``rng(0, s, i)``;
    returns the payload bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for s in range(shards):
        with tarfile.open(folder / f"{s:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(samples):
                rng = np.random.default_rng([0, s, i])
                for ext, payload in (("jpg", image(rng)), ("txt", caption(rng))):
                    info = tarfile.TarInfo(f"{s:04d}{i:05d}.{ext}")
                    info.size, info.mtime = len(payload), 0
                    tar.addfile(info, io.BytesIO(payload))
                    total += len(payload)
    return total


def random_bytes(rng: np.random.Generator) -> bytes:
    return rng.bytes(int(rng.integers(20_000, 200_001)))


def plan(folder: Path, out: Path) -> Path:
    from zephon.io import Dataset
    from zephon.work import MixtureSpec, StaticMixtureWorkSource

    if (out / "plan.json").exists():
        return out
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", str(folder))], mixture=MixtureSpec({"pairs": 1.0}), seed=0
    )
    return source.plan(out)


def bare_bytes(folder: Path) -> int:
    total = 0
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                total += len(tar.extractfile(member).read())  # type: ignore[union-attr]
    return total


def run_bytes(plan_dir: Path, microbatch: int) -> int:
    from zephon import Pipeline

    total = 0
    for batch in Pipeline.from_plan(plan_dir).batch(microbatch_size=microbatch):
        total += sum(map(len, batch.data["jpg"])) + sum(map(len, batch.data["txt"]))
    return total


def plan_many(root: Path, shards: int) -> None:
    """(c) Planning ``shards`` small tar shards (4 samples of ``.jpg`` 2-6 KB + ``.txt`` each): seconds, and the
    positioned reads and bytes the planner read from them (``os.pread``: the header walk) against their sizes."""
    folder = root / f"many-{shards}"
    if not folder.exists():
        write_shards(folder, shards, 4, lambda rng: rng.bytes(int(rng.integers(2_000, 6_001))))
    total = sum(p.stat().st_size for p in folder.glob("*.tar"))
    calls, read = [0], [0]
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        data = real(fd, n, offset)
        calls[0] += 1
        read[0] += len(data)
        return data

    out = root / f"plan-many-{shards}-{time.time_ns()}"
    os.pread = counting  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        plan(folder, out)
        seconds = time.perf_counter() - start
    finally:
        os.pread = real  # type: ignore[assignment]
    print(f"(c) planning {shards} tar shards of 4 samples (8 members each, {total / 1e6:.1f} MB):")
    print(
        f"    {seconds:.1f} s; {calls[0] / shards:.1f} positioned reads and {read[0] / shards:.0f} bytes read a shard "
        f"(headers only: {read[0] / total:.1%} of the bytes)"
    )


def decode(record: dict) -> dict:
    image = Image.open(io.BytesIO(record["jpg"])).convert("RGB").resize((SIDE, SIDE), Image.Resampling.BILINEAR)
    return {"pixels": np.asarray(image), "txt": record["txt"]}


def bare_decoded(folder: Path) -> int:
    done = 0
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = tar.getmembers()
            for jpg, txt in zip(members[::2], members[1::2], strict=True):
                decode({"jpg": tar.extractfile(jpg).read(), "txt": tar.extractfile(txt).read()})  # type: ignore[union-attr]
                done += 1
    return done


def loader(plan_dir: Path, microbatch: int, workers: int, persistent: bool = False):
    from zephon import Pipeline

    pipe = Pipeline.from_plan(plan_dir).map_transform(decode).batch(microbatch_size=microbatch)
    return pipe.dataloader(num_workers=workers, persistent_workers=persistent)


def samples(batches) -> int:
    return sum(len(t["pixels"]) for t in batches)


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (DataLoader workers, once joined)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best(fn: Callable[[], int], repeats: int) -> tuple[float, int, float]:
    """(best seconds, the count ``fn`` returned, the CPU seconds of that run)."""
    runs, count = [], 0
    for _ in range(repeats):
        start, cpu = time.perf_counter(), cpu_seconds()
        count = fn()
        runs.append((time.perf_counter() - start, cpu_seconds() - cpu))
    seconds, cpu = min(runs)
    return seconds, count, cpu


def spread(values: list[float], fmt: str) -> str:
    """``median (min–max)``."""
    return f"{np.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def machine() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--jpegs", type=int, default=768)
    parser.add_argument("--microbatch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--plan-shards", type=int, default=10_000, help="(c): 0 to skip")
    args = parser.parse_args()
    root = Path(os.environ.get("ZEPHON_BENCH_DIR") or tempfile.mkdtemp(prefix="zephon-bench-records-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    print(f"machine: {machine()}")

    raw = root / f"raw-{args.shards}x{args.samples}"
    if not raw.exists():
        write_shards(raw, args.shards, args.samples, random_bytes)
    jpeg = root / f"jpeg-{args.jpegs}"
    if not jpeg.exists():
        write_shards(jpeg, 4, args.jpegs // 4, noise_jpeg)
    raw_plan, jpeg_plan = plan(raw, root / f"plan-{raw.name}"), plan(jpeg, root / f"plan-{jpeg.name}")
    sizes = []
    for shard in sorted(jpeg.glob("*.tar")):
        with tarfile.open(shard) as tar:
            sizes += [m.size for m in tar if m.name.endswith(".jpg")]
    print(
        f"data: {raw.name}: {args.shards * args.samples} samples of random bytes 20-200 KB as .jpg + .txt; "
        f"{jpeg.name}: {len(sizes)} noise JPEGs of {min(sizes) // 1000}-{max(sizes) // 1000} KB "
        f"(median {int(np.median(sizes)) // 1000} KB)"
    )

    # (a) no decoding: the record pipeline against tarfile, alternating, best of repeats.
    bare_bytes(raw), run_bytes(raw_plan, args.microbatch)  # warm-up: imports, the page cache
    bare_times, run_times = [], []
    for _ in range(args.repeats):
        bare_times.append(best(lambda: bare_bytes(raw), 1)[:2])
        run_times.append(best(lambda: run_bytes(raw_plan, args.microbatch), 1)[:2])
    (bare_s, bare_n), (run_s, run_n) = min(bare_times), min(run_times)
    assert bare_n == run_n, (bare_n, run_n)  # the same members, every byte
    print(f"(a) no decoding, {bare_n / 1e6:.1f} MB of payload, microbatch {args.microbatch}:")
    print(f"    bare tarfile read       {bare_n / bare_s / 1e6:8.1f} MB/s  ({bare_s:.3f} s)")
    print(f"    record pipeline         {run_n / run_s / 1e6:8.1f} MB/s  ({run_s:.3f} s)")
    pairs = [b[0] / r[0] for b, r in zip(bare_times, run_times, strict=True)]
    print(
        f"    ratio pipeline ÷ bare   {bare_s / run_s:8.2f}× best ÷ best, {spread(pairs, '.2f')} by alternation "
        "(bar: ≥ 0.8×)"
    )

    # (b) Pillow decoding: the bare loop and the pipeline's DataLoader with 0, 1, 2 workers, in rounds, the order
    # rotated each round (on a shared machine the load drifts: ratios are taken within a round).
    runs: dict[str, Callable[[], int]] = {
        "bare tarfile + Pillow": lambda: bare_decoded(jpeg),
        **{f"dataloader({w} workers)": (lambda w=w: samples(loader(jpeg_plan, args.microbatch, w))) for w in (0, 1, 2)},
    }
    names = list(runs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    cores: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            seconds, n, cpu = best(runs[name], 1)
            assert n == len(sizes), (name, n)
            rates[name].append(n / seconds)
            cpus[name].append(cpu / n * 1e3)
            cores[name].append(cpu / seconds)
    print(f"(b) Pillow decode + resize to {SIDE}×{SIDE}, {len(sizes)} JPEGs, {args.rounds} rounds, start-up included:")
    for name in names:
        print(
            f"    {name:24s} {spread(rates[name], '.1f')} samples/s, {np.median(cpus[name]):.2f} CPU ms a sample, "
            f"{np.median(cores[name]):.2f} cores busy (medians)"
        )
    zero, one, two = (rates[f"dataloader({w} workers)"] for w in (0, 1, 2))
    print(
        f"    ratios in a round: 1 ÷ 0 workers {spread([a / b for a, b in zip(one, zero, strict=True)], '.2f')}, "
        f"2 ÷ 1 workers {spread([a / b for a, b in zip(two, one, strict=True)], '.2f')}"
    )
    if args.plan_shards:
        plan_many(root, args.plan_shards)
    print(f"machine after: {machine()}")


if __name__ == "__main__":
    main()
