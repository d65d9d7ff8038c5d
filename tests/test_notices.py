"""Threshold notices: owed -> sending (claim_notices, compare-and-set per notice) -> sent
(complete_notice), or back to owed with exponential backoff (fail_notice), and claims
abandoned by a vanished worker re-armed (rearm_notices). Each claim has a token and only
its holder ends it (invariant 12). WF-PFM-LLM-004 hop 6 retries owed
notices; the pass-level step is in test_pass.py.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    T0,
    admit,
    call,
    heard,
    invariants,
    new_org,
    notice_listener,
    reconcile,
    rows,
    settle,
    wait_blocked,
)

MINUTE = timedelta(minutes=1)


# ---------------------------------------------------------------- local helpers


def org_with_notices(conn: psycopg.Connection, thresholds: list[int], *, used: int = 100,
                     now: datetime = T0) -> uuid.UUID:
    """An organization (allowance 100) whose settlement of ``used`` credits crossed ``thresholds``."""
    org = new_org(conn, 100, thresholds=thresholds, now=now)
    inv = admit(conn, org, used, now=now)["id"]
    assert settle(conn, org, inv, used, 0, now=now) == "settled"
    return org


def claim(conn: psycopg.Connection, limit: int = 50, now: datetime = T0) -> list[dict[str, Any]]:
    return call(conn, "claim_notices", limit=limit, now=now)


def complete(conn: psycopg.Connection, notice: dict[str, Any], now: datetime = T0) -> bool:
    """complete_notice with the claim's token as ``notice`` (a claimed row) carries it."""
    return call(conn, "complete_notice", notice["organization_id"], notice["id"], notice["claim_token"],
                now=now)[0]["value"]  # fmt: skip


def fail(conn: psycopg.Connection, notice: dict[str, Any], now: datetime, error: str = "webhook 503") -> bool:
    return call(conn, "fail_notice", notice["organization_id"], notice["id"], notice["claim_token"], error,
                now=now)[0]["value"]  # fmt: skip


def stale(notice: dict[str, Any]) -> dict[str, Any]:
    """``notice`` with a claim token that is no claim's (e.g. a row never claimed)."""
    return {**notice, "claim_token": uuid.uuid4()}


def rearm(conn: psycopg.Connection, now: datetime) -> int:
    return call(conn, "rearm_notices", now=now)[0]["value"]


def notice(conn: psycopg.Connection, notice_id: uuid.UUID) -> dict[str, Any]:
    return rows(conn, "SELECT * FROM llm.threshold_notices WHERE id = %s", [notice_id])[0]


# ---------------------------------------------------------------- creation


def test_crossing_thresholds_creates_one_owed_notice_per_threshold(llm_conn):
    """A settlement moving used credits from below to at-or-above pct % of the allowance creates
    one owed notice per threshold crossed, due at once; a later movement in the same period
    never creates a second notice for the same threshold."""
    org = org_with_notices(llm_conn, [50, 80, 100], used=85)
    owed = rows(llm_conn, "SELECT * FROM llm.threshold_notices ORDER BY threshold_pct")
    assert [(n["threshold_pct"], n["status"], n["attempts"]) for n in owed] == [(50, "owed", 0), (80, "owed", 0)]
    assert all(n["next_attempt_at"] == T0 and n["crossed_at"] == T0 for n in owed)
    inv = admit(llm_conn, org, 10, now=T0 + MINUTE)["id"]
    settle(llm_conn, org, inv, 20, 0, now=T0 + MINUTE)
    thresholds = [r[0] for r in llm_conn.execute(
        "SELECT threshold_pct FROM llm.threshold_notices ORDER BY 1").fetchall()]
    assert thresholds == [50, 80, 100]


# ---------------------------------------------------------------- claim


def test_claim_notices_moves_owed_to_sending(llm_conn):
    """claim_notices moves due owed notices to sending (attempts + 1, claimed_at = now), oldest
    crossing first, at most p_limit; a second claim does not return them again."""
    org_with_notices(llm_conn, [10, 20, 30])
    first = claim(llm_conn, limit=2, now=T0 + MINUTE)
    assert [(n["status"], n["attempts"], n["claimed_at"]) for n in first] == [("sending", 1, T0 + MINUTE)] * 2
    rest = claim(llm_conn, limit=50, now=T0 + MINUTE)
    assert len(rest) == 1
    assert {n["id"] for n in first}.isdisjoint({n["id"] for n in rest})
    assert claim(llm_conn, now=T0 + 2 * MINUTE) == []
    assert llm_conn.execute("SELECT count(*) FROM llm.threshold_notices WHERE status = 'sending'").fetchone()[0] == 3


