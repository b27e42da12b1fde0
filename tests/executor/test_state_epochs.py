"""A loaded state and the iterations after it: a state at an epoch's end starts the next epoch whole; the state
before the next iteration is the loaded one; the iterations after the resumed one start at the plan's start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.demo_plans import texts_plan

from zephon import Pipeline
from zephon.errors import ConfigError


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("epochs")
    return texts_plan(root / "web", [f"document {i} " + "word " * (i % 13) for i in range(300)], root / "plan")


def make(plan: Path, tokenizer_dir: str) -> Pipeline:
    return (
        Pipeline.from_plan(plan)
        .tokenize(tokenizer_id=tokenizer_dir)
        .pack_flat(max_length=33)
        .batch(microbatch_size=2, global_batch_size=4)
    )


def state_after(plan: Path, tokenizer_dir: str, batches: int) -> dict:
    """The state of a pipeline that handed out ``batches`` batches."""
    pipe = make(plan, tokenizer_dir)
    it = iter(pipe)
    for _ in range(batches):
        next(it)
    return pipe.state_dict()


def rows(batches) -> list[bytes]:
    return [b.tokens.tobytes() + b.lengths.tobytes() for b in batches]


def loader_rows(loader) -> list[bytes]:
    return [t["input_ids"].numpy().tobytes() for t in loader]


def test_a_state_at_an_epochs_end_resumes_into_the_next_whole_epoch(plan: Path, tokenizer_dir: str) -> None:
    """After the last batch the state is at the run's end; loaded, the next iteration gave nothing — a Lightning
    run resumed from the checkpoint at an epoch's end skipped the next epoch without a word."""
    first = make(plan, tokenizer_dir)
    whole = rows(first)
    end = json.loads(json.dumps(first.state_dict()))
    assert end["step"] == first.num_steps() and end["microbatch"] == 0
    resumed = make(plan, tokenizer_dir)
    resumed.load_state_dict(end)
    assert rows(resumed) == whole
    expected = loader_rows(make(plan, tokenizer_dir).dataloader(return_labels=False))
    for workers in (0, 2):
        loader = make(plan, tokenizer_dir).dataloader(workers, return_labels=False)
        loader.load_state_dict(end)
        assert loader_rows(loader) == expected  # the next epoch, whole
        assert loader_rows(loader) == expected  # and the one after


def test_the_state_before_the_next_iteration_is_the_loaded_one(plan: Path, tokenizer_dir: str) -> None:
    """On a pipeline that had iterated, state_dict() after load_state_dict() gave the old iteration's position:
    a checkpoint taken between the load and the first batch skipped the batches in between."""
    early = make(plan, tokenizer_dir)
    it = iter(early)
    head = [next(it) for _ in range(3)]
    at_three = early.state_dict()
    later = make(plan, tokenizer_dir)
    it = iter(later)
    for _ in range(7):
        next(it)
    later.load_state_dict(at_three)
    assert later.state_dict() == at_three
    assert rows(head) + rows(later) == rows(make(plan, tokenizer_dir))


def test_an_iteration_begun_before_a_load_is_refused_to_go_on(plan: Path, tokenizer_dir: str) -> None:
    """The old iteration went on yielding batches 7, 8, … while state_dict() said step 3: a checkpoint then
    repeated batches on resume. It now ends at its next batch; a new iteration starts at the loaded state."""
    full = rows(make(plan, tokenizer_dir))
    full_loader = loader_rows(make(plan, tokenizer_dir).dataloader(return_labels=False))
    for kind in ("pipeline", "loader"):
        source = make(plan, tokenizer_dir)
        if kind == "loader":
            source = source.dataloader(return_labels=False)
        it = iter(source)
        for _ in range(3):
            next(it)
        at_three = source.state_dict()
        for _ in range(4):
            next(it)
        source.load_state_dict(at_three)
        with pytest.raises(
            ConfigError, match=r"^an iteration must end when load_state_dict\(\) moves the pipeline or "
        ):
            next(it)
        got = rows(source) if kind == "pipeline" else loader_rows(source)
        assert got == (full if kind == "pipeline" else full_loader)[3:]


def test_a_loaded_state_goes_on_to_the_pipeline_a_builder_call_makes(plan: Path, tokenizer_dir: str) -> None:
    """``.options(...)`` after ``load_state_dict`` dropped the state: the run restarted at step 0 silently."""
    at_three = state_after(plan, tokenizer_dir, 3)
    loaded = make(plan, tokenizer_dir)
    loaded.load_state_dict(at_three)
    assert rows(loaded.options(tokenizer_threads=1)) == rows(make(plan, tokenizer_dir))[3:]


def test_a_loaded_state_is_applied_once_by_the_next_loader_or_iteration(plan: Path, tokenizer_dir: str) -> None:
    """The pipeline's loaded state stayed for every loader made after it: a framework reloading its loader each
    epoch (Lightning's reload_dataloaders_every_n_epochs, a second Trainer.train()) resumed every epoch there."""
    at_three = state_after(plan, tokenizer_dir, 3)
    whole = loader_rows(make(plan, tokenizer_dir).dataloader(return_labels=False))
    loaded = make(plan, tokenizer_dir)
    loaded.load_state_dict(at_three)
    assert loader_rows(loaded.dataloader(return_labels=False)) == whole[3:]
    assert loader_rows(loaded.dataloader(return_labels=False)) == whole
    assert rows(loaded) == rows(make(plan, tokenizer_dir))


