"""torchtitan 0.3: ZephonDataLoader built as torchtitan's trainer builds a loader (``Config.build`` with dp size,
rank, torchtitan's HuggingFaceTokenizer, seq_len, local batch size), iterated as its loop does, saved by
torchtitan's own CheckpointManager (DCP) at dp 2 under gloo, loaded at dp 1 and dp 4: the global batches after
the resume are those of an uninterrupted run. Bad input (another plan or tokenizer, a dp size that does not
split the global batch, a torchtitan loader's own state, a torchtitan outside the tested range): one line each."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

pytest.importorskip(
    "torchtitan",
    reason="torchtitan is not installed: pip install 'zephon[torchtitan]' (CI: pip install --no-deps torchtitan==0.3.0)",
)

import torch
import torch.multiprocessing as mp
from support.integration_runs import GLOBAL, make_plan
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from zephon.errors import ConfigError
from zephon.integrations.state_text import KEY
from zephon.integrations.torchtitan import ZephonDataLoader

SEQ_LEN = 32
SAVE_STEP = 3  # torchtitan counts steps from 1: the checkpoint after its 3rd step
#: dp size → torchtitan's local_batch_size (microbatches per step: GLOBAL / (local × dp))
LOCAL = {1: 4, 2: 2, 4: 2}


def build(plan: Path, tokenizer_dir: str, *, world: int = 1, rank: int = 0, local: int = 4, **config) -> ZephonDataLoader:
    """The loader as torchtitan's Trainer builds ``config.dataloader``."""
    tokenizer = HuggingFaceTokenizer.Config().build(tokenizer_path=tokenizer_dir)
    return ZephonDataLoader.Config(plan=str(plan), global_batch_size=GLOBAL, **config).build(
        dp_world_size=world, dp_rank=rank, tokenizer=tokenizer, seq_len=SEQ_LEN, local_batch_size=local,
        snapshot_every_n_steps=1,
    )  # fmt: skip


def rows(batch) -> list[bytes]:
    """Each row of a torchtitan batch ``({"input", "positions"}, labels)``: its input, positions and labels."""
    inputs, labels = batch
    return [
        inputs["input"][i].numpy().tobytes() + inputs["positions"][i].numpy().tobytes() + labels[i].numpy().tobytes()
        for i in range(labels.shape[0])
    ]


def steps_of(loader: ZephonDataLoader, per_step: int, first: int, last: int | None = None) -> dict[int, list[bytes]]:
    """torchtitan's loop: one iterator for the run, ``per_step`` microbatches a step (steps counted from 1);
    step → its rows, stopping after ``last`` or when the data runs out (a step cut short is not trained)."""
    batches = iter(loader)
    out: dict[int, list[bytes]] = {}
    step = first
    while last is None or step <= last:
        taken = [next(batches, None) for _ in range(per_step)]
        if any(b is None for b in taken):
            break
        out[step] = [r for b in taken for r in rows(b)]
        step += 1
    return out


class TrainState:
    """The trainer's own ``train_state`` entry (its step), as torchtitan's Trainer saves itself."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def titan_rank(rank: int, world: int, mode: str, plan: str, tokenizer_dir: str, root: str) -> None:
    """One dp rank under gloo: ``save`` trains ``SAVE_STEP`` steps and lets torchtitan's CheckpointManager save;
    ``load`` lets it load the latest checkpoint at this dp size and writes every later step's rows."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["ZEPHON_READ_AHEAD"] = "off"
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{root}/pg-{mode}-{world}", rank=rank, world_size=world)
    try:
        local = LOCAL[world]
        loader = build(Path(plan), tokenizer_dir, world=world, rank=rank, local=local)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train = TrainState()
        checkpointer = CheckpointManager.Config(enable=True, interval=SAVE_STEP).build(
            dataloader=loader, model_parts=[model], optimizers=optimizer,
            lr_schedulers=torch.optim.lr_scheduler.ConstantLR(optimizer), states={"train_state": train},
            sd_adapter=None, base_folder=f"{root}/dump",
        )  # fmt: skip
        checkpointer.load()  # torchtitan's Trainer.train: a fresh start, or the latest checkpoint
        per_step = GLOBAL // (local * world)
        if mode == "save":
            assert train.step == 0
            batches = iter(loader)
            for step in range(1, SAVE_STEP + 1):
                for _ in range(per_step):
                    next(batches)
                train.step = step
                checkpointer.save(step)  # the checkpoint of step 3 (interval 3)
        else:
            assert train.step == SAVE_STEP
            out = Path(root) / f"out-{world}"
            out.mkdir(exist_ok=True)
            taken = steps_of(loader, per_step, SAVE_STEP + 1)
            (out / f"rank-{rank}.pkl").write_bytes(pickle.dumps(taken))
        checkpointer.close()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tokenizer_dir) -> Path:
    return make_plan(tmp_path_factory.mktemp("titan"), tokenizer_dir, documents=160)


