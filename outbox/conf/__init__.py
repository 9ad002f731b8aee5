"""The app's settings: `outbox_settings.NAME` reads ``OUTBOX_NAME``, typed and checked.

- `outbox.conf.catalogue`: every ``OUTBOX_*`` setting, its type, default and meaning.
- `outbox.conf.descriptor`: how one setting is read, checked and cached until a setting
  changes.

Their system checks are in `outbox.checks.settings`.
"""

from outbox.conf.catalogue import SETTINGS, OutboxSettings, outbox_settings
from outbox.conf.descriptor import PREFIX, Setting

__all__ = ["PREFIX", "SETTINGS", "OutboxSettings", "Setting", "outbox_settings"]
