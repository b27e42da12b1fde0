"""The embedded demo: a synthetic corpus and a small tokenizer, so the quickstart runs offline.

Nothing here touches the network, and nothing is generated: both ship inside the package (``zephon/assets``),
the tokenizer as ``assets/tokenizer`` and the corpus's texts as ``assets/demo/corpus.jsonl.zst`` (written by
the grammar in the checkout's ``scripts/demo_grammar``, which is not installed); the corpus is written as
Parquet shards on first use. The modules, from data to disk:

* :mod:`~zephon.demo.assets`: where the shipped files live (``demo_tokenizer_path``).
* :mod:`~zephon.demo.corpus`: the shipped texts (``generate_demo_documents``, ``DEMO_KINDS``, ``DEMO_SHARDS``).
* :mod:`~zephon.demo.dataset`: the Parquet shards (``write_demo_dataset``, ``demo_dataset_path(s)``).
* :mod:`~zephon.demo.scores`: a sidecar of scores per document (``demo_scores_path``) for curricula.
"""

from zephon.demo.assets import demo_tokenizer_path
from zephon.demo.corpus import DEMO_KINDS, DEMO_SHARDS, generate_demo_documents
from zephon.demo.dataset import demo_dataset_path, demo_dataset_paths, write_demo_dataset
from zephon.demo.scores import demo_scores_path

__all__ = [
    "DEMO_KINDS",
    "DEMO_SHARDS",
    "demo_dataset_path",
    "demo_dataset_paths",
    "demo_scores_path",
    "demo_tokenizer_path",
    "generate_demo_documents",
    "write_demo_dataset",
]
