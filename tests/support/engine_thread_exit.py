"""The pattern that crashed kitoken runs, as a child process: the encoder (and so its engine) is built on a thread
that then exits, and the main thread encodes afterwards, split over the encoder's pool threads. Prints the sha256
of every batch's ids and the engine's name; a crash is a signal and no output.

Usage: python -X faulthandler engine_thread_exit.py TOKENIZER_DIR ENGINE [DOCUMENTS]"""

from __future__ import annotations

import hashlib
import sys
import threading

from zephon.demo import DEMO_KINDS, generate_demo_documents
from zephon.executor.tokenize import Encoder
from zephon.specs import TokenizeSpec


def main() -> None:
    directory, engine = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    texts = [doc for kind in DEMO_KINDS for doc in generate_demo_documents(kind, count, seed=5)]
    built: list[Encoder] = []
    thread = threading.Thread(target=lambda: built.append(Encoder(TokenizeSpec(tokenizer_id=directory), engine=engine)))
    thread.start()
    thread.join()  # the thread that built the engine is gone
    encoder = built[0]
    digest = hashlib.sha256()
    for k in range(0, len(texts), 128):
        digest.update(encoder.encode_flat(texts[k : k + 128]).ids.tobytes())
    print(encoder.engine, digest.hexdigest())


if __name__ == "__main__":
    main()
