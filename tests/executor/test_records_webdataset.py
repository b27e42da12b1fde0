"""WebDataset tar shards in record pipelines: samples grouped by key, indexed at plan time from tar headers only,
read by member ranges; a member without its partner and a truncated tar are one line naming shard and key."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from zephon import Pipeline
from zephon.errors import DatasetError
from zephon.io import Dataset
from zephon.storage.tar_index import tar_index
from zephon.work import MixtureSpec, StaticMixtureWorkSource


def jpeg(seed: int, size: int = 24) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_shard(
    path: Path, shard: int, samples: int = 5, *, skip: tuple[str, str] | None = None, corrupt: str | None = None
) -> None:
    """``{key}.jpg``, ``{key}.txt``, ``{key}.json`` per sample; ``skip=(key, ext)`` leaves one member out;
    ``corrupt=key``: that key's jpg is not an image."""
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for i in range(samples):
            key = f"{shard:03d}{i:04d}"
            members = {
                "jpg": b"not a jpeg" if key == corrupt else jpeg(100 * shard + i),
                "txt": f"caption {shard}-{i}".encode(),
                "json": json.dumps({"i": i}).encode(),
            }
            for ext, payload in members.items():
                if skip == (key, ext):
                    continue
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))


def plan_of(folder: Path, out: Path) -> Path:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", str(folder))], mixture=MixtureSpec({"pairs": 1.0}), seed=5
    )
    return source.plan(out)


def test_planning_reads_only_tar_headers_and_counts_samples_by_key(tmp_path: Path):
    shard = tmp_path / "000.tar"
    write_shard(shard, 0, samples=20)
    index = tar_index(str(shard), "tar", shard.stat().st_size, "shard")
    assert len(index) == 20 and index.extensions == ("jpg", "json", "txt")
    payload = int(index.sizes.sum())
    assert index.bytes_read <= 512 * (3 * 20 + 2)  # one header block per member (and the end-of-archive blocks)
    assert index.bytes_read < shard.stat().st_size - payload  # no payload byte was read
    with tarfile.open(shard) as tar:
        member = tar.extractfile("0000007.txt").read()
    k = index.extensions.index("txt")
    assert shard.read_bytes()[index.offsets[7, k] : index.offsets[7, k] + index.sizes[7, k]] == member


def test_a_record_pipeline_over_webdataset_shards_yields_each_sample_by_key(tmp_path: Path):
    folder = tmp_path / "wds"
    folder.mkdir()
    write_shard(folder / "000.tar", 0)
    write_shard(folder / "001.tar.gz", 1)
    plan = plan_of(folder, tmp_path / "plan")
    assert pq.read_table(plan / "shards.parquet").column("format").to_pylist() == ["tar", "tar.gz"]

    def decode(sample: dict) -> dict:
        image = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB").resize((8, 8)))
        return {
            "key": sample["__key__"],
            "image": image,
            "caption": sample["txt"].decode(),
            "i": json.loads(sample["json"])["i"],
        }

    pipe = Pipeline.from_plan(plan).map_transform(decode).batch(microbatch_size=2)
    batches = list(pipe)
    samples = pq.read_table(plan / "samples.parquet").to_pydict()
    want = [f"{s:03d}{r:04d}" for s, r in zip(samples["shard_id"], samples["row"], strict=True)]
    assert [k for b in batches for k in b.data.get("key", [])] == want
    assert batches[0].data["image"].shape == (2, 8, 8, 3)
    assert [c for b in batches for c in b.data.get("caption", [])] == [
        f"caption {int(k[:3])}-{int(k[3:])}" for k in want
    ]


def test_a_member_without_its_partner_is_one_line_naming_shard_and_key(tmp_path: Path):
    folder = tmp_path / "wds"
    folder.mkdir()
    write_shard(folder / "000.tar", 0, skip=("0000003", "txt"))
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': shard .*000.tar key '0000003' must have the members jpg, json, txt like the shard's first key, got no txt — ",
    ):
        plan_of(folder, tmp_path / "plan")


def test_a_member_that_is_a_link_is_one_line_naming_it(tmp_path: Path):
    """A sample's member stored as a symbolic or hard link (a deduplicated image): webdataset skips it, so the
    sample would lose it (or, all its members links, vanish uncounted) — refused, naming the member and target."""
    folder = tmp_path / "wds"
    folder.mkdir()
    write_shard(folder / "000.tar", 0)
    for kind, name in ((tarfile.SYMTYPE, "a symbolic link"), (tarfile.LNKTYPE, "a hard link")):
        shutil.copy(folder / "000.tar", tmp_path / "copy.tar")
        with tarfile.open(tmp_path / "copy.tar", "a") as tar:
            for member in ("0000099.jpg", "0000099.json", "0000099.txt"):  # a whole sample of links
                info = tarfile.TarInfo(member)
                info.type, info.linkname = kind, member.replace("99", "02")
                tar.addfile(info)
        shutil.move(tmp_path / "copy.tar", folder / "001.tar")
        with pytest.raises(
            DatasetError,
            match=rf"001.tar member '0000099.jpg' must be a file or a directory, got {name} to '0000002.jpg' "
            r"\(webdataset skips it: its sample would be lost\) — write the file itself \(tar --dereference\) or "
            r"remove the member$",
        ):
            plan_of(folder, tmp_path / "plan")


