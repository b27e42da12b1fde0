"""examples/train_sft.py on a local alpaca-style copy: the loss covers the answers only and goes down."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from support.chat_data import build_tokenizer, write_parquet

REPO = Path(__file__).resolve().parents[1]


def test_sft_example_trains_on_a_local_alpaca_copy(tmp_path, capsys) -> None:
    rows = [
        {"instruction": f"Name the number after {i}.", "input": "" if i % 3 else "Use digits.", "output": f"{i + 1}."}
        for i in range(80)
    ]
    data = write_parquet(tmp_path / "alpaca", rows)  # the columns of hf://yahma/alpaca-cleaned@~parquet/train
    tok = build_tokenizer(tmp_path / "tok")
    spec = importlib.util.spec_from_file_location("train_sft", REPO / "examples" / "train_sft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    losses = module.main(
        [
            "--data",
            str(data),
            "--tokenizer",
            str(tok),
            "--steps",
            "8",
            "--max-length",
            "65",
            "--workdir",
            str(tmp_path / "work"),
        ]
    )
    assert len(losses) == 8
    assert losses[-1] < losses[0]
    out = capsys.readouterr().out
    assert "step 7: loss" in out and "training on" in out