def test_a_checkpoint_saved_by_torchtitan_at_dp_2_resumes_at_dp_1_and_4_with_the_uninterrupted_global_batches(
    plan, tokenizer_dir, tmp_path
) -> None:
    whole = steps_of(build(plan, tokenizer_dir, local=4), 2, 1)  # dp 1: 2 microbatches of 4 rows a step
    assert len(whole) > SAVE_STEP + 3
    args = (2, "save", str(plan), tokenizer_dir, str(tmp_path))
    mp.start_processes(titan_rank, args=args, nprocs=2, start_method="fork")
    assert (tmp_path / "dump" / "checkpoint" / f"step-{SAVE_STEP}").is_dir()
    for world in (1, 4):
        args = (world, "load", str(plan), tokenizer_dir, str(tmp_path))
        mp.start_processes(titan_rank, args=args, nprocs=world, start_method="fork")
        resumed: dict[int, list[bytes]] = {}
        for rank in range(world):
            for step, got in pickle.loads((tmp_path / f"out-{world}" / f"rank-{rank}.pkl").read_bytes()).items():
                resumed.setdefault(step, []).extend(got)
        assert sorted(resumed) == list(range(SAVE_STEP + 1, max(whole) + 1)), f"dp {world}"
        for step, got in resumed.items():
            assert len(got) == GLOBAL and sorted(got) == sorted(whole[step]), f"step {step} at dp {world}"


def test_the_state_is_one_json_value_and_a_one_process_resume_continues_exactly(plan, tokenizer_dir) -> None:
    whole = steps_of(build(plan, tokenizer_dir), 2, 1)
    loader = build(plan, tokenizer_dir)
    assert steps_of(loader, 2, 1, last=2) == {1: whole[1], 2: whole[2]}
    saved = loader.state_dict()
    assert list(saved) == [KEY] and isinstance(saved[KEY], str)
    again = build(plan, tokenizer_dir, num_workers=2)
    again.load_state_dict(saved)
    assert steps_of(again, 2, 3) == {s: r for s, r in whole.items() if s >= 3}
    assert again.num_steps() == len(whole)


def test_batches_are_torchtitans_inputs_positions_and_labels(plan, tokenizer_dir) -> None:
    inputs, labels = next(iter(build(plan, tokenizer_dir)))
    assert sorted(inputs) == ["input", "positions"]
    assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (4, SEQ_LEN)
    assert torch.equal(inputs["input"][:, 1:], labels[:, :-1])  # labels: the inputs shifted by one
    assert inputs["positions"][0, :5].tolist() == [0, 1, 2, 3, 4]
    plain, _ = next(iter(build(plan, tokenizer_dir, positions=False)))
    assert sorted(plain) == ["input"]


