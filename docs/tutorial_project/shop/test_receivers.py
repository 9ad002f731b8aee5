import pytest

from shop.models import Organization
from shop.outboxes import Category
from shop.services import rename


@pytest.mark.django_db
def test_the_receiver_sees_the_new_name(
    outbox_messages, django_capture_on_commit_callbacks, capsys
):
    acme = Organization.objects.create(name="Acme")
    with django_capture_on_commit_callbacks(execute=True):
        rename(acme, "Acme Corporation")
    assert capsys.readouterr().out == f"organization {acme.id} is now called 'Acme Corporation'\n"
    outbox_messages.assert_sent_once(
        Category.ORGANIZATION_UPDATE,
        object_identifier=acme.id,
        payload={"name": "Acme Corporation"},
    )


@pytest.mark.django_db
def test_nothing_is_sent_without_a_rename(outbox_messages):
    Organization.objects.create(name="Acme")
    outbox_messages.assert_nothing_sent()