@pytest.mark.parametrize("limit", [0, -1, None, 10_001])
def test_claim_notices_rejects_a_bad_limit_22023(llm_conn, limit):
    """claim_notices with a limit outside 1 .. 10000 (or NULL) raises 22023 and claims nothing."""
    org_with_notices(llm_conn, [50])
    with pytest.raises(psycopg.Error) as raised:
        claim(llm_conn, limit=limit)
    assert raised.value.sqlstate == "22023"
    assert llm_conn.execute("SELECT status FROM llm.threshold_notices").fetchone()[0] == "owed"


def test_two_claimers_never_get_the_same_notice_scripted(llm_conn, llm_connect):
    """Two workers never claim the same notice (compare-and-set per notice): A claims 5 inside an
    open transaction; B's claim blocks on A's first row; A commits; B skips what A took and
    claims the next 5."""
    org_with_notices(llm_conn, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    a = llm_connect(autocommit=False)
    b = llm_connect()
    mine = claim(a, limit=5)  # uncommitted
    with ThreadPoolExecutor(max_workers=1) as pool:
        theirs_future = pool.submit(claim, b, 5)
        wait_blocked(llm_conn, b.info.backend_pid)
        a.commit()
        theirs = theirs_future.result(timeout=10)
    assert len(mine) == 5 and len(theirs) == 5
    assert {n["id"] for n in mine}.isdisjoint({n["id"] for n in theirs})
    assert all(n["attempts"] == 1 for n in mine + theirs)


def test_two_claimers_never_get_the_same_notice_under_load(llm_conn, llm_connect):
    """Two connections claiming concurrently in small batches, over many notices across several
    organizations, never receive the same notice, and together claim every one exactly once."""
    for _ in range(8):
        org_with_notices(llm_conn, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    total = llm_conn.execute("SELECT count(*) FROM llm.threshold_notices").fetchone()[0]
    assert total == 80
    workers = [llm_connect(), llm_connect()]
    start = threading.Barrier(len(workers))

    def drain(conn: psycopg.Connection) -> list[uuid.UUID]:
        got: list[uuid.UUID] = []
        start.wait(timeout=10)
        for _ in range(200):  # 80 notices, 3 a claim: bounded, never a spin
            batch = claim(conn, limit=3)
            got.extend(n["id"] for n in batch)
            # an empty batch may only mean the other worker took every candidate just now
            if not batch and conn.execute(
                    "SELECT NOT EXISTS (SELECT FROM llm.threshold_notices WHERE status = 'owed')").fetchone()[0]:
                return got
        raise AssertionError(f"owed notices left after 200 claims; this worker got {len(got)}")

    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        results = list(pool.map(drain, workers))
    claimed = results[0] + results[1]
    assert len(claimed) == len(set(claimed)) == total
    assert set(results[0]).isdisjoint(results[1])
    assert llm_conn.execute("SELECT count(*) FROM llm.threshold_notices"
                            " WHERE status = 'sending' AND attempts = 1").fetchone()[0] == total


# ---------------------------------------------------------------- complete / fail


def test_complete_notice_marks_sent_once(llm_conn):
    """complete_notice moves a claimed notice sending -> sent with sent_at; repeating it, or
    completing a notice that is not being sent, returns false and changes nothing."""
    org_with_notices(llm_conn, [50, 80])
    [first] = claim(llm_conn, limit=1)
    assert complete(llm_conn, first, now=T0 + MINUTE) is True
    row = notice(llm_conn, first["id"])
    assert (row["status"], row["sent_at"], row["last_error"]) == ("sent", T0 + MINUTE, None)
    assert complete(llm_conn, first, now=T0 + 2 * MINUTE) is False
    assert notice(llm_conn, first["id"])["sent_at"] == T0 + MINUTE
    second = rows(llm_conn, "SELECT * FROM llm.threshold_notices WHERE status = 'owed'")[0]
    assert complete(llm_conn, stale(second)) is False
    assert notice(llm_conn, second["id"])["status"] == "owed"
    assert fail(llm_conn, first, T0 + 3 * MINUTE) is False
    assert notice(llm_conn, first["id"])["status"] == "sent"


def test_complete_or_fail_of_unknown_notice_raises_22023(llm_conn):
    """complete_notice / fail_notice of a notice that does not exist for that organization (also
    another organization's notice) raise 22023."""
    org_with_notices(llm_conn, [50])
    [claimed] = claim(llm_conn)
    other = org_with_notices(llm_conn, [90], used=10)
    for target in ({**claimed, "id": uuid.uuid4()}, {**claimed, "organization_id": other}):
        with pytest.raises(psycopg.Error) as raised:
            complete(llm_conn, target)
        assert raised.value.sqlstate == "22023"
        with pytest.raises(psycopg.Error) as raised:
            fail(llm_conn, target, T0)
        assert raised.value.sqlstate == "22023"
    assert notice(llm_conn, claimed["id"])["status"] == "sending"


def test_fail_notice_returns_to_owed_with_exponential_backoff_capped(llm_conn):
    """fail_notice puts a claimed notice back to owed with its error and next_attempt_at = now +
    1, 2, 4, 8 … minutes (settings.notice_backoff_base * 2^(attempts-1)), capped at
    settings.notice_backoff_max (6 h)."""
    org_with_notices(llm_conn, [50])
    now = T0
    delays = []
    for _ in range(11):
        [claimed] = claim(llm_conn, now=now)
        assert fail(llm_conn, claimed, now, error=f"attempt {claimed['attempts']}") is True
        row = notice(llm_conn, claimed["id"])
        assert (row["status"], row["claimed_at"], row["last_error"]) == (
            "owed", None, f"attempt {claimed['attempts']}")
        delays.append(row["next_attempt_at"] - now)
        now = row["next_attempt_at"]
    expected = [MINUTE * 2**i for i in range(9)] + [timedelta(hours=6)] * 2
    assert delays == expected
    assert notice(llm_conn, claimed["id"])["attempts"] == 11


def test_failed_notice_is_not_claimable_before_next_attempt_at(llm_conn):
    """A failed notice stays owed but is not claimed before its next_attempt_at; at that moment
    it is claimed again."""
    org_with_notices(llm_conn, [50])
    [claimed] = claim(llm_conn, now=T0)
    fail(llm_conn, claimed, T0)
    due = notice(llm_conn, claimed["id"])["next_attempt_at"]
    assert due == T0 + MINUTE
    assert claim(llm_conn, now=due - timedelta(seconds=1)) == []
    [again] = claim(llm_conn, now=due)
    assert (again["id"], again["attempts"]) == (claimed["id"], 2)


# ---------------------------------------------------------------- re-arm


def test_rearm_notices_rearms_claims_older_than_fifteen_minutes(llm_conn):
    """rearm_notices makes a claim older than settings.notice_claim_timeout (15 min) owed again
    and due at once, leaves younger claims alone, and returns how many it re-armed; the
    re-armed notice is claimable and a late complete of the old claim returns false."""
    org_with_notices(llm_conn, [50, 80])
    [old] = claim(llm_conn, limit=1, now=T0)
    [young] = claim(llm_conn, limit=1, now=T0 + 5 * MINUTE)
    now = T0 + 15 * MINUTE
    assert rearm(llm_conn, now) == 1
    row = notice(llm_conn, old["id"])
    assert (row["status"], row["claimed_at"], row["next_attempt_at"]) == ("owed", None, now)
    assert row["last_error"] == "claim expired without completion"
    assert notice(llm_conn, young["id"])["status"] == "sending"
    assert complete(llm_conn, old, now=now) is False
    [reclaimed] = claim(llm_conn, now=now)
    assert (reclaimed["id"], reclaimed["attempts"]) == (old["id"], 2)
    assert rearm(llm_conn, now) == 0


# ---------------------------------------------------------------- release (a worker shutting down)


def release(conn: psycopg.Connection, notice: dict[str, Any], now: datetime = T0) -> bool:
    return call(conn, "release_notice", notice["organization_id"], notice["id"], notice["claim_token"],
                now=now)[0]["value"]  # fmt: skip


def test_release_notice_gives_a_claim_back_due_at_once_with_no_attempt_counted(llm_conn):
    """release_notice (a worker shutting down releases what it claimed but did not
    send): sending -> owed, next_attempt_at = p_now, claimed_at cleared, the attempt claim_notices
    counted taken back, last_error kept; true. The next claim gets it at once."""
    org_with_notices(llm_conn, [50])
    [claimed] = claim(llm_conn, now=T0)
    fail(llm_conn, claimed, T0, error="webhook 503")  # one real attempt, backoff 1 min
    [again] = claim(llm_conn, now=T0 + MINUTE)
    assert again["attempts"] == 2
    at = T0 + MINUTE + timedelta(seconds=5)
    assert release(llm_conn, again, now=at) is True
    row = notice(llm_conn, again["id"])
    assert (row["status"], row["claimed_at"], row["next_attempt_at"], row["attempts"], row["last_error"]) == (
        "owed", None, at, 1, "webhook 503")
    [reclaimed] = claim(llm_conn, now=at)
    assert (reclaimed["id"], reclaimed["attempts"]) == (again["id"], 2)


def test_release_notice_of_a_notice_not_being_sent_returns_false_and_changes_nothing(llm_conn):
    """Only a claimed notice is released: an owed or a sent one answers false, unchanged; an unknown
    notice (or another organization's) is 22023, like complete_notice."""
    org_with_notices(llm_conn, [50, 80])
    owed = rows(llm_conn, "SELECT * FROM llm.threshold_notices ORDER BY threshold_pct")[0]
    assert release(llm_conn, stale(owed)) is False
    assert notice(llm_conn, owed["id"]) == owed
    [claimed] = claim(llm_conn, limit=1)
    complete(llm_conn, claimed, now=T0)
    sent = notice(llm_conn, claimed["id"])
    assert release(llm_conn, claimed, now=T0 + MINUTE) is False
    assert notice(llm_conn, claimed["id"]) == sent
    other = org_with_notices(llm_conn, [90], used=10)
    for target in ({**claimed, "id": uuid.uuid4()}, {**claimed, "organization_id": other}):
        with pytest.raises(psycopg.Error) as raised:
            release(llm_conn, target)
        assert raised.value.sqlstate == "22023"


def test_the_shared_twin_refuses_an_end_it_does_not_know_and_changes_nothing(llm_conn):
    """llm._end_claim ends a claim sent, failed or released (complete_notice, fail_notice,
    release_notice); any other end, NULL included, is 22023 and the claim stays as it was."""
    org_with_notices(llm_conn, [50])
    [claimed] = claim(llm_conn, now=T0)
    before = notice(llm_conn, claimed["id"])
    for end in ("fail", None):
        with pytest.raises(psycopg.Error) as raised:
            llm_conn.execute("SELECT llm._end_claim(%s, %s, %s, %s, NULL, %s)",
                             [claimed["organization_id"], claimed["id"], claimed["claim_token"], end, T0])  # fmt: skip
        assert raised.value.sqlstate == "22023"
        assert notice(llm_conn, claimed["id"]) == before


# ---------------------------------------------------------------- claim tokens


def test_a_stale_worker_cannot_end_the_claim_another_worker_holds(llm_conn, llm_connect):
    """Invariant 12: worker A claims a notice, its claim expires and the
    pass re-arms it, worker B claims it again with a new token. A's fail, release and
    complete (its old token) each return false and change nothing, so B's claim stands and
    the notice is not owed again; B completes it: delivered once."""
    org_with_notices(llm_conn, [50])
    worker_a, worker_b = llm_connect(), llm_connect()
    [mine] = claim(worker_a, now=T0)
    assert rearm(llm_conn, T0 + 15 * MINUTE) == 1  # A's claim expired
    [theirs] = claim(worker_b, now=T0 + 15 * MINUTE)
    assert theirs["id"] == mine["id"] and theirs["claim_token"] not in (None, mine["claim_token"])
    held = notice(llm_conn, theirs["id"])

    late = T0 + 16 * MINUTE
    assert fail(worker_a, mine, late, error="timeout after 5s") is False
    assert release(worker_a, mine, late) is False
    assert complete(worker_a, mine, late) is False
    assert notice(llm_conn, theirs["id"]) == held
    assert claim(worker_a, now=late) == []  # not owed again: nothing to deliver twice

    assert complete(worker_b, theirs, T0 + 17 * MINUTE) is True
    done = notice(llm_conn, theirs["id"])
    assert (done["status"], done["sent_at"], done["claim_token"], done["attempts"]) == (
        "sent", T0 + 17 * MINUTE, None, 2)
    assert complete(worker_a, mine, T0 + 18 * MINUTE) is False
    assert invariants(llm_conn) == []


def test_ending_a_claim_without_its_token_is_22023_and_changes_nothing(llm_conn):
    """complete_notice, fail_notice and release_notice take the claim's
    token, with no default; a NULL token is 22023 (like an unknown notice) and the claim
    stays as it was."""
    org_with_notices(llm_conn, [50])
    [claimed] = claim(llm_conn, now=T0)
    before = notice(llm_conn, claimed["id"])
    assert before["claim_token"] == claimed["claim_token"] and before["claim_token"] is not None
    tokenless = {**claimed, "claim_token": None}
    for end in (complete, lambda c, n: fail(c, n, T0), release):
        with pytest.raises(psycopg.Error) as raised:
            end(llm_conn, tokenless)
        assert raised.value.sqlstate == "22023"
        assert notice(llm_conn, claimed["id"]) == before
    assert complete(llm_conn, claimed) is True


def test_invariant_12_a_claim_token_only_while_sending(llm_conn):
    """invariant 12: every sending notice has a claim token and no other
    notice has one. Owed, sending and sent notices made by the functions pass; a sending
    notice stripped of its token, and an owed one given a token, by hand, are each reported."""
    org_with_notices(llm_conn, [50, 80, 100])
    first, second = claim(llm_conn, limit=2, now=T0)
    complete(llm_conn, first)
    assert {r["status"] for r in rows(llm_conn, "SELECT status FROM llm.threshold_notices")} == {
        "owed", "sending", "sent"}  # fmt: skip
    assert invariants(llm_conn) == []
    owed = rows(llm_conn, "SELECT * FROM llm.threshold_notices WHERE status = 'owed'")[0]

    llm_conn.execute("UPDATE llm.threshold_notices SET claim_token = NULL WHERE id = %s", [second["id"]])
    llm_conn.execute("UPDATE llm.threshold_notices SET claim_token = gen_random_uuid() WHERE id = %s",
                     [owed["id"]])  # fmt: skip
    found = sorted((v["invariant"], v["subject"]) for v in invariants(llm_conn))
    assert found == sorted([(12, f"notice {second['id']}"), (12, f"notice {owed['id']}")])


# ---------------------------------------------------------------- NOTIFY llm_notices


def test_a_notice_becoming_owed_notifies_llm_notices_at_commit(llm_conn, llm_connect):
    """Issue #13: the settling transaction that creates notices does NOTIFY llm_notices, once per
    transaction (PostgreSQL folds identical payloads), and only when it commits; a settlement that
    crosses nothing notifies nothing."""
    ear = notice_listener(llm_connect)
    org = new_org(llm_conn, 100, thresholds=[50, 80])
    first, second, third = (admit(llm_conn, org, 10)["id"] for _ in range(3))
    settle(llm_conn, org, first, 10, 0)
    assert heard(ear) == []  # 10 % crosses nothing

    writer = llm_connect(autocommit=False)
    settle(writer, org, second, 75, 0)
    assert heard(ear) == []  # not before the commit
    writer.rollback()
    assert heard(ear) == []  # nor after a rollback
    settle(writer, org, second, 75, 0)
    writer.commit()  # 85 %: crosses 50 and 80, one notification
    assert heard(ear) == ["created"]
    assert llm_conn.execute("SELECT count(*) FROM llm.threshold_notices").fetchone()[0] == 2
    settle(llm_conn, org, third, 1, 0)
    assert heard(ear) == []  # nothing new crossed


def test_retry_release_and_rearm_notify_llm_notices(llm_conn, llm_connect):
    """Every way a notice becomes owed again notifies: fail_notice (owed after its backoff),
    release_notice, rearm_notices when it re-armed any; claim and complete do not."""
    org_with_notices(llm_conn, [50, 80])
    ear = notice_listener(llm_connect)
    first, second = claim(llm_conn)
    assert heard(ear) == []
    fail(llm_conn, first, T0)
    assert heard(ear) == ["retry"]
    release(llm_conn, second)
    assert heard(ear) == ["released"]
    assert len(claim(llm_conn, now=T0)) == 1  # the released one
    assert rearm(llm_conn, T0 + MINUTE) == 0
    assert heard(ear) == []
    assert rearm(llm_conn, T0 + 15 * MINUTE) == 1
    assert heard(ear) == ["rearmed"]
    for last in claim(llm_conn, now=T0 + 15 * MINUTE):
        complete(llm_conn, last, now=T0 + 15 * MINUTE)
    assert heard(ear) == []


def test_recovery_crossing_a_threshold_notifies_llm_notices(llm_conn, llm_connect):
    """A threshold crossed by the pass's recovery (the stored estimate charged) creates the notice
    through the same rule, so it notifies too."""
    org = new_org(llm_conn, 100, thresholds=[80])
    admit(llm_conn, org, 90)
    ear = notice_listener(llm_connect)
    swept = reconcile(llm_conn, org, now=T0 + timedelta(hours=25))
    assert swept["recovered_requests"] == 1
    assert heard(ear) == ["created"]
