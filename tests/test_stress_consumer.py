"""The relay leg's consumer-side rules (stress/consumer.py), on made-up queues: no
database or broker needed."""

import threading
from collections import Counter

from stress.broker import Received, parse
from stress.consumer import rules
from stress.handoff import publish_failed, published
from stress.journal import Write
from tests.test_stress_checker import call

A, B, C = 70, 71, 72  # objects of shard 7, each its own group
NO_FAULTS = {"faults": [], "lease_seconds": 5.0}


def write(obj, seq, sseq):
    return Write(shard=7, category=801, obj=obj, seq=seq, sseq=sseq, at=float(sseq))


def got(obj, seq, sseq, message_id=None):
    return Received(
        message_id=message_id or f"{obj}-{seq}",
        shard=7,
        category=801,
        obj=obj,
        seq=seq,
        sseq=sseq,
        redelivered=False,
        consistent=True,
    )


def check(writes, queue, failed=(), journaled=None, info=NO_FAULTS):
    """`failed`: ids whose every publish the relay reported failed (none confirmed)."""
    ids = {m.message_id for m in queue}
    journaled = ids if journaled is None else journaled
    confirmed = {i: 1.0 for i in ids if i not in failed}
    reported = (confirmed, Counter(confirmed), dict.fromkeys(failed, "cut"))
    return rules(info, queue, writes, [], reported, journaled)


def test_a_clean_queue_passes_and_repeats_are_counted_not_failed():
    writes = [write(A, 1, 1), write(B, 1, 2), write(A, 2, 3)]
    # A's newest at A's place (its oldest row), then B; A again (a repeat).
    queue = [got(A, 2, 3), got(B, 1, 2), got(A, 2, 3)]
    result = check(writes, queue)
    assert result["relay_repeats"] == 1
    assert result["relay_messages"] == 2
    for key in ("lost", "phantoms", "order_violations", "group_regressions"):
        assert result[f"relay_{key}"] == 0, key


def test_a_missing_newest_message_is_lost_and_an_unknown_one_a_phantom():
    writes = [write(A, 1, 1), write(A, 2, 2)]
    result = check(writes, [got(A, 1, 1), got(B, 9, 9)])
    assert result["relay_lost"] == 1
    assert result["relay_phantoms"] == 1


def test_a_confirmed_message_missing_from_the_queue_is_counted():
    writes = [write(A, 1, 1)]
    queue = [got(A, 1, 1)]
    confirmed = {"70-1": 1.0, "lost-after-confirm": 1.0}
    result = rules(NO_FAULTS, queue, writes, [], (confirmed, Counter(confirmed), {}), {"70-1"})
    assert result["relay_confirmed_missing"] == 1


def test_an_older_message_after_a_newer_one_of_its_group_is_a_regression():
    writes = [write(A, 1, 1), write(A, 2, 2)]
    result = check(writes, [got(A, 2, 2), got(A, 1, 1)])
    assert result["relay_group_regressions"] == 1
    # The same message again is a repeat, not a regression.
    again = check(writes, [got(A, 1, 1), got(A, 2, 2), got(A, 1, 1)])
    assert again["relay_group_regressions"] == 0
    assert again["relay_repeats"] == 1


def test_a_message_ahead_of_an_older_write_of_its_shard_is_an_order_violation():
    writes = [write(A, 1, 1), write(B, 1, 2)]
    result = check(writes, [got(B, 1, 2), got(A, 1, 1)])
    assert result["relay_order_violations"] == 1


def test_after_an_unsettled_message_its_group_may_pass_an_older_write():
    # A1 reached the queue but its publish was reported failed (the confirm lost in a
    # cut): the retry delivers A's newest, A2, at A's place, ahead of C1.
    writes = [write(A, 1, 1), write(C, 1, 2), write(A, 2, 3)]
    queue = [got(A, 1, 1), got(A, 2, 3), got(C, 1, 2)]
    reported_failed = check(writes, queue, failed=["70-1"])
    assert reported_failed["relay_order_violations"] == 0
    assert reported_failed["relay_order_unverified"] == 1
    assert reported_failed["relay_arrived_unconfirmed"] == 1
    # The journaling receiver never succeeded for A1: unsettled too.
    not_journaled = check(writes, queue, journaled={"70-2", "72-1"})
    assert not_journaled["relay_order_unverified"] == 1
    # A1 settled: A2 passing C1 is a violation.
    settled = check(writes, queue)
    assert settled["relay_order_violations"] == 1


def test_near_a_drainer_fault_of_its_shard_the_order_is_unverified():
    writes = [write(A, 1, 1), write(B, 1, 2)]
    queue = [got(B, 1, 2), got(A, 1, 1)]
    # The killed drainer delivered on shard 7 at 0.5: B1, published at 1.5, is near it.
    kill = {"kind": "kill", "at": 2.0, "pid": 11}
    info = {"faults": [kill], "lease_seconds": 5.0}
    confirmed = {"71-1": 1.5, "70-1": 3.0}
    reported = (confirmed, Counter(confirmed), {})
    result = rules(info, queue, writes, [call(11, 0.5, "t1")], reported, {"71-1"})
    assert result["relay_order_violations"] == 0
    assert result["relay_order_unverified"] == 1


def test_the_consumer_reads_the_relays_message_back():
    body = (
        '{"specversion":"1.0","id":"m-1","subject":"70","type":"coalescing",'
        '"data":{"seq":5,"sseq":9}}'
    )
    headers = {"outbox-message-id": "m-1", "outbox-shard": "STRESS:7"}
    headers["outbox-category"] = "COALESCING"
    item = {"body": body, "headers": headers, "message_id": "m-1", "redelivered": True}
    categories = {"COALESCING": 801}
    assert parse(item, categories) == Received("m-1", 7, 801, 70, 5, 9, True, True)
    assert not parse({**item, "message_id": "m-2"}, categories).consistent


def test_the_journaling_receiver_fails_after_the_relay_failed_on_its_thread():
    assert published("m-1")
    publish_failed("m-1")
    seen = []
    other = threading.Thread(target=lambda: seen.append(published("m-1")))
    other.start()
    other.join()
    assert seen == [True]  # another thread's publish
    assert not published("m-1")
    assert published("m-1")  # read once: the retry's call is its own


def test_a_message_reported_failed_then_confirmed_on_retry_is_settled():
    # A1's first publish failed before the broker had it, its retry was confirmed: A1
    # arrived once, confirmed once, so A2 passing C1 is a violation.
    writes = [write(A, 1, 1), write(C, 1, 2), write(A, 2, 3)]
    queue = [got(A, 1, 1), got(A, 2, 3), got(C, 1, 2)]
    confirmed = {m.message_id: 1.0 for m in queue}
    reported = (confirmed, Counter(confirmed), {"70-1": "refused"})
    result = rules(NO_FAULTS, queue, writes, [], reported, set(confirmed))
    assert result["relay_arrived_unconfirmed"] == 0
    assert result["relay_order_violations"] == 1
    # Twice in the queue, confirmed once: a copy arrived unconfirmed.
    twice = rules(NO_FAULTS, [queue[0], *queue], writes, [], reported, set(confirmed))
    assert twice["relay_arrived_unconfirmed"] == 1
    assert twice["relay_order_unverified"] == 1
