"""Build the shipped demo corpus (``zephon/assets/demo/corpus.jsonl.zst``) from the grammar in ``scripts/demo_grammar``.

The texts of the demo shards (seed 0), one JSON line per row, zstd-compressed (``demo_grammar.corpus``).
Generation is deterministic, so rerunning this script reproduces the file's content byte for byte
(tests/demo/test_demo_grammar.py checks it)::

    python scripts/build_demo_corpus.py [--out PATH]

Rebuild the demo tokenizer afterwards if the texts changed (``scripts/build_demo_tokenizer.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from demo_grammar.corpus import ASSET, write_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSET, help=f"where to write it (default {ASSET})")
    args = parser.parse_args()
    size = write_corpus(args.out)
    print(f"wrote {args.out} ({size:,} bytes)")


if __name__ == "__main__":
    main()
