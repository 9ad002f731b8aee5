"""The backfill bench: `python -m bench.backfill --db postgres|mariadb|sqlite`. See
`bench/backfill/__main__.py` and bench/README.md ("Backfill")."""
