"""The Hugging Face Hub backend: ``hf://`` paths (``paths``), repository discovery (``discovery``) and the
client that pins, lists and reads remote files (``client``)."""
