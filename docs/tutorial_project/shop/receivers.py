from django.dispatch import receiver

from outbox.signals import process_region_outbox
from shop.outboxes import Category


@receiver(process_region_outbox, sender=Category.ORGANIZATION_UPDATE)
def sync_organization(object_identifier, shard_identifier, payload, **kwargs):
    # Delivery is at least once: doing this twice must do no harm.
    print(f"organization {object_identifier} is now called {payload['name']!r}")
