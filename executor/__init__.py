"""The executor that runs inside every training rank (installed as ``zephon.executor``)."""
