"""The recipe: datasets, mixtures, phases and budgets as configuration (what the public ``zephon.io`` and
``zephon.work`` modules export). Making a recipe lists shards through storage; nothing here plans or runs."""
