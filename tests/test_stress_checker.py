"""The stress checker's rules (stress/), on made-up journals: no database needed."""

from stress.duplicates import attribute
from stress.journal import Call, Write
from stress.stopcheck import check_stops


def call(pid, start, token, seq=1, shard=7, ok=True, hung=False, slow=False, end=None):
    return Call(
        shard=shard,
        category=801,
        obj=70,
        seq=seq,
        sseq=seq,
        process=f"drainer-{pid}",
        pid=pid,
        start=start,
        end=start + 0.01 if end is None else end,
        ok=ok,
        hung=hung,
        slow=slow,
        token=token,
        holder=f"host:{pid}:1",
    )


def graceful_stop(**changes):
    """Drainer 11 got SIGTERM at 1.1 during its 2 s call on shard 7; exited at 3.3."""
    stop = {
        "kind": "graceful",
        "at": 0.9,
        "pid": 11,
        "shard": 7,
        "term_at": 1.1,
        "exit_at": 3.3,
        "exit_s": 2.2,
        "exit_code": 0,
        "graceful_timeout_s": 10.0,
        "leases_after_exit": 0,
        "lease_expires_at": 6.0,
    }
    return {**stop, **changes}


def test_a_call_is_leased_only_when_the_lease_names_its_process():
    assert call(11, 1.0, "t1").leased
    assert not call(11, 1.0, "").leased
    assert not call(11, 1.0, "t1")._replace(holder="host:12:1").leased


def test_a_redelivery_after_a_kill_of_the_batch_in_flight_is_explained():
    calls = [call(11, 1.0, "t1"), call(12, 9.0, "t2")]
    kill = {"kind": "kill", "at": 2.0, "done_at": 2.1, "pid": 11}
    result = attribute([kill], calls)
    assert result["duplicates_explained"] == {"kill": 1}
    assert result["unexplained_duplicates"] == 0


def test_a_redelivery_from_an_earlier_batch_or_before_the_fault_is_not():
    # t1 is neither the batch in flight (t3) nor the one settling behind it (t0), and
    # its last call ended more than a lease (RECENT_S) before the kill.
    earlier_batch = [
        call(11, 1.0, "t1"),
        call(11, 1.5, "t0", seq=2),
        call(11, 1.8, "t3", seq=3),
        call(12, 9.0, "t2"),
    ]
    late_kill = {"kind": "kill", "at": 8.0, "done_at": 8.1, "pid": 11}
    assert attribute([late_kill], earlier_batch)["unexplained_duplicates"] == 1
    # Within a lease of the kill, such a batch may still be unsettled (a straggler, or
    # a settle queued behind on a loaded machine): explained.
    early_kill = {"kind": "kill", "at": 4.0, "done_at": 4.1, "pid": 11}
    assert attribute([early_kill], earlier_batch)["duplicates_explained"] == {"kill": 1}
    kill = {"kind": "kill", "at": 2.0, "done_at": 2.1, "pid": 11}
    before_fault = [call(11, 1.0, "t1"), call(12, 1.9, "t2")]
    assert attribute([kill], before_fault)["unexplained_duplicates"] == 1
    other_process = [call(13, 1.0, "t1"), call(12, 9.0, "t2")]
    assert attribute([kill], other_process)["unexplained_duplicates"] == 1


def test_each_redelivery_needs_its_own_fault():
    calls = [call(11, 1.0, "t1"), call(12, 9.0, "t2"), call(13, 20.0, "t3")]
    kill = {"kind": "kill", "at": 2.0, "done_at": 2.1, "pid": 11}
    result = attribute([kill], calls)
    assert (result["duplicates"], result["unexplained_duplicates"]) == (2, 1)


