"""``zephon.io``: the documented API's datasets and storage options.

``Dataset`` is the recipe's dataset (``zephon.recipe.dataset``: local paths, globs, files and ``hf://``
paths); ``CacheOptions`` and ``StoreOptions`` are stage settings (``zephon.specs``).
"""

from zephon.recipe.dataset import Dataset
from zephon.specs import CacheOptions, StoreCredentials, StoreOptions

__all__ = ["CacheOptions", "Dataset", "StoreCredentials", "StoreOptions"]
