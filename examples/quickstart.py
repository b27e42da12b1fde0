"""The documented API's first README example, with the dataset and tokenizer swapped for Zephon's embedded demo.

The demo dataset (written on first use into ~/.cache/zephon/demo-data, or $ZEPHON_DEMO_DIR, from the texts
shipped in the package) and the demo tokenizer (shipped too) make this run offline. Everything else is the
documented snippet unchanged.
"""

from zephon import Pipeline
from zephon.demo import demo_dataset_path, demo_tokenizer_path
from zephon.io import Dataset
from zephon.specs import CacheOptions, StoreOptions
from zephon.work import MixtureSpec, StaticMixtureWorkSource

dataset = Dataset.from_path("fineweb_edu", demo_dataset_path())
work_source = StaticMixtureWorkSource(
    datasets=[dataset],
    mixture=MixtureSpec({"fineweb_edu": 1.0}),
    seed=42,
)
cache = CacheOptions(enabled=True, root="/tmp/zephon-cache", limit_bytes=50 << 30)  # 50 GiB

pipeline = (
    Pipeline(work_source)
    .options(io_options=StoreOptions(cache=cache))
    .tokenize(tokenizer_id=demo_tokenizer_path(), field="text")
    .pack_flat(max_length=2049, algorithm="wrap")
    .batch(microbatch_size=8)
)

for batch in pipeline:
    tensors = batch.to_training(return_labels=True)
    print(tensors["input_ids"].shape, tensors["labels"].shape)  # (8, 2048) (8, 2048)
    break
