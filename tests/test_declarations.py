"""Declaration mistakes fail at import (or connect) time, naming both sides and the fix."""

import enum
import re

import pytest

from outbox import OutboxCategory, OutboxScope, transactional_receiver
from outbox.categories import registry
from outbox.exceptions import OutboxConfigurationError
from outbox.signals import process_control_outbox, process_region_outbox
from tests.testapp.categories import Category, Scope

pytestmark = pytest.mark.usefixtures("scratch_registry")


def categories(module, name="Category", **members):
    """A category enum declared as if in `module` (another app's outboxes.py)."""
    return OutboxCategory(name, members, module=module, qualname=name)


def test_two_category_members_with_one_value_are_refused_naming_both():
    # Python would make DELETED an alias of CREATED, and DELETED would vanish.
    with pytest.raises(OutboxConfigurationError) as caught:

        class Events(OutboxCategory):
            CREATED = 7001
            DELETED = 7001

    message = str(caught.value)
    assert "Events.DELETED = 7001 repeats the value of" in message
    assert "Events.CREATED" in message
    assert "alias" in message and "silently dropped" in message
    assert "Give " in message and "a value of its own" in message


def test_two_scope_members_with_one_value_are_refused_before_registering():
    # The second member's categories would otherwise be dropped without a word.
    kinds = categories("app_one.outboxes", "Kinds", A=7011, B=7012)
    with pytest.raises(
        OutboxConfigurationError,
        match=re.escape("Places.SECOND = 7010 repeats the value of Places.FIRST"),
    ):

        class Places(OutboxScope):
            FIRST = 7010, {kinds.A}
            SECOND = 7010, {kinds.B}

    assert 7010 not in registry.scopes
    assert 7011 not in registry.categories


def test_category_values_colliding_across_apps_are_refused_before_any_scope_lists_them():
    billing = categories("billing.outboxes", INVOICE_UPDATE=7021)
    with pytest.raises(OutboxConfigurationError) as caught:
        categories("crm.outboxes", CONTACT_UPDATE=7022, CLASH=7021)
    message = str(caught.value)
    # Not "declared in two scopes": IntEnum members of two enums with one value compare
    # equal.
    assert "two scopes" not in message
    assert "Category value 7021 is declared twice" in message
    assert "billing.outboxes.Category.INVOICE_UPDATE" in message
    assert "crm.outboxes.Category.CLASH" in message
    assert "unique across the project" in message
    assert "Give one of them another value" in message
    assert registry.declared[7021] is billing.INVOICE_UPDATE
    assert 7022 not in registry.declared  # nothing half-declared


def test_scope_values_colliding_across_apps_name_both_declarations():
    billing = categories("billing.outboxes", INVOICE_UPDATE=7031)
    crm = categories("crm.outboxes", CONTACT_UPDATE=7032)
    OutboxScope("Scope", {"INVOICE": (7030, {billing.INVOICE_UPDATE})}, module="billing.outboxes")
    with pytest.raises(OutboxConfigurationError) as caught:
        OutboxScope("Scope", {"CONTACT": (7030, {crm.CONTACT_UPDATE})}, module="crm.outboxes")
    message = str(caught.value)
    assert "Scope value 7030 is declared twice" in message
    assert "billing.outboxes.Scope.INVOICE" in message
    assert "crm.outboxes.Scope.CONTACT" in message
    assert "Give one of them another value" in message
    assert 7032 not in registry.categories


def test_a_collision_with_the_projects_own_declarations_suggests_a_free_value():
    with pytest.raises(OutboxConfigurationError) as caught:
        categories("stray.outboxes", COPY=Category.ORGANIZATION_UPDATE.value)
    message = str(caught.value)
    assert "tests.testapp.categories.Category.ORGANIZATION_UPDATE" in message
    assert f"for instance {max(registry.declared) + 1}" in message


