"""Continuations: a child plan whose first N global steps are its parent's."""
