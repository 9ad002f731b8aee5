"""Admin views of the backlog, of failing messages and of shard leases, with retry and
discard actions that need explicit permissions, and an outbox dashboard page.

Importing this package (Django's admin autodiscovery does) registers RegionOutbox,
ControlOutbox and ShardLease with the default admin site and lists the dashboard on
its index.
"""

from django.contrib import admin

from outbox.admin.leases import ShardLeaseAdmin, link_dashboard
from outbox.admin.outboxes import ControlOutboxAdmin, OutboxAdmin, RegionOutboxAdmin

__all__ = ["ControlOutboxAdmin", "OutboxAdmin", "RegionOutboxAdmin", "ShardLeaseAdmin"]

link_dashboard(admin.site)