def test_the_same_declaration_imported_twice_says_so():
    categories("shop.outboxes", ORDER_UPDATE=7051)
    with pytest.raises(OutboxConfigurationError, match="imported under two names"):
        categories("shop.outboxes", ORDER_UPDATE=7051)


def test_a_category_in_two_scopes_names_both_scopes_and_the_fix():
    shared = categories("shop.outboxes", SHARED=7061)
    with pytest.raises(OutboxConfigurationError) as caught:
        OutboxScope("Scope", {"LEFT": (7060, {shared.SHARED}), "RIGHT": (7062, {shared.SHARED})})
    message = str(caught.value)
    assert "Category.SHARED is declared in two scopes: Scope.LEFT and Scope.RIGHT" in message
    assert "remove it from one of them" in message
    assert 7060 not in registry.scopes  # the whole enum is refused


def test_a_scope_listing_a_plain_int_names_the_scope_and_the_fix():
    with pytest.raises(OutboxConfigurationError) as caught:
        OutboxScope("Scope", {"LOOSE": (7070, {7071})}, module="loose.outboxes")
    message = str(caught.value)
    assert "loose.outboxes.Scope.LOOSE lists 7071" in message
    assert "not an OutboxCategory member" in message
    assert "LOOSE = 7070, {Category.SOME_UPDATE}" in message


def sync_org(**kwargs):
    """A receiver connected with a wrong sender."""


@pytest.mark.parametrize(
    ("sender", "shown", "suggested"),
    [
        pytest.param(1, "sender=1 (int)", "Category.ORGANIZATION_UPDATE", id="plain-int"),
        pytest.param(
            enum.IntEnum("Foreign", {"THING": 1}).THING,
            "sender=<Foreign.THING: 1> (Foreign)",
            "Category.ORGANIZATION_UPDATE",
            id="foreign-enum",
        ),
        pytest.param("org", "sender='org' (str)", "Category.SOME_UPDATE", id="string"),
        pytest.param(5, "sender=5 (int)", "Category.SOME_UPDATE", id="unknown-int"),
    ],
)
def test_a_receiver_connected_with_a_non_category_sender_is_refused(sender, shown, suggested):
    with pytest.raises(OutboxConfigurationError) as caught:
        process_region_outbox.connect(sync_org, sender=sender)
    message = str(caught.value)
    assert f"Receiver {__name__}.sync_org is connected to process_region_outbox" in message
    assert shown in message
    assert "not an OutboxCategory member" in message
    assert f"@receiver(process_region_outbox, sender={suggested})" in message
    assert not process_region_outbox.disconnect(sync_org, sender=sender)  # never connected


def test_the_receiver_decorator_and_the_control_signal_refuse_it_too():
    from django.dispatch import receiver

    with pytest.raises(OutboxConfigurationError, match="connected to process_control_outbox"):
        receiver(process_control_outbox, sender=3)(sync_org)
    with pytest.raises(OutboxConfigurationError, match="sender=3 "):
        transactional_receiver(process_region_outbox, sender=3)(sync_org)  # type: ignore[arg-type]


def test_a_receiver_without_sender_receives_every_category():
    process_region_outbox.connect(sync_org, weak=False)
    try:
        assert process_region_outbox.has_listeners(Category.USER_UPDATE)
    finally:
        process_region_outbox.disconnect(sync_org)


def test_a_category_member_is_accepted_even_before_its_scope_is_declared():
    late = categories("late.outboxes", LATE_UPDATE=7081)
    process_region_outbox.connect(sync_org, sender=late.LATE_UPDATE, weak=False)
    try:
        assert process_region_outbox.has_listeners(late.LATE_UPDATE)
    finally:
        process_region_outbox.disconnect(sync_org, sender=late.LATE_UPDATE)


def test_the_projects_own_declarations_are_registered():
    assert registry.scope_of(Category.LEDGER_ENTRY) is Scope.ORGANIZATION
