"""Benchmark harness of django-outboxes: `python -m bench` (see bench/README.md).

The package is also the tiny Django app the benchmark runs against (`bench.settings`):
a model for the write-overhead test, its own outbox scopes and categories, and
trivial receivers that only count their calls.
"""
