"""Record pipelines over local WebDataset shards: bytes/s against a bare ``tarfile`` read, and Pillow decoding in
DataLoader workers.

Run: python benchmarks/bench_records.py [--shards 8] [--samples 100] [--jpegs 384] [--microbatch 32] [--repeats 3]

Data, written deterministically (seed 0) under ``$ZEPHON_BENCH_DIR`` (reused by later runs) or a temporary
directory, then planned once each (a samples plan, every sample once, shuffled as by default):

* ``raw``: ``--shards`` plain ``.tar`` shards of ``--samples`` samples, ``{key}.jpg`` = random bytes of 20-200 KB
  (uniform) and ``{key}.txt`` = a caption of ~40 bytes — the no-decode case (~110 KB a sample);
* ``jpeg``: 4 shards of ``--jpegs`` samples in all, ``{key}.jpg`` = a real JPEG of noise smoothed at a random
  scale, 224-420 px a side, quality 85-95 (about 20-130 KB), and ``{key}.txt``.

(a) **No decoding.** ``Pipeline.from_plan(raw).batch(microbatch_size=M)`` (default collate: the bytes stay a
list), every batch's ``jpg`` and ``txt`` bytes counted, against a bare read of the same members in the same
process: each shard opened with ``tarfile`` and every member's payload read (``tar.extractfile(m).read()``), in
shard order. Both read from the page cache (the files were just written or read). Best of ``--repeats``,
alternating; prints bytes/s and the ratio run ÷ bare (the issue's bar: ≥ 0.8×).

(b) **Pillow decoding.** ``map_transform`` decodes each JPEG, converts it to RGB and resizes it to 128×128
(``uint8`` arrays, stacked by the default collate); ``Pipeline.dataloader(num_workers=0/1/2)`` iterates the
whole plan, against the same decode in a bare ``tarfile`` loop in this process. "start-up included" times a new
loader (its workers fork and open the plan); "steady" times a second epoch of a loader with persistent workers.
Prints samples/s, and the ratios 1 ÷ 0 and 2 ÷ 1 workers.

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


def machine() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--jpegs", type=int, default=384)
    parser.add_argument("--microbatch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
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
    bare_times, run_times = [], []
    for _ in range(args.repeats):
        bare_times.append(best(lambda: bare_bytes(raw), 1)[:2])
        run_times.append(best(lambda: run_bytes(raw_plan, args.microbatch), 1)[:2])
    (bare_s, bare_n), (run_s, run_n) = min(bare_times), min(run_times)
    assert bare_n == run_n, (bare_n, run_n)  # the same members, every byte
    print(f"(a) no decoding, {bare_n / 1e6:.1f} MB of payload, microbatch {args.microbatch}:")
    print(f"    bare tarfile read       {bare_n / bare_s / 1e6:8.1f} MB/s  ({bare_s:.3f} s)")
    print(f"    record pipeline         {run_n / run_s / 1e6:8.1f} MB/s  ({run_s:.3f} s)")
    print(f"    ratio pipeline ÷ bare   {bare_s / run_s:8.2f}×  (bar: ≥ 0.8×)")

    # (b) Pillow decoding: the bare loop, then the pipeline's DataLoader with 0, 1, 2 workers.
    bare_s, bare_n, bare_cpu = best(lambda: bare_decoded(jpeg), args.repeats)
    print(f"(b) Pillow decode + resize to {SIDE}×{SIDE}, {bare_n} JPEGs:")
    print(
        f"    bare tarfile + Pillow   {bare_n / bare_s:8.1f} samples/s, {bare_cpu / bare_n * 1e3:.1f} CPU ms a sample"
    )
    rates, steady = {}, {}
    for workers in (0, 1, 2):
        seconds, n, cpu = best(lambda w=workers: samples(loader(jpeg_plan, args.microbatch, w)), args.repeats)
        assert n == bare_n, (n, bare_n)
        rates[workers] = n / seconds
        line = f"    dataloader({workers} workers)   {rates[workers]:8.1f} samples/s start-up included"
        line += f" ({cpu / n * 1e3:.1f} CPU ms a sample)"
        if workers:
            warm = loader(jpeg_plan, args.microbatch, workers, persistent=True)
            samples(warm)  # the first epoch starts the workers
            seconds, n, _ = best(lambda warm=warm: samples(warm), args.repeats)
            steady[workers] = n / seconds
            line += f", {steady[workers]:8.1f} steady"
        print(line)
    print(f"    ratios, start-up included: 1 ÷ 0 workers {rates[1] / rates[0]:.2f}×, 2 ÷ 1 {rates[2] / rates[1]:.2f}×")
    print(f"    ratios, steady: 1 worker ÷ 0 {steady[1] / rates[0]:.2f}×, 2 ÷ 1 {steady[2] / steady[1]:.2f}×")
    print(f"machine after: {machine()}")


if __name__ == "__main__":
    main()
