"""Reading: planned documents' texts from their shards (Parquet, JSONL, remote, copies), ahead of use."""
