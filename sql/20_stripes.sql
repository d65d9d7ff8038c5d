-- An organization's monthly periods: created on first use (_ensure_period), their
-- counters spread over stripes (schema 0007), and the escrow that keeps admission
-- exact and threshold notices complete while the requests of one organization
-- update different rows (docs/architecture.md, "Striped periods"). Calls 10_common.sql
-- and the notices' creation (15_notices.sql); the organizations (25), admission,
-- settlement and recovery move the stripes through it.
--
-- Each stripe row carries its share of the counters and three rooms:
--   admit_room  credits it may still hold on its own; the rooms of a period's
--               stripes never add up to more than the period has left
--               (allowance - used - held; without an allowance, the sum limit
--               _max_sum() - used - held), so a hold that fits its stripe's room
--               fits the period (NULL: spread again on the next movement);
--   cents_room  cents it may still charge on its own, the same way under the sum
--               limit (_max_sum() - used cents);
--   notice_room usage it may still add on its own; the rooms never add up to more
--               than the period's used credits can grow before reaching its next
--               threshold not notified yet, so a movement that fits cannot cross
--               one (NULL: none ahead).
-- Each stripe also keeps, in the same row its movements update (so at no cost to
-- them), what the pass and the reports read instead of an index a settlement would
-- touch (docs/architecture.md "The write path"):
--   open_requests  how many open (reserved, dispatched) requests hold on it;
--   open_since     no open one of them was admitted earlier (NULL when none is
--                  open): lowered by each admission, raised by the pass under the
--                  period's lock (60_recovery.sql);
--   quiet          a pass found none open here, and none was admitted since;
--   settle_lag_hours, settle_lead_hours: no terminal request of it settled more
--                  hours (rounded up) after, or before, its admission.
-- NULL open fields are not known yet (a stripe the previous release moved, until
-- the contract step of 0.4.0 counts it): they stay NULL, and readers take any time
-- of the period for them.
-- A movement that fits its stripe's rooms updates that one row (fast). One that
-- does not takes the exact path: every stripe of the period is locked, in the order
-- of docs/architecture.md "Lock order" (row 9), the decision is made on the totals
-- (LL001, threshold notices), and the rooms are spread again.
--
-- Why a fast movement off stripe 0 runs in a subtransaction: an UPDATE that
-- waited for a row and then found it no longer matching keeps that row locked.
-- A transaction holding stripe k > 0 that way and then taking the exact path
-- would wait for stripes below k while holding k, against the order; rolling the
-- subtransaction back releases the row. Stripe 0, the first of the order, is safe
-- to hold, so an unstriped organization (every request on stripe 0) pays nothing.

-- Inlinable (no SET clause, everything qualified): a stripe's open_since after a
-- movement that changes its open requests by p_open (+1 an admission at p_at, -n
-- requests ending), from its open_requests and open_since before it.
CREATE OR REPLACE FUNCTION llm._open_since(
    p_open_requests integer, p_open_since timestamptz, p_open integer, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_open OPERATOR(pg_catalog.>) 0
                THEN CASE WHEN p_open_requests OPERATOR(pg_catalog.=) 0 THEN p_at
                          WHEN p_open_requests OPERATOR(pg_catalog.>) 0 THEN LEAST(p_open_since, p_at) END
                WHEN p_open OPERATOR(pg_catalog.<) 0
                     AND p_open_requests OPERATOR(pg_catalog.+) p_open OPERATOR(pg_catalog.=) 0
                THEN NULL
                ELSE p_open_since END
$$;
COMMENT ON FUNCTION llm._open_since(integer, timestamptz, integer, timestamptz) IS
    'A period stripe''s open_since after p_open more open requests (an admission at p_at) or fewer (requests ending): the admission''s time on a stripe with none open, NULL once none is (and while its open requests are not known).';

-- Whether only this release's functions write the books: the contract step of 0.4.0
-- has run (llm.upgrade_steps). Before it, a call of the previous release may still
-- move a stripe without its open fields, so new stripes leave them NULL (not known)
-- and the contract step counts them.
CREATE OR REPLACE FUNCTION llm._functions_only()
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM llm.upgrade_steps AS u WHERE u.step = 'functions_only');
END
$$;
COMMENT ON FUNCTION llm._functions_only() IS
    'True once the contract step of 0.4.0 ran: every call that could move the books without this release''s columns has ended.';

