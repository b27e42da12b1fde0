"""Storage: local shards, the files Zephon writes, the shard cache, and remote backends (``hf://``).

Imports the plan contract and nothing above it; the recipe, both engines and the tools read shards through
this layer.
"""
