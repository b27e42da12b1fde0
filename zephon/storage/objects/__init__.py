"""Object stores (``s3://``, ``gs://``, ``az://``): listing, footers by range requests, pinned reads."""