-- A period's stripes 0 .. p_stripes - 1 that do not exist yet, with nothing on them.
CREATE OR REPLACE FUNCTION llm._add_stripes(p_organization_id uuid, p_period_start date, p_stripes integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_known boolean := llm._functions_only();
BEGIN
    INSERT INTO llm.period_stripes
           (organization_id, period_start, stripe, open_requests, open_since, settle_lag_hours, settle_lead_hours)
    SELECT p_organization_id, p_period_start, g,
           CASE WHEN v_known THEN 0 END, NULL, 0, 0
      FROM pg_catalog.generate_series(0, p_stripes - 1) AS g
    ON CONFLICT (organization_id, period_start, stripe) DO NOTHING;
END
$$;
COMMENT ON FUNCTION llm._add_stripes(uuid, date, integer) IS
    'Creates the stripes 0 .. p_stripes - 1 of a period that it lacks, empty (their open fields NULL until the contract step of 0.4.0 ran).';

-- Each organization's open floor: no open request of it was admitted earlier. The
-- earliest open_since of its stripes that have open requests, read through the index
-- of the stripes that are not quiet; a stripe whose open requests are not known yet
-- counts from its period's first day. Inlined into each reader's query (a filter on
-- the organization reaches the stripes); no grant.
CREATE OR REPLACE VIEW llm._open_floors AS
SELECT s.organization_id,
       min(CASE WHEN s.open_requests IS NULL THEN s.period_start::timestamp AT TIME ZONE 'UTC'
                ELSE s.open_since END) AS floor
  FROM llm.period_stripes AS s
 WHERE s.quiet IS NOT TRUE AND (s.open_requests IS NULL OR s.open_requests > 0)
 GROUP BY s.organization_id;
COMMENT ON VIEW llm._open_floors IS
    'Internal: each organization with open requests and the earliest admission time one of them may have (its open floor).';

-- The open floor of one organization (NULL: none is open).
CREATE OR REPLACE FUNCTION llm._open_floor(p_organization_id uuid)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_floor timestamptz;
BEGIN
    SELECT o.floor INTO v_floor FROM llm._open_floors AS o WHERE o.organization_id = p_organization_id;
    RETURN v_floor;
END
$$;
COMMENT ON FUNCTION llm._open_floor(uuid) IS
    'The earliest time an open request of the organization may have been admitted at (its stripes'' open_since; a period''s first day where they are not known); NULL when none is open.';

-- The requests of an organization settled on the days p_from .. p_to (UTC) were all
-- admitted in [created_from, created_to): each stripe's settle bounds say how far a
-- settlement lies from its request's admission (the daily rebuild's rule, 80_reporting.sql).
-- The stripes are found through period_stripes_settled. Before the contract step of
-- 0.4.0 counted the bounds of the previous release's requests: any time.
CREATE OR REPLACE FUNCTION llm._settle_window(
    p_organization_id uuid, p_from date, p_to date, OUT created_from timestamptz, OUT created_to timestamptz)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM llm.upgrade_steps AS u WHERE u.step = 'settle_bounds') THEN
        created_from := '-infinity';
        created_to := 'infinity';
        RETURN;
    END IF;
    SELECT min(GREATEST(s.period_start::timestamp,
                        p_from::timestamp - pg_catalog.make_interval(hours => coalesce(s.settle_lag_hours, 0))))
               AT TIME ZONE 'UTC',
           max(LEAST(s.period_start + interval '1 month',
                     (p_to + 1)::timestamp + pg_catalog.make_interval(hours => coalesce(s.settle_lead_hours, 0))))
               AT TIME ZONE 'UTC'
      INTO created_from, created_to
      FROM llm.period_stripes AS s
     WHERE s.organization_id = p_organization_id
       AND (s.period_start + 32 + (coalesce(s.settle_lag_hours, 0) + 23) / 24) >= p_from
       AND s.period_start - (coalesce(s.settle_lead_hours, 0) + 23) / 24 <= p_to;
