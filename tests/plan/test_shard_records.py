"""One shard record: the scan's ``ShardInfo`` numbered into the plan's ``ShardRef``, one row of shards.parquet."""

from __future__ import annotations

import dataclasses
import pickle

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.plan.format import SHARDS_SCHEMA
from zephon.plan.records import ShardInfo, ShardRef, shard_refs, shards_table

INFO = ShardInfo(uri="/data/web/part-0.parquet", format="parquet", rows=10, bytes=1234, fingerprint="pqfooter:ab")


def test_a_placed_shard_is_its_scan_record_with_ids() -> None:
    ref = INFO.placed(shard_id=3, dataset_id=1, dataset="web")
    assert isinstance(ref, ShardInfo)
    assert (ref.shard_id, ref.dataset_id, ref.dataset) == (3, 1, "web")
    assert all(getattr(ref, f.name) == getattr(INFO, f.name) for f in dataclasses.fields(ShardInfo))
    assert ref.identity == INFO.identity == ("/data/web/part-0.parquet", "pqfooter:ab")
    assert pickle.loads(pickle.dumps(ref)) == ref  # sent to count workers
    assert ShardRef(**dataclasses.asdict(ref)) == ref


def test_the_record_holds_exactly_the_columns_of_shards_parquet() -> None:
    assert {f.name for f in dataclasses.fields(ShardRef)} == set(SHARDS_SCHEMA.names)


def test_shards_table_round_trips_through_parquet(tmp_path) -> None:
    refs = [
        INFO.placed(shard_id=0, dataset_id=0, dataset="web"),
        dataclasses.replace(INFO, uri="/data/code/a.jsonl", format="jsonl").placed(
            shard_id=1, dataset_id=1, dataset="code"
        ),
    ]
    table = shards_table(refs)
    assert table.schema == SHARDS_SCHEMA
    assert shards_table([]).schema == SHARDS_SCHEMA and shards_table([]).num_rows == 0
    pq.write_table(table, tmp_path / "shards.parquet")
    assert shard_refs(pq.read_table(tmp_path / "shards.parquet")) == refs
    # Columns a reader does not know (a later format's) are left out.
    assert shard_refs(table.append_column("extra", pa.array([1, 2]))) == refs
