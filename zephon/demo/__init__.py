"""The embedded demo: a synthetic corpus (``zephon.demo.corpus``) and a small tokenizer, so the quickstart
runs offline. Nothing here touches the network."""

from zephon.demo.corpus import (
    DEMO_KINDS,
    DEMO_SHARDS,
    demo_dataset_path,
    demo_dataset_paths,
    demo_tokenizer_path,
    generate_demo_documents,
    write_demo_dataset,
)

__all__ = [
    "DEMO_KINDS",
    "DEMO_SHARDS",
    "demo_dataset_path",
    "demo_dataset_paths",
    "demo_tokenizer_path",
    "generate_demo_documents",
    "write_demo_dataset",
]