END
$$;
COMMENT ON FUNCTION llm._settle_window(uuid, date, date) IS
    'The admission times every request of the organization settled on the days p_from .. p_to (UTC) lies within, from its period stripes'' settle bounds (NULL: none can have); any time until the contract step of 0.4.0 counted them.';

CREATE OR REPLACE FUNCTION llm._ensure_period(p_organization_id uuid, p_period_start date)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_allowance bigint;
BEGIN
    -- Invariant 9: the month's first admission reads the allowance under a share
    -- lock of its organization, so an upsert_organization either committed first
    -- (its allowance is read here) or waits for this transaction and then moves
    -- the row created here. Only the first admission of a month pays for it.
    SELECT o.monthly_allowance_credits INTO v_allowance
      FROM llm.organizations AS o
     WHERE o.id = p_organization_id
       FOR SHARE;
    -- a concurrent first admission of the month may create it first: DO NOTHING
    INSERT INTO llm.period_heads (organization_id, period_start, period_end, allowance_credits)
    VALUES (p_organization_id, p_period_start, (p_period_start + interval '1 month')::date, v_allowance)
    ON CONFLICT (organization_id, period_start) DO NOTHING;
    -- its stripes: the caller locks the period and spreads the rooms
    PERFORM llm._add_stripes(p_organization_id, p_period_start,
                             (SELECT o.period_stripes FROM llm.organizations AS o WHERE o.id = p_organization_id));
END
$$;
COMMENT ON FUNCTION llm._ensure_period(uuid, date) IS
    'Creates the period (its head, with the organization''s allowance read under a share lock of the organization, so a concurrent upsert_organization cannot be lost: invariant 9, and its stripes) on first use.';

CREATE OR REPLACE FUNCTION llm._lock_period(p_organization_id uuid, p_period_start date)
RETURNS llm.period_heads
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_head llm.period_heads;
BEGIN
    PERFORM FROM llm.period_heads AS h
     WHERE h.organization_id = p_organization_id AND h.period_start = p_period_start;
    IF NOT FOUND THEN
        -- no stripe locked without its head: the caller creates the period first, and
        -- that waits for its organization (_ensure_period), which an upsert_organization
        -- holds while it waits for these stripes
        RETURN v_head;
    END IF;
    -- Stripe 0 first, on its own: every stripe is created under its lock (a raised
    -- stripe count spreads the rooms over new stripes on the exact path), or with the
    -- period itself. The statement that then locks them all takes its snapshot while
    -- this transaction holds stripe 0, so it sees every stripe there is. One statement
    -- for both would lock only the stripes its snapshot saw before it waited, and a
    -- stripe created meanwhile would move under a decision that assumes it cannot.
    PERFORM FROM llm.period_stripes AS s
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start
       AND s.stripe = 0
       FOR UPDATE;
    PERFORM FROM llm.period_stripes AS s
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start
     ORDER BY s.stripe
       FOR UPDATE;
    -- The head is read after the stripes are locked, not locked itself: its allowance
    -- changes only under the stripes' locks (upsert_organization), so a read now, after
    -- waiting for them, sees the last committed one.
    SELECT * INTO v_head FROM llm.period_heads AS h
     WHERE h.organization_id = p_organization_id AND h.period_start = p_period_start;
    RETURN v_head;
END
$$;
COMMENT ON FUNCTION llm._lock_period(uuid, date) IS
    'Locks a period for an exact decision (every stripe, in stripe order) and returns its head (NULL fields when the period does not exist yet).';

