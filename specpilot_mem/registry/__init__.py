"""``registry.duckdb``: the queryable index of the memory (schema, sync, queries, suggestions).

The YAML records under ``entries/`` and ``rounds/`` are the source of truth; the registry can always be
rebuilt from them (``specpilot-mem registry rebuild``). Readers call :func:`connect`, which syncs first
when a record changed and returns a read-only DuckDB connection.
"""
