"""The offline planner (installed as ``zephon.planner``)."""
