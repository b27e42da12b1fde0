"""The grammar behind Zephon's demo corpus: kept in the checkout, not installed.

Zephon ships the demo corpus's texts (``zephon/assets/demo/corpus.jsonl.zst``, seed 0) and writes the demo
shards from them (:mod:`zephon.demo`); this package is where those texts come from, and the only source of
other seeds (tests and benchmarks that want more or different synthetic text). Import it with ``scripts/`` on
``sys.path`` (pytest's ``pythonpath`` has it; ``scripts/build_demo_corpus.py`` runs from there):

* :mod:`demo_grammar.vocabulary`: the word lists (``vocabulary.json``, data), their weights and word forms.
* :mod:`demo_grammar.draw`: the one source of randomness, uniform draws from a seeded numpy Generator.
* :mod:`demo_grammar.prose`, :mod:`demo_grammar.code`, :mod:`demo_grammar.short`: one grammar per kind.
* :mod:`demo_grammar.generator`: ``generate_demo_documents(kind, count, seed)`` and its determinism invariant.
* :mod:`demo_grammar.corpus`: the shipped corpus file's content (``corpus_jsonl``) and the shards of any seed
  (``write_demo_dataset(root, seed=...)``, through :func:`zephon.demo.dataset.write_shards`).
"""

from demo_grammar.corpus import corpus_jsonl, write_corpus, write_demo_dataset
from demo_grammar.generator import generate_demo_documents

__all__ = ["corpus_jsonl", "generate_demo_documents", "write_corpus", "write_demo_dataset"]
