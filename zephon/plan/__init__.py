"""The plan contract: the bundle's files, Arrow schemas, format version, manifest and shard records.

The lowest layer above ``zephon.errors``: it imports pyarrow and the standard library only, so the planner,
the executor and inspection tools read the bundle through the same definitions.
"""
