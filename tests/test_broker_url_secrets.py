"""A broker URL is never shown with its secrets: the system check of an AMQP or Redis
relay whose URL is malformed says what is wrong without the password or the query, and
so does the error a drain records and logs when the relay cannot read its URL
(security review, issue 49, finding 6)."""

import logging

import pytest
from django.core.checks import run_checks

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from outbox.relays import AmqpRelay, RedisStreamRelay
from outbox.relays.broker_urls import shown_url
from tests.conftest import committing
from tests.relay_helpers import write
from tests.testapp.categories import Category

# Secrets the URLs below carry: none of them may appear in what is shown.
SECRETS = ("s3cret", "Xpw1", "Ypw2", "qs3cret")

AMQP_URLS = [
    ("amqp://user:s3cret@host:notaport/", "port is not a number"),
    ("amqp://user:s3cret@host:99999/", "port is not a number"),
    ("http://user:s3cret@host/", "is not an AMQP URL: it must start with amqp://"),
    ("kafka://user:s3cret@host/vh?x=qs3cret", "is not an AMQP URL"),
    ("amqp://user:s3cret@[::1/", "does not parse as a URL"),
    ("amqp://user:s3cret@[host]/", "does not parse as a URL"),
    # A password holding '/', '?' or ';' (not percent-encoded) ends up read as the port.
    ("amqp://user:s3cret/x@host/", "port is not a number"),
    ("amqp://user:s3cret?x@host/", "port is not a number"),
    ("amqp://user:Xpw1;Ypw2@host/", "(fail-over URL 1 of 2) does not parse"),
    ("amqp://guest@h//;redis://user:s3cret@host/?key=qs3cret", "(fail-over URL 2 of 2) is not"),
    ("pyamqp://u:s3cret@host:notaport/?token=qs3cret", "port is not a number"),
]

REDIS_URLS = [
    ("redis://user:s3cret@host:notaport/0", "port is not a number"),
    ("redis://user:s3cret@host:99999/0", "port is not a number"),
    ("http://user:s3cret@host/0", "is not a Redis URL: it must start with redis://"),
    ("redis://user:s3cret@[::1/0", "does not parse as a URL"),
    ("redis://user:s3cret/x@host/0", "port is not a number"),
    ("redis://:s3cret@host/0?socket_timeout=abc&password=qs3cret", "query argument"),
]


def assert_no_secret(text):
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown in {text!r}"


@pytest.mark.parametrize(("url", "problem"), AMQP_URLS)
def test_an_amqp_check_says_what_is_wrong_without_the_secrets(url, problem):
    [error] = AmqpRelay("broker", url=url).check()
    assert_no_secret(error.msg)
    assert error.msg.startswith("Relay 'broker': url ")
    assert problem in error.msg


@pytest.mark.parametrize(("url", "problem"), REDIS_URLS)
def test_a_redis_check_says_what_is_wrong_without_the_secrets(url, problem):
    [error] = RedisStreamRelay("cache", url=url).check()
    assert_no_secret(error.msg)
    assert error.msg.startswith("Relay 'cache': url ")
    assert problem in error.msg


def test_the_checks_of_connected_relays_show_the_url_without_credentials_or_query():
    relays = [
        AmqpRelay("bad-amqp", url="http://user:s3cret@rabbit:5672/vh?x=qs3cret"),
        RedisStreamRelay("bad-redis", url="redis://:s3cret@cache:notaport/2"),
    ]
    for relay in relays:
        relay.connect(Category.AUDIT_EVENT)
    try:
        texts = [error.msg for error in run_checks() if error.id == "outbox.E023"]
    finally:
        for relay in relays:
            relay.disconnect()
    assert_no_secret(" ".join(texts))
    assert any("'http://…@rabbit:5672/vh?…' is not an AMQP URL" in text for text in texts)
    assert any("'redis://…@cache:notaport/2' does not parse" in text for text in texts)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://guest:guest@127.0.0.1:5672//", "amqp://…@127.0.0.1:5672//"),
        ("amqp://127.0.0.1:5672/vhost", "amqp://127.0.0.1:5672/vhost"),
        ("amqp://u:s3cret@h1//;amqp://u:s3cret@h2//", "amqp://…@h1//;amqp://…@h2//"),
        ("amqp://u:Xpw1;Ypw2@h//", "amqp://…@h//"),
        ("rediss://:s3cret@cache:6380/1?ssl_cert_reqs=none", "rediss://…@cache:6380/1?…"),
        ("redis://cache/0#frag", "redis://cache/0#…"),
        # A '?' before the last '@': the password's or the query's, nothing after is shown.
        ("amqp://u:s3?cret@host//", "amqp://…"),
        ("amqp://host//?token=Xpw1@Ypw2", "amqp://…"),
        ("u:s3cret@host", "…@host"),
    ],
)
def test_shown_url_keeps_the_scheme_host_and_path_only(url, shown):
    assert shown_url(url) == shown


@committing
@pytest.mark.parametrize(
    "relay",
    [
        lambda: AmqpRelay("amqp-secret", url="amqp://guest:s3cret/x@127.0.0.1:5672//"),
        lambda: RedisStreamRelay("redis-secret", url="redis://:s3cret/x@127.0.0.1:6379/0"),
    ],
    ids=["amqp", "redis"],
)
def test_a_drain_records_and_logs_a_url_the_relay_cannot_read_without_its_password(relay, caplog):
    row = failed_through(relay(), caplog)
    assert "port is not a number" in row.last_error


def failed_through(relay, caplog):
    """The row a drain failed to publish through `relay`, after checking that neither
    its error, nor its traceback, nor the log shows the password."""
    relay.connect(Category.AUDIT_EVENT)
    try:
        write(1, 1)
        with caplog.at_level(logging.WARNING, logger="outbox.engine"):
            assert drain_outboxes().failures == 1
    finally:
        relay.disconnect()
    row = RegionOutbox.objects.get()
    for shown in (row.last_error, row.last_traceback, caplog.text):
        assert_no_secret(shown)
    return row


@committing
@pytest.mark.parametrize(
    ("relay", "error"),
    [
        (
            lambda: AmqpRelay("amqp-refused", url="amqp://guest:s3cret@127.0.0.1:5672//"),
            "ACCESS_REFUSED",
        ),
        (
            lambda: RedisStreamRelay(
                "redis-refused", url="redis://:s3cret@127.0.0.1:1/0", connect_timeout=1
            ),
            "127.0.0.1:1",
        ),
    ],
    ids=["amqp-password-refused", "redis-connection-refused"],
)
def test_a_broker_that_refuses_the_relay_is_reported_without_the_password(relay, error, caplog):
    assert error in failed_through(relay(), caplog).last_error
