from django.db import router, transaction

from outbox import outbox_context
from outbox.models import RegionOutbox
from shop.models import Organization
from shop.outboxes import Category, Scope


def rename(organization, name, *, flush=True):
    """Rename `organization` and announce it, in one transaction.

    With flush=True the message is delivered right after the commit; with flush=False
    it waits for `manage.py drain_outboxes`.
    """
    using = router.db_for_write(Organization)
    with outbox_context(transaction.atomic(using=using), flush=flush):
        organization.name = name
        organization.save()
        RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=organization.id,
            category=Category.ORGANIZATION_UPDATE,
            object_identifier=organization.id,
            payload={"name": organization.name},
        ).save()