def test_a_member_without_an_extension_is_one_line_naming_it(tmp_path: Path):
    """A name without a dot has no key/extension split: it was a sample of its own with extension '' (and the
    partner error then printed an empty extension list)."""
    folder = tmp_path / "wds"
    folder.mkdir()
    write_shard(folder / "000.tar", 0)
    with tarfile.open(folder / "000.tar", "a") as tar:
        info = tarfile.TarInfo("README")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': shard .*000.tar member 'README' must be named KEY.EXTENSION \(.*\), got no extension — ",
    ):
        plan_of(folder, tmp_path / "plan")


def test_an_empty_tar_is_a_shard_of_no_samples(tmp_path: Path):
    """A tar of no members (or only directories) beside others adds no samples; alone it is the empty-dataset
    line — it was a NumPy reshape error."""
    folder = tmp_path / "wds"
    folder.mkdir()
    with tarfile.open(folder / "001.tar", "w") as tar:
        info = tarfile.TarInfo("images")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    with pytest.raises(DatasetError, match=r"^dataset 'pairs' must have at least one row, got 0 rows in 1 shard"):
        plan_of(folder, tmp_path / "plan")
    write_shard(folder / "000.tar", 0)
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("pairs", str(folder))], mixture=MixtureSpec({"pairs": 1.0}), seed=5
    )
    keys = [k for b in Pipeline(source).batch(microbatch_size=2) for k in b.data["__key__"]]
    assert sorted(keys) == [f"000{i:04d}" for i in range(5)]


def test_a_truncated_tar_is_one_line_naming_the_shard_and_member(tmp_path: Path):
    folder = tmp_path / "wds"
    folder.mkdir()
    shard = folder / "000.tar"
    write_shard(shard, 0)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': shard .*000.tar must (hold member .* whole|end with the tar end-of-archive blocks), got a tar truncated at",
    ):
        plan_of(folder, tmp_path / "plan")


def test_a_tar_shard_rewritten_after_planning_is_refused(tmp_path: Path):
    folder = tmp_path / "wds"
    folder.mkdir()
    write_shard(folder / "000.tar", 0)
    plan = plan_of(folder, tmp_path / "plan")
    write_shard(folder / "000.tar", 7)  # same size, other members
    with pytest.raises(DatasetError, match="changed since planning"):
        list(Pipeline.from_plan(plan).batch(microbatch_size=2))


def decode(sample: dict) -> dict:
    image = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))
    return {"key": sample["__key__"], "mean": float(image.mean())}


def test_under_the_skip_policy_a_corrupt_image_is_skipped_counted_and_logged(tmp_path: Path):
    from zephon.inspection.log_check import check_log

    folder = tmp_path / "wds"
    folder.mkdir()
    write_shard(folder / "000.tar", 0, samples=6, corrupt="0000002")
    plan = plan_of(folder, tmp_path / "plan")
    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': shard .*000.tar row 2 key '0000002': map_transform .*UnidentifiedImageError.*on_bad_document=\"skip\"\)$",
    ):
        list(Pipeline.from_plan(plan).map_transform(decode).batch(microbatch_size=2))
    log = tmp_path / "log"
    pipe = Pipeline.from_plan(plan).options(on_bad_document="skip", provenance_dir=str(log))
    pipe = pipe.map_transform(decode).batch(microbatch_size=2)
    keys = [k for b in pipe for k in b.data.get("key", [])]
    assert sorted(keys) == [f"000000{i}" for i in (0, 1, 3, 4, 5)]
    assert pipe.stats().skipped == {"operator_error": 1}
    check = check_log(plan, log)
    assert check.ok and check.skipped == {"operator_error": 1}


def test_a_member_truncated_under_the_run_is_one_line_or_skipped_and_counted(tmp_path: Path):
    folder = tmp_path / "wds"
    folder.mkdir()
    shard = folder / "000.tar"
    write_shard(shard, 0, samples=8)
    plan = plan_of(folder, tmp_path / "plan")
    index = tar_index(str(shard), "tar", shard.stat().st_size, "shard")
    order = pq.read_table(plan / "samples.parquet").column("row").to_pylist()
    cut = int(index.offsets[order[4]].max())  # the file now ends inside the fifth sample's last member
    whole = shard.read_bytes()

    def run(policy: str) -> tuple[list[str], Pipeline]:
        shard.write_bytes(whole)
        pipe = Pipeline.from_plan(plan).options(on_bad_document=policy).batch(microbatch_size=2)
        it = iter(pipe)
        got = list(next(it).data["__key__"])  # the shard is open now (checked against the plan)
        shard.write_bytes(whole[:cut])  # truncated under the run
        return got + [k for b in it for k in b.data.get("__key__", [])], pipe

    with pytest.raises(
        DatasetError,
        match=r"^dataset 'pairs': shard .*000.tar key '\d+' member '\w+' must have \d+ bytes, got \d+ \(a truncated tar\) — restore the shard, or skip",
    ):
        run("raise")
    keys, pipe = run("skip")
    ends = (index.offsets + index.sizes).max(axis=1)
    whole_rows = [r for r in order[2:] if ends[r] <= cut]
    assert keys == [index.keys[r] for r in order[:2] + whole_rows]
    assert pipe.stats().skipped == {"truncated_member": 6 - len(whole_rows)}