CREATE OR REPLACE FUNCTION llm._spread_rooms(p_organization_id uuid, p_period_start date, p_allowance bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_stripes integer;
    v_thresholds integer[];
    v_used bigint;
    v_held bigint;
    v_cents bigint;
    v_free bigint;
    v_cents_free bigint;
    v_next integer;
    v_need bigint;
BEGIN
    -- the caller holds the period (_lock_period)
    SELECT o.period_stripes, o.notice_thresholds INTO v_stripes, v_thresholds
      FROM llm.organizations AS o WHERE o.id = p_organization_id;
    -- the stripes admissions use now (more after set_period_stripes raised them)
    PERFORM llm._add_stripes(p_organization_id, p_period_start, v_stripes);
    SELECT sum(s.used_credits), sum(s.held_credits), sum(s.used_cents) INTO v_used, v_held, v_cents
      FROM llm.period_stripes AS s
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start;

    -- what the period has left: to its allowance, and never past the sum limit
    v_free := GREATEST(0, LEAST(coalesce(p_allowance, llm._max_sum()), llm._max_sum()) - v_used - v_held);
    -- No cents_room before the contract step of 0.4.0: a settlement of the previous
    -- release still running adds cents to a stripe without taking them from its
    -- cents_room, so a room spread now could promise a cent the period no longer has.
    -- A room of 0 promises none: a movement of cents takes the exact path, one of no
    -- cents (an admission, a release) still fits its stripe.
    v_cents_free := CASE WHEN llm._functions_only() THEN GREATEST(0, llm._max_sum() - v_cents) ELSE 0 END;
    IF p_allowance IS NOT NULL THEN
        -- the next threshold not reached yet and not notified (usage that fell back below
        -- a notified one makes no second notice), and how much usage reaches it
        SELECT min(t.pct) INTO v_next
          FROM pg_catalog.unnest(v_thresholds) AS t(pct)
         WHERE v_used::numeric * 100 < t.pct::numeric * p_allowance
           AND NOT EXISTS (SELECT FROM llm.threshold_notices AS n
                            WHERE n.organization_id = p_organization_id
                              AND n.scope = 'organization' AND n.budget_window = 'month'
                              AND n.period_start = p_period_start AND n.threshold_pct = t.pct);
        IF v_next IS NOT NULL THEN
            v_need := pg_catalog.ceil(v_next::numeric * p_allowance / 100)::bigint - v_used;
        END IF;
    END IF;
    -- an even share for each stripe in use (the remainder to the first ones), nothing
    -- for stripes beyond them, which only settle the holds they still carry
    UPDATE llm.period_stripes AS s
       SET admit_room = CASE WHEN s.stripe >= v_stripes THEN 0
                             ELSE v_free / v_stripes + (s.stripe < v_free % v_stripes)::integer END,
           cents_room = CASE WHEN s.stripe >= v_stripes THEN 0
                             ELSE v_cents_free / v_stripes + (s.stripe < v_cents_free % v_stripes)::integer END,
           notice_room = CASE WHEN v_need IS NULL THEN NULL
                              WHEN s.stripe >= v_stripes THEN 0
                              ELSE v_need / v_stripes + (s.stripe < v_need % v_stripes)::integer END
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start;
END
$$;
COMMENT ON FUNCTION llm._spread_rooms(uuid, date, bigint) IS
    'With the period locked: creates the stripes its organization uses now and gives each an even share of what the period has left (admit_room: to its allowance and the sum limit), of the cents it may still charge (cents_room: to the sum limit) and of the usage before its next threshold (notice_room).';

CREATE OR REPLACE FUNCTION llm._move_within_rooms(
    p_organization_id uuid, p_period_start date, p_stripe smallint,
    p_used bigint, p_held bigint, p_cents bigint, p_priced bigint,
    p_open integer, p_now timestamptz, p_lag integer, p_lead integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- Used grows by p_used (a charge), held by p_held (a hold, or minus a release). What
    -- the period has left shrinks by their sum, which must fit this stripe's admit_room;
    -- cents must fit its cents_room; used growing must stay within its notice_room. A
    -- NULL room (a stripe not spread yet) fits nothing: the exact path spreads it. The rooms never grow here: credits a
    -- release frees go back to the rooms at the next spread (a period already over its
    -- allowance has less left than a release frees), and usage that falls (a true-up
    -- below the recovery charge) takes the exact path, since it can bring a threshold
    -- passed without a notice back ahead.
    -- Its open requests change by p_open (an admission at p_now: +1; requests ending:
    -- minus them), and the settle bounds take p_lag and p_lead (NULL: none ended).
    UPDATE llm.period_stripes AS s
       SET used_credits = s.used_credits + p_used,
           held_credits = s.held_credits + p_held,
           used_cents = s.used_cents + p_cents,
           priced_nanos = s.priced_nanos + p_priced,
           admit_room = s.admit_room - GREATEST(0, p_used + p_held),
           cents_room = s.cents_room - p_cents,
           notice_room = s.notice_room - p_used,
           open_requests = s.open_requests + p_open,
           open_since = llm._open_since(s.open_requests, s.open_since, p_open, p_now),
           quiet = s.quiet AND p_open <= 0,
           settle_lag_hours = GREATEST(s.settle_lag_hours, p_lag),
           settle_lead_hours = GREATEST(s.settle_lead_hours, p_lead)
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start
       AND s.stripe = p_stripe
       AND p_used >= 0
       AND s.admit_room >= p_used + p_held
       AND s.cents_room >= p_cents
       -- a movement of nothing (an admission of 0) fits only a positive room: a room of
       -- 0 cannot tell a period with nothing left from one already over its allowance
       AND (s.admit_room > 0 OR p_used <> 0 OR p_held <> 0)
       AND (s.notice_room IS NULL OR p_used = 0 OR s.notice_room > p_used);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION llm._move_within_rooms(uuid, date, smallint, bigint, bigint, bigint, bigint, integer, timestamptz, integer, integer) IS
    'Moves one stripe''s counters, its open requests (p_open) and settle bounds in one row when the movement fits its rooms; false (nothing moved) otherwise, or when the stripe does not exist.';

-- p_open: +1 for an admission (at p_now), -1 for a request ending (admitted at
-- p_admitted_at), 0 for a true-up. No parameter has a default: 0.3.0's
-- _move_stripe(..., p_now, p_admission boolean DEFAULT false) lives on until the
-- contract step drops it, and a call of seven arguments from a 0.3.0 routine still
-- running would match both (42725, "not unique"). Long on purpose: the fast path and the exact path of
-- one movement, and the exact path's refusals, read top to bottom.
CREATE OR REPLACE FUNCTION llm._move_stripe(
    p_organization_id uuid, p_period_start date, p_stripe smallint,
    p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_now timestamptz,
    p_open integer, p_admitted_at timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_moved boolean;
    v_head llm.period_heads;
    v_used bigint;
    v_held bigint;
    v_cents bigint;
    v_lag integer := llm._hours_up(p_now - p_admitted_at);  -- NULL unless a request ends
    v_lead integer := llm._hours_up(p_admitted_at - p_now);
BEGIN
    -- fast: within the stripe's rooms (off stripe 0 in a subtransaction: see the top)
    IF p_stripe = 0 THEN
        v_moved := llm._move_within_rooms(p_organization_id, p_period_start, p_stripe, p_used, p_held, p_cents,
                                          p_priced, p_open, p_now, v_lag, v_lead);
    ELSE
        BEGIN
            IF NOT llm._move_within_rooms(p_organization_id, p_period_start, p_stripe,
                                          p_used, p_held, p_cents, p_priced, p_open, p_now, v_lag, v_lead) THEN
                -- internal: only rolls this subtransaction back, never leaves the function
                RAISE EXCEPTION 'llm: not within the stripe''s rooms' USING ERRCODE = 'LL099';
            END IF;
            v_moved := true;
        EXCEPTION WHEN SQLSTATE 'LL099' THEN
            v_moved := false;
        END;
    END IF;
    IF v_moved THEN
        RETURN;
    END IF;

    -- Exact: the movement does not fit its stripe's rooms (a hold beyond them, a measured
    -- overage) or could take the period across a threshold; or the period, or this
    -- stripe, does not exist yet (the month's first admission, a raised stripe count).
    v_head := llm._lock_period(p_organization_id, p_period_start);
    IF v_head.organization_id IS NULL THEN
        PERFORM llm._ensure_period(p_organization_id, p_period_start);
        v_head := llm._lock_period(p_organization_id, p_period_start);
    END IF;
    PERFORM llm._add_stripes(p_organization_id, p_period_start, p_stripe + 1);
    SELECT sum(s.used_credits), sum(s.held_credits), sum(s.used_cents) INTO v_used, v_held, v_cents
      FROM llm.period_stripes AS s
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start;
    -- CAP-PFM-LLM-007: admit iff used + held + estimate <= allowance over the whole period
    IF p_open > 0 AND v_head.allowance_credits IS NOT NULL
       AND v_used + v_held + p_held > v_head.allowance_credits THEN
        RAISE EXCEPTION 'llm: allowance exhausted for organization %', p_organization_id
            USING ERRCODE = 'LL001',
                  DETAIL = pg_catalog.format('allowance=%s used=%s held=%s estimate=%s period=%s',
                                             v_head.allowance_credits, v_used, v_held, p_held, p_period_start),
                  HINT = 'Wait for holds to settle, lower the estimate, or raise the allowance with llm.upsert_organization.',
                  SCHEMA = 'llm', TABLE = 'periods', CONSTRAINT = 'organization', COLUMN = 'month';
    END IF;
    -- the sum limit: used + held never grows past it, nor used cents (a hold, an overage)
    IF p_used + p_held > 0 AND v_used + v_held + p_used + p_held > llm._max_sum() THEN
        PERFORM llm._refuse_sum('periods', CASE WHEN p_held > 0 THEN 'held_credits' ELSE 'used_credits' END,
                                v_used::numeric + v_held + p_used + p_held,
                                pg_catalog.format('the period %s of organization %s', p_period_start, p_organization_id));
    END IF;
    IF p_cents > 0 AND v_cents + p_cents > llm._max_sum() THEN
        PERFORM llm._refuse_sum('periods', 'used_cents', v_cents::numeric + p_cents,
                                pg_catalog.format('the period %s of organization %s', p_period_start, p_organization_id));
    END IF;
    UPDATE llm.period_stripes AS s
       SET used_credits = s.used_credits + p_used,
           held_credits = s.held_credits + p_held,
           used_cents = s.used_cents + p_cents,
           priced_nanos = s.priced_nanos + p_priced,
           open_requests = s.open_requests + p_open,
           open_since = llm._open_since(s.open_requests, s.open_since, p_open, p_now),
           quiet = s.quiet AND p_open <= 0,
           settle_lag_hours = GREATEST(s.settle_lag_hours, v_lag),
           settle_lead_hours = GREATEST(s.settle_lead_hours, v_lead)
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start
       AND s.stripe = p_stripe;
    IF p_used > 0 THEN
        PERFORM llm._record_crossings(p_organization_id, p_period_start, v_used, v_used + p_used,
                                      v_head.allowance_credits, p_now);
    END IF;
    PERFORM llm._spread_rooms(p_organization_id, p_period_start, v_head.allowance_credits);
END
$$;
COMMENT ON FUNCTION llm._move_stripe(uuid, date, smallint, bigint, bigint, bigint, bigint, timestamptz, integer, timestamptz) IS
    'Moves one stripe''s counters (used + p_used, held + p_held, cents + p_cents, priced nanos + p_priced): in one row when it fits the stripe''s rooms, else under the period''s lock, refusing an admission that does not fit the whole period (LL001) and any movement that would take its used + held credits or used cents past the sum limit (LL013), recording the thresholds the period''s total crosses and spreading the rooms again.';
