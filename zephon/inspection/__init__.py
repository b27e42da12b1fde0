"""Inspection of plan bundles: SQL views (``sql``, ``views``), steps (``steps``), ``show``, mixture audits
(``audit``), plan diffs (``diff``) and provenance-log checks (``log_check``). Read-only; DuckDB-based."""
