"""Chat test material: a tiny byte-level BPE tokenizer with chat special tokens, three real templates, and
deterministic conversations written as JSONL or Parquet."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>"]

#: ChatML without generation tags: the mask comes from prefix diffing.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: ChatML with {% generation %} tags around each assistant reply and its end-of-turn token.
CHATML_TAGGED = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: A Llama-2-like template with no tags and no generation prompt: prefix diffing again, end-of-turn ``</s>``.
INST = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}<<SYS>>{{ m.content }}<</SYS>>"
    "{% elif m.role == 'user' %}[INST] {{ m.content }} [/INST]{% else %} {{ m.content }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)
#: A template that rewrites earlier turns when more follow: no tags and no consistent prefixes.
UNDIFFABLE = "{% for m in messages %}{{ m.role }}:{{ m.content }}({{ messages | length }})\n{% endfor %}"

WORDS = [
    "the",
    "a",
    "model",
    "data",
    "token",
    "train",
    "loss",
    "mask",
    "chat",
    "user",
    "reply",
    "helpful",
    "answer",
    "question",
    "why",
    "how",
    "42",
    "7",
    "café",
]


def build_tokenizer(directory: Path, *, template: str = CHATML, eos: str = "<|im_end|>") -> Path:
    """Train a ~600-token byte-level BPE on the test vocabulary, save it with ``template`` as its chat template."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [" ".join(random.Random(i).choices(WORDS, k=30)) for i in range(400)]
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": eos, "pad_token": "<|endoftext|>", "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def conversation(seed: int) -> list[dict[str, str]]:
    """A deterministic conversation: maybe a system turn, then 1-3 user/assistant exchanges."""
    rng = random.Random(seed)

    def say(k: int) -> str:
        return " ".join(rng.choices(WORDS, k=k)).capitalize() + rng.choice([".", "?", "!"])

    messages = [{"role": "system", "content": say(4)}] if rng.random() < 0.4 else []
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": say(rng.randint(2, 12))})
        messages.append({"role": "assistant", "content": say(rng.randint(1, 20))})
    return messages


def write_jsonl(directory: Path, rows: list[dict], *, shards: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // shards)
    for s in range(shards):
        lines = [json.dumps(r) for r in rows[s * per : (s + 1) * per]]
        (directory / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def write_parquet(directory: Path, rows: list[dict], *, shards: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // shards)
    for s in range(shards):
        pq.write_table(
            pa.Table.from_pylist(rows[s * per : (s + 1) * per]), directory / f"part-{s}.parquet", row_group_size=8
        )
    return directory