def test_a_checkpoint_of_another_plan_or_tokenizer_is_refused_in_one_line(plan, tokenizer_dir, tmp_path_factory) -> None:
    other = make_plan(tmp_path_factory.mktemp("other"), tokenizer_dir, documents=160, seed=6)
    with pytest.raises(ConfigError, match=r"^pipeline state must come from the same plan, tokenizer and packing, got a different plan \(config_hash\)[^\n]* — resume with the pipeline that saved it, or start fresh$"):
        build(plan, tokenizer_dir).load_state_dict(build(other, tokenizer_dir).state_dict())
    changed = tmp_path_factory.mktemp("tokenizer") / "demo-less-one-merge"
    shutil.copytree(tokenizer_dir, changed)
    spec = json.loads((changed / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["merges"].pop()  # another tokenizer: its last merge gone
    (changed / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^pipeline state must come from the same plan, tokenizer and packing, got a different tokenizer fingerprint [^\n]*start fresh$"):
        build(plan, str(changed)).load_state_dict(build(plan, tokenizer_dir).state_dict())


def test_a_dp_size_that_does_not_split_the_global_batch_is_refused_in_one_line(plan, tokenizer_dir) -> None:
    with pytest.raises(ConfigError, match=r"^ZephonDataLoader's global batch of 8 sequences must split into microbatches of local_batch_size 2 on each of dp_world_size 3 ranks, got 8 / \(2 × 3\) not whole — use a dp size and local_batch_size whose product divides 8 \(or change global_batch_size\)$"):
        build(plan, tokenizer_dir, world=3, local=2)
    state = build(plan, tokenizer_dir).state_dict()
    with pytest.raises(ConfigError, match=r"^the torchtitan checkpoint's dataloader state: a state's dp_size must divide its global batch of 8 sequences, got dp_size 3 — "):
        build(plan, tokenizer_dir).load_state_dict({KEY: json.dumps({**json.loads(state[KEY]), "dp_size": 3})})


def test_a_torchtitan_loaders_own_state_and_a_missing_plan_or_foreign_tokenizer_are_refused_in_one_line(plan, tokenizer_dir) -> None:
    loader = build(plan, tokenizer_dir)
    with pytest.raises(ConfigError, match=r"^the torchtitan checkpoint's dataloader state must be a ZephonDataLoader's \{'zephon_state': …\}, got a torchtitan loader's per-rank state \['dp_rank_0', 'world_size'\] — "):
        loader.load_state_dict({"dp_rank_0": b"", "world_size": 2})
    with pytest.raises(ConfigError, match=r"^ZephonDataLoader.Config.plan must name a plan bundle directory, got '' — "):
        ZephonDataLoader.Config().build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ_LEN, local_batch_size=4)
    with pytest.raises(ConfigError, match=r"^ZephonDataLoader's tokenizer must be torchtitan's HuggingFaceTokenizer \(its tokenizer_path is what Zephon encodes with\), got NoneType — "):
        ZephonDataLoader.Config(plan=str(plan)).build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ_LEN, local_batch_size=4)


def test_a_torchtitan_version_outside_the_tested_range_is_refused_in_one_line() -> None:
    from zephon.integrations.versions import require_tested

    with pytest.raises(ConfigError, match=r"^torchtitan must be in the range zephon.integrations was tested with \(>=0.3,<0.4\), got 0.2.1 — pip install 'torchtitan>=0.3,<0.4'$"):
        require_tested("torchtitan", "0.2.1")


def test_the_config_takes_torchtitans_command_line_overrides_and_refuses_a_bad_global_batch() -> None:
    import tyro

    config = tyro.cli(ZephonDataLoader.Config, args=["--plan", "plans/run", "--global-batch-size", "64", "--num-workers", "2"], default=ZephonDataLoader.Config())
    assert (config.plan, config.global_batch_size, config.num_workers, config.positions) == ("plans/run", 64, 2, True)
    with pytest.raises(ConfigError, match=r"^ZephonDataLoader.Config.global_batch_size must be -1 or an integer ≥ 1, got 0 — pass torchtitan's training.global_batch_size$"):
        ZephonDataLoader.Config(plan="plans/run", global_batch_size=0)


def test_more_workers_than_the_ranks_lanes_are_refused_in_one_line(plan, tokenizer_dir) -> None:
    with pytest.raises(ConfigError, match=r"^num_workers must split this rank's 4 packing lanes [^\n]*, got 8 — use num_workers in \[1, 2, 3, 4\][^\n]*$"):
        build(plan, tokenizer_dir, world=2, local=4, num_workers=8)


@pytest.mark.parametrize("local", [0, -2, 2.0])
def test_a_local_batch_size_that_is_not_a_positive_integer_is_refused_in_one_line(plan, tokenizer_dir, local) -> None:
    with pytest.raises(ConfigError, match=rf"^ZephonDataLoader's local_batch_size must be an integer ≥ 1 \(rows per microbatch\), got {local} — set torchtitan's training.local_batch_size to 1 or more$"):
        build(plan, tokenizer_dir, local=local)


def test_a_state_at_another_global_batch_names_global_batch_size_when_it_was_left_at_minus_1(plan, tokenizer_dir) -> None:
    """With ``global_batch_size=-1`` the global batch follows ``local_batch_size × dp``: a resume at another dp
    size was refused as "another packing", naming no fix; the fix is the config's ``global_batch_size``."""
    tokenizer = HuggingFaceTokenizer.Config().build(tokenizer_path=tokenizer_dir)

    def made(world: int, local: int, **config) -> ZephonDataLoader:
        return ZephonDataLoader.Config(plan=str(plan), **config).build(
            dp_world_size=world, dp_rank=0, tokenizer=tokenizer, seq_len=SEQ_LEN, local_batch_size=local
        )  # fmt: skip

    loader = made(1, 4)
    batches = iter(loader)
    next(batches)
    saved = loader.state_dict()
    with pytest.raises(ConfigError, match=r"^the torchtitan checkpoint's dataloader state must be at this run's global "
                       r"batch of 8 sequences \(local_batch_size × dp, global_batch_size left at -1\), got one of 4 — "
                       r"pass ZephonDataLoader.Config\(global_batch_size=4\)"):  # fmt: skip
        made(2, 4).load_state_dict(saved)
    resumed = made(2, 2, global_batch_size=4)  # the fix: the same 4 sequences a step, 2 on each of 2 ranks
    resumed.load_state_dict(saved)
    assert rows(next(iter(resumed))) == steps_of(made(2, 2, global_batch_size=4), 1, 1, last=2)[2]
