"""``zephon tokenize``: raw datasets written once as Megatron-compatible token stores, one prefix per shard."""
