"""The paths migrations name for the `message_id` column's defaults (the app's own, and
those of a project's outbox tables): `outbox.columns.new_message_id` and
`outbox.columns.RandomUUID`. They are made with the outbox model, in
`outbox.models.outbox`; this module keeps the paths written into migrations importable."""

from outbox.models.outbox import RandomUUID, new_message_id

__all__ = ["RandomUUID", "new_message_id"]
