"""The write path: `outbox_context`, recording written shards, the opt-in deferred
writer, and producer models.

It sits above the models and below the backends and the engine: it never imports them.
After a commit it hands the written shards to the engine's flush, which the app config
installs when it is ready (`outbox.writes.context.install`).
"""
