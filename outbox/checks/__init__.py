"""The app's system checks, with stable ids, registered when the app config imports this
package (`OutboxConfig.ready`):

- `outbox.checks.settings`: the ``OUTBOX_*`` values (outbox.E010 to E017, E020).
- `outbox.checks.declarations`: what the project declares and plugs in (outbox.W001/E001,
  E018, E019, E021, E022).
- `outbox.checks.relays`: each declared relay's own check (outbox.E023).
"""

from outbox.checks import declarations, relays, settings

__all__ = ["declarations", "relays", "settings"]
