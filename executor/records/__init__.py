"""Records: samples that are not text (images and captions, audio, features), read, transformed and collated —
never encoded (docs/records.md). A pipeline without ``.tokenize()`` runs ``RecordRunner``."""
