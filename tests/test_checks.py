from outbox.checks import check_receivers
from outbox.signals import process_region_outbox
from tests.testapp.categories import Category
from tests.testapp.receivers import record


def test_every_category_has_a_receiver():
    assert check_receivers() == []


def test_category_without_receiver_is_an_error():
    process_region_outbox.disconnect(record, sender=Category.AUDIT_EVENT)
    try:
        errors = check_receivers()
    finally:
        process_region_outbox.connect(record, sender=Category.AUDIT_EVENT)
    assert [error.id for error in errors] == ["outbox.E001"]
    assert "Category.AUDIT_EVENT" in errors[0].msg
