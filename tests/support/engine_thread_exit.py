"""The pattern that crashed kitoken runs, as a child process: the encoder (and so its engine) is built on a thread
that then exits, and the main thread encodes afterwards, split over the encoder's pool threads. Prints the sha256
of every batch's ids and the engine's name; a crash is a signal and no output.

Usage: python -X faulthandler engine_thread_exit.py TOKENIZER_DIR ENGINE [DOCUMENTS]"""

from __future__ import annotations

import hashlib
import sys
import threading

from demo_grammar import generate_demo_documents

from zephon.demo import DEMO_KINDS
from zephon.executor.encode.text import Encoder
from zephon.specs import TokenizeSpec


def demo_texts(count: int = 400) -> list[str]:
    return [doc for kind in DEMO_KINDS for doc in generate_demo_documents(kind, count, seed=5)]


def digest(encoder: Encoder, texts: list[str]) -> str:
    """sha256 of the ids of ``texts`` encoded 128 at a time (each call split over the encoder's pool)."""
    out = hashlib.sha256()
    for k in range(0, len(texts), 128):
        out.update(encoder.encode_flat(texts[k : k + 128]).ids.tobytes())
    return out.hexdigest()


def main() -> None:
    directory, engine = sys.argv[1], sys.argv[2]
    texts = demo_texts(int(sys.argv[3]) if len(sys.argv) > 3 else 400)
    built: list[Encoder] = []
    thread = threading.Thread(target=lambda: built.append(Encoder(TokenizeSpec(tokenizer_id=directory), engine=engine)))
    thread.start()
    thread.join()  # the thread that built the engine is gone
    print(built[0].engine, digest(built[0], texts))


if __name__ == "__main__":
    main()
