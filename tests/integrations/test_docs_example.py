"""docs/training.md's Trainers section runs as written: its Python blocks, in order, in one namespace."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def trainer_blocks() -> list[str]:
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = text.split("## Trainers: DCP, torchdata, Lightning, Hugging Face", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_trainers_examples_run_as_written(tmp_path, monkeypatch) -> None:
    blocks = trainer_blocks()
    assert len(blocks) == 5
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "trainers_example"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for block in blocks:
            exec(compile(block, "docs/training.md", "exec"), namespace)
    assert (tmp_path / "hf-run" / "checkpoint-3" / "zephon_state.json").is_file()
