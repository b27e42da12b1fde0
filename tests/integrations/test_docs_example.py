"""docs/training.md's Trainers section runs as written: its Python blocks, in order, in one namespace (the
torchtitan block in a test of its own, skipped without torchtitan)."""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def trainer_blocks() -> list[str]:
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = text.split("## Trainers: DCP, torchdata, Lightning, Hugging Face, torchtitan", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run_blocks(blocks: list[str]) -> None:
    namespace: dict[str, object] = {"__name__": "trainers_example"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for block in blocks:
            exec(compile(block, "docs/training.md", "exec"), namespace)


def test_the_trainers_examples_run_as_written(tmp_path, monkeypatch) -> None:
    blocks = trainer_blocks()
    assert len(blocks) == 6 and "torchtitan" in blocks[5]
    monkeypatch.chdir(tmp_path)
    run_blocks(blocks[:5])
    assert (tmp_path / "hf-run" / "checkpoint-3" / "zephon_state.json").is_file()


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed: pip install 'zephon[torchtitan]'")
def test_the_torchtitan_example_runs_as_written(tmp_path, monkeypatch) -> None:
    blocks = trainer_blocks()
    monkeypatch.chdir(tmp_path)
    run_blocks([blocks[0], blocks[5]])
    assert (tmp_path / "titan-ckpt" / "step-3" / ".metadata").is_file()