def test_the_pipelines_state_follows_its_loader_once_the_loader_iterates(plan: Path, tokenizer_dir: str) -> None:
    """``stats()`` followed the loader but ``state_dict()`` stayed at step 0: a checkpoint of the pipeline the
    loader was made from (``DataCheckpoint(pipeline)``) restarted the data silently on resume."""
    from zephon.integrations.dcp import DataCheckpoint

    pipe = make(plan, tokenizer_dir)
    loader = pipe.dataloader(return_labels=False)
    for k, _ in enumerate(loader):
        if k == 4:
            break
    assert pipe.state_dict() == loader.state_dict() and (
        pipe.state_dict()["step"],
        pipe.state_dict()["microbatch"],
    ) == (2, 1)
    assert json.loads(DataCheckpoint(pipe).state_dict()["zephon_state"]) == loader.state_dict()
    next(iter(pipe))  # the pipeline's own iteration is the latest again
    assert (pipe.state_dict()["step"], pipe.state_dict()["microbatch"]) == (0, 1)


@pytest.mark.parametrize(
    "options",
    [{"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": True},
     {"num_workers": 2, "multiprocessing_context": "spawn"}],
)  # fmt: skip
def test_a_torch_datasets_loaded_state_is_its_first_epochs_only(plan: Path, tokenizer_dir: str, options) -> None:
    """Every epoch of a DataLoader over ``to_torch_dataset()`` resumed at the state loaded before it: the first
    batches were skipped again in every later epoch."""
    from torch.utils.data import DataLoader

    whole = loader_rows(make(plan, tokenizer_dir).dataloader(return_labels=False))
    at_three = state_after(plan, tokenizer_dir, 3)
    loaded = make(plan, tokenizer_dir)
    loaded.load_state_dict(at_three)
    loader = DataLoader(loaded.to_torch_dataset(return_labels=False), batch_size=None, **options)
    assert loader_rows(loader) == whole[3:]
    assert loader_rows(loader) == whole


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_loaded_into_the_pipeline_after_its_loader_was_made_reaches_the_loader(
    plan: Path, tokenizer_dir: str, workers: int
) -> None:
    """A framework that builds its loader first and restores the checkpoint into the pipeline afterwards
    (Accelerate's prepare then load_state over DataCheckpoint(pipeline)) trained from step 0, and every later
    ``pipeline.state_dict()`` returned the loaded state while the loader moved on."""
    from zephon.integrations.dcp import DataCheckpoint

    whole = loader_rows(make(plan, tokenizer_dir).dataloader(return_labels=False))
    at_three = state_after(plan, tokenizer_dir, 3)
    pipe = make(plan, tokenizer_dir)
    loader = pipe.dataloader(workers, return_labels=False)
    DataCheckpoint(pipe).load_state_dict(DataCheckpoint(_Holder(at_three)).state_dict())
    got = []
    for k, item in enumerate(loader):
        got.append(item["input_ids"].numpy().tobytes())
        if k == 1:
            break
    assert got == whole[3:5]
    assert pipe.state_dict() == loader.state_dict() and pipe.state_dict() == state_after(plan, tokenizer_dir, 5)
    assert loader_rows(loader) == whole  # applied once: the next iteration starts at the plan's start
    assert loader_rows(pipe.dataloader(return_labels=False)) == whole


def test_a_state_loaded_after_to_torch_dataset_reaches_it_unless_it_iterated(plan: Path, tokenizer_dir: str) -> None:
    """The dataset took the pipeline's state when made: a state loaded after was ignored (step 0). Loaded after it
    iterated, its workers could not follow: refused in one line."""
    from torch.utils.data import DataLoader

    whole = loader_rows(make(plan, tokenizer_dir).dataloader(return_labels=False))
    at_three = state_after(plan, tokenizer_dir, 3)
    pipe = make(plan, tokenizer_dir)
    dataset = pipe.to_torch_dataset(return_labels=False)
    pipe.load_state_dict(at_three)
    assert loader_rows(DataLoader(dataset, batch_size=None, num_workers=2)) == whole[3:]
    with pytest.raises(ConfigError, match=r"^pipeline.load_state_dict\(\) must come before the to_torch_dataset\(\) "
                       r"made from this pipeline iterates, got one that has iterated .* — load the state first"):  # fmt: skip
        pipe.load_state_dict(at_three)


def test_the_pipelines_state_is_a_torch_datasets_in_process_and_refused_past_workers(
    plan: Path, tokenizer_dir: str
) -> None:
    """``DataCheckpoint(pipeline)`` while training on ``DataLoader(pipeline.to_torch_dataset())`` saved step 0 (the
    dataset's runners never reported back): a resume trained the data again from the start. In this process the
    state now follows the dataset; past DataLoader workers (whose positions run ahead of training) it is refused."""
    from torch.utils.data import DataLoader

    pipe = make(plan, tokenizer_dir)
    for k, _ in enumerate(DataLoader(pipe.to_torch_dataset(return_labels=False), batch_size=None)):
        if k == 4:
            break
    assert pipe.state_dict() == state_after(plan, tokenizer_dir, 5)
    for k, _ in enumerate(DataLoader(pipe.to_torch_dataset(return_labels=False), batch_size=None, num_workers=2)):
        if k == 4:
            break
    with pytest.raises(ConfigError, match=r"^pipeline.state_dict\(\) must follow an iteration it can see, got a "
                       r"to_torch_dataset\(\) iterated by DataLoader workers.* — checkpoint pipeline.dataloader\(\)"):  # fmt: skip
        pipe.state_dict()
    next(iter(pipe))  # an iteration of its own: seen again
    assert (pipe.state_dict()["step"], pipe.state_dict()["microbatch"]) == (0, 1)


class _Holder:
    """A source whose ``state_dict()`` is a given state (``DataCheckpoint`` packs it as a checkpoint holds it)."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state
