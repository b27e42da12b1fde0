"""Chat tokenization: the verified engine with offsets derived from ids, against ``tokenizers``' offsets.

Run: python benchmarks/bench_chat.py [--tokenizer deepseek-v4] [--conversations 4000] [--repeats 3]

Conversations: real text from this machine's files (``local_corpus.py``'s prose), each document cut into
4-8 turns alternating user / assistant, rendered with a ChatML template with generation tags; the tokenizer is
a real vendor tokenizer.json (``vendor_tokenizers.py``). Both paths run in this process on the same rendered
conversations, alternately, best of ``--repeats``: ``ChatEncoder.encode_flat`` (the engine's ids, offsets
derived from them) and ``ChatEncoder._with_tokenizers`` (``tokenizers.encode_batch`` with offsets, today's
path before the engine layer); their masked ids are checked equal first. Prints Mtok/s and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}{% endfor %}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="deepseek-v4")
    parser.add_argument("--conversations", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import local_corpus
    import numpy as np
    import pyarrow.parquet as pq
    import vendor_tokenizers

    from zephon.executor.encode.encoders import make_encoder
    from zephon.specs import ChatSpec, TokenizeSpec

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-bench-chat-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(root / "cache"))
    tokenizer = Path(vendor_tokenizers.build(args.tokenizer, root / "tokenizers"))
    directory = tokenizer if tokenizer.is_dir() else tokenizer.parent
    config = directory / "tokenizer_config.json"
    data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    data["chat_template"] = TEMPLATE
    config.write_text(json.dumps(data), encoding="utf-8")
    corpus = local_corpus.build(root / "corpus-local")
    docs = [t for f in sorted((corpus / "prose").glob("*.parquet")) for t in pq.read_table(f).column(0).to_pylist()]
    encoder = make_encoder(TokenizeSpec(tokenizer_id=str(directory), field="messages", chat=ChatSpec()))
    chats = []
    for i, doc in enumerate(docs[: args.conversations]):
        turns = 4 + i % 5
        step = max(1, len(doc) // turns)
        parts = [doc[k * step : (k + 1) * step] for k in range(turns)]
        messages = [{"role": "user" if k % 2 == 0 else "assistant", "content": p} for k, p in enumerate(parts)]
        if messages[-1]["role"] == "user":
            messages.pop()
        chats.append(encoder.final({"messages": messages}))
    chars = sum(len(c.text) for c in chats)
    batches = [chats[k : k + 256] for k in range(0, len(chats), 256)]
    got = [encoder.encode_flat(b) for b in batches]
    want = [encoder._with_tokenizers(b) for b in batches]
    same = all(np.array_equal(g.ids, np.concatenate(w)) for g, w in zip(got, want, strict=True))
    tokens = sum(len(g.ids) for g in got)
    print(
        f"tokenizer {args.tokenizer}; {len(chats)} conversations, {chars / 1e6:.1f} M characters, "
        f"{tokens / 1e6:.2f} M tokens; engine {encoder.engine}, refused {encoder.refused}; masked ids equal: {same}"
    )
    best = {"engine, derived offsets": float("inf"), "tokenizers offsets": float("inf")}
    for _ in range(args.repeats):
        start = time.perf_counter()
        for b in batches:
            encoder.encode_flat(b)
        best["engine, derived offsets"] = min(best["engine, derived offsets"], time.perf_counter() - start)
        start = time.perf_counter()
        for b in batches:
            encoder._with_tokenizers(b)
        best["tokenizers offsets"] = min(best["tokenizers offsets"], time.perf_counter() - start)
    for label, seconds in best.items():
        print(f"  {label:24} {tokens / seconds / 1e6:6.2f} Mtok/s")
    ratio = best["tokenizers offsets"] / best["engine, derived offsets"]
    print(f"  ratio {ratio:.2f}x; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
