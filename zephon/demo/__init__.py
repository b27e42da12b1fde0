"""The embedded demo: a synthetic corpus and a small tokenizer, so the quickstart runs offline.

Nothing here touches the network. The tokenizer ships inside the package (``zephon/assets/tokenizer``); the
corpus is generated on first use from the word lists in ``zephon/assets/demo/vocabulary.json`` and cached
as Parquet shards. The modules, from data to disk:

* :mod:`~zephon.demo.assets`: where the shipped assets live (``demo_tokenizer_path``).
* :mod:`~zephon.demo.vocabulary`: the word lists, loaded once, their weighted forms and English word forms.
* :mod:`~zephon.demo.draw`: the one source of randomness, uniform draws from a seeded numpy Generator.
* :mod:`~zephon.demo.prose`, :mod:`~zephon.demo.code`, :mod:`~zephon.demo.short`: one grammar per kind.
* :mod:`~zephon.demo.generator`: ``generate_demo_documents`` and its determinism invariant.
* :mod:`~zephon.demo.dataset`: the Parquet shards (``write_demo_dataset``, ``demo_dataset_path(s)``).
* :mod:`~zephon.demo.scores`: a sidecar of scores per document (``demo_scores_path``) for curricula.
"""

from zephon.demo.assets import demo_tokenizer_path
from zephon.demo.dataset import DEMO_SHARDS, demo_dataset_path, demo_dataset_paths, write_demo_dataset
from zephon.demo.generator import DEMO_KINDS, generate_demo_documents
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
