"""Zephon inside the trainers people use, with one rank-independent state (docs/training.md, Trainers).

Each module imports its framework only when imported itself:

* ``dcp`` — ``DataCheckpoint``: a ``torch.distributed.checkpoint`` ``Stateful`` holding the merged state under
  one key (DCP writes non-tensor values from rank 0 only), also what ``accelerator.register_for_checkpointing``
  takes;
* ``torchdata`` — ``stateful_loader``: ``Pipeline.dataloader`` behind the ``StatefulDataLoader`` protocol;
* ``lightning`` — ``ZephonDataModule``: a ``LightningDataModule`` whose state rides in Lightning's checkpoint;
* ``hf`` — ``ZephonTrainer``: a Hugging Face ``Trainer`` that trains on the pipeline and checkpoints its state;
* ``torchtitan`` — ``ZephonDataLoader``: torchtitan's ``BaseDataLoader`` over a plan, one state for any dp size;
* ``consumed`` — the state after the batches training took, not the ones a framework fetched ahead;
* ``versions`` — the framework versions each module was tested with (others refused in one line).
"""