def test_the_batch_of_a_hung_call_is_forfeit():
    calls = [
        call(11, 1.0, "t1", shard=8),  # same batch, delivered before the hang
        call(11, 1.1, "t1", shard=7, hung=True, end=13.1),
        call(12, 9.0, "t2", shard=8),
        call(12, 9.1, "t2", shard=7),
    ]
    hang = {"kind": "hang", "at": 0.5, "shard": 7}
    result = attribute([hang], calls)
    assert result["duplicates_explained"] == {"hang": 2}
    assert result["unexplained_duplicates"] == 0


def test_a_batch_caught_by_two_faults_is_explained_by_the_first():
    calls = [call(11, 1.0, "t1", shard=8), call(11, 1.1, "t1", hung=True, end=13.1)]
    calls.append(call(12, 9.0, "t2", shard=8))
    hang = {"kind": "hang", "at": 0.5, "shard": 7}
    terminate = {"kind": "terminate", "at": 12.0, "done_at": 12.1, "pid": 11}
    result = attribute([hang, terminate], calls)
    assert result["duplicates_explained"] == {"hang": 1}
    assert result["unexplained_duplicates"] == 0


def test_a_hang_cut_short_by_a_kill_still_explains_its_batch():
    hung = call(11, 1.1, "t1", hung=True, ok=False, end=1.1)  # journaled when it started
    calls = [call(11, 1.0, "t1", shard=8), hung, call(12, 9.0, "t2", shard=8)]
    hang = {"kind": "hang", "at": 0.5, "shard": 7}
    kill = {"kind": "kill", "at": 12.0, "done_at": 12.1, "pid": 11}
    assert attribute([hang, kill], calls)["duplicates_explained"] == {"hang": 1}


def test_a_graceful_stop_explains_no_duplicate_and_checks_its_facts():
    calls = [call(11, 1.0, "t1", slow=True, end=3.0), call(12, 3.2, "t2")]
    due = [Write(shard=7, category=801, obj=70, seq=2, sseq=2, at=0.5)]  # after the call
    stop = graceful_stop()
    assert attribute([stop], calls)["unexplained_duplicates"] == 1
    [checked] = check_stops([stop], calls, due, lease=5.0)
    assert checked["problems"] == []
    assert (checked["resume_s"], checked["lease_left_s"]) == (0.2, 3.0)
    late = graceful_stop(exit_s=11.5, leases_after_exit=1)
    [checked] = check_stops([late], [*calls, call(11, 2.0, "t1", shard=9)], due, lease=5.0)
    assert checked["problems"] == ["exit", "claimed after SIGTERM", "leases not released"]
    # A slot's call that started while the signal was still on its way is not a claim.
    [checked] = check_stops([stop], [*calls, call(11, 1.11, "t1", shard=9)], due, lease=5.0)
    assert checked["problems"] == []


def test_a_shard_with_nothing_due_after_the_stop_is_timed_from_its_next_write():
    calls = [call(11, 1.0, "t1", slow=True, end=3.0), call(12, 20.1, "t2", seq=2)]
    later = [Write(shard=7, category=801, obj=70, seq=2, sseq=2, at=20.0)]
    stop = graceful_stop(exit_code=3)
    [checked] = check_stops([stop], calls, later, lease=5.0)
    assert checked["problems"] == []
    assert round(checked["resume_s"], 3) == 0.1
    [checked] = check_stops([stop], calls[:1], later, lease=5.0)
    assert checked["problems"] == ["shard not resumed within a lease TTL"]


def test_a_hang_taints_its_shard_from_when_the_hung_call_started():
    # The hang was set up at 10.0 on an idle shard; its hung call came at 40.0. A call
    # at 65.0 (past 10 + 6 leases, within 40 + 6 leases) is near the fault.
    from stress.order import tainted

    hung = call(11, 40.0, "t1", hung=True, end=52.0)
    hang = {"kind": "hang", "at": 10.0, "shard": 7}
    (span,) = tainted([hang], {7: [hung]}, 5.0)[7]
    assert span[0] <= 65.0 <= span[1]
    assert span[0] > 10.0
