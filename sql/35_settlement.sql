-- Settlement (the end of the request lifecycle): settle with measured usage or
-- fail; a measured settlement or a failure arriving after recovery is kept for
-- audit or trues the books up (late_settlement). The booking of a terminal request and the
-- threshold crossings it records are shared with recovery (60_recovery.sql).
-- Every call is one transaction; the organization's period row is the hot row
-- and is always taken last (invocation -> execution -> period -> notices).

-- ---------------------------------------------------------------- booking

-- Inlinable (no SET clause, everything qualified). A threshold t (a whole
-- percentage) is crossed when old * 100 < t * allowance <= new * 100, which needs
-- a whole number in (old * 100 / allowance, new * 100 / allowance]: so unless
-- the integer quotients differ, no threshold can have been crossed and the
-- notice query is not run. Exact (numeric integer division), so never a miss.
CREATE OR REPLACE FUNCTION llm._may_cross(p_old_used bigint, p_new_used bigint, p_allowance bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_allowance OPERATOR(pg_catalog.>) 0::bigint
       AND pg_catalog.div(p_new_used::numeric OPERATOR(pg_catalog.*) 100::numeric, p_allowance::numeric)
           OPERATOR(pg_catalog.>)
           pg_catalog.div(p_old_used::numeric OPERATOR(pg_catalog.*) 100::numeric, p_allowance::numeric)
$$;
COMMENT ON FUNCTION llm._may_cross(bigint, bigint, bigint) IS
    'False when moving used credits from p_old_used to p_new_used cannot have crossed any whole-percent threshold of p_allowance (NULL when unlimited).';

-- The one place a threshold notice is owed: one per threshold of p_thresholds that
-- p_used stands at or above under p_allowance, at most one per (organization, scope,
-- id, window, window start, threshold) by the unique key, and NOTIFY llm_notices at
-- commit. The allowance's notices are (organization, NULL, month) of the period; a
-- budget's name its scope, real id and window, and p_period_start is its window's start.
CREATE OR REPLACE FUNCTION llm._owe_notices(
    p_organization_id uuid, p_period_start date, p_thresholds integer[], p_used bigint,
    p_allowance bigint, p_now timestamptz, p_scope text DEFAULT 'organization',
    p_scope_id text DEFAULT NULL, p_window text DEFAULT 'month')
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_created integer;
BEGIN
    INSERT INTO llm.threshold_notices
           (organization_id, scope, scope_id, budget_window, period_start, threshold_pct,
            crossed_at, used_credits, allowance_credits, next_attempt_at)
    SELECT p_organization_id, p_scope, p_scope_id, p_window, p_period_start, t.pct,
           p_now, p_used, p_allowance, p_now
      FROM pg_catalog.unnest(p_thresholds) AS t(pct)
     WHERE p_used::numeric * 100 >= t.pct::numeric * p_allowance
    ON CONFLICT (organization_id, scope, scope_id, budget_window, period_start, threshold_pct) DO NOTHING;
    GET DIAGNOSTICS v_created = ROW_COUNT;
    IF v_created > 0 THEN
        PERFORM llm._notify_notices_owed('created');  -- delivered at commit (llm-db worker)
    END IF;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._owe_notices(uuid, date, integer[], bigint, bigint, timestamptz, text, text, text) IS
    'Creates one owed notice (crossed at p_now) for every threshold of p_thresholds that p_used stands at or above under p_allowance and not notified yet; NOTIFY llm_notices at commit when it created one.';

CREATE OR REPLACE FUNCTION llm._record_crossings(
    p_organization_id uuid, p_period_start date, p_old_used bigint, p_new_used bigint,
    p_allowance bigint, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_crossed integer[];
BEGIN
    IF NOT coalesce(llm._may_cross(p_old_used, p_new_used, p_allowance), false) THEN
        RETURN 0;  -- unlimited, no movement, or no whole percentage passed
    END IF;
    -- the thresholds the old usage stood below: those the new one reaches were crossed
    SELECT ARRAY(SELECT t.pct FROM pg_catalog.unnest(o.notice_thresholds) AS t(pct)
                  WHERE p_old_used::numeric * 100 < t.pct::numeric * p_allowance)
      INTO v_crossed
      FROM llm.organizations AS o
     WHERE o.id = p_organization_id;
    RETURN llm._owe_notices(p_organization_id, p_period_start, v_crossed, p_new_used,
                            p_allowance, p_now);
END
$$;
COMMENT ON FUNCTION llm._record_crossings(uuid, date, bigint, bigint, bigint, timestamptz) IS
    'Creates one owed notice per threshold crossed when used credits moved from p_old_used to p_new_used; at most one per (organization, period, threshold); NOTIFY llm_notices at commit when it created one.';

-- A changed allowance or threshold list (upsert_organization) owes, by itself, every
-- threshold the period's used credits now stand at or above and that was not notified:
-- no movement crossed it, so _record_crossings never will (issue 20 defect 4). The
-- caller holds the period (_lock_period), so the used credits read here stay.
CREATE OR REPLACE FUNCTION llm._record_reached(
    p_organization_id uuid, p_period_start date, p_thresholds integer[], p_allowance bigint,
    p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_used bigint;
BEGIN
    IF p_allowance IS NULL THEN
        RETURN 0;  -- unlimited: no threshold has a level
    END IF;
    SELECT sum(s.used_credits) INTO v_used
      FROM llm.period_stripes AS s
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start;
    RETURN llm._owe_notices(p_organization_id, p_period_start, p_thresholds, v_used,
                            p_allowance, p_now);
END
$$;
COMMENT ON FUNCTION llm._record_reached(uuid, date, integer[], bigint, timestamptz) IS
    'With the period locked: creates one owed notice (crossed at p_now) for every threshold of p_thresholds its used credits stand at or above under p_allowance and not notified yet; NOTIFY llm_notices at commit when it created one. What an allowance or threshold-list change owes by itself.';

-- The booking of an invocation just made terminal: status, task totals, then its
-- stripe of the period (and, on the exact path, the period's notices), in that
-- lock order. The caller has locked the invocation row (_end_invocation's UPDATE
-- ... WHERE status IN ('reserved','dispatched')). Its ledger rows are derived (llm.ledger).
CREATE OR REPLACE FUNCTION llm._book_terminal(p_inv llm.invocations, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_charge bigint := p_inv.charged_credits;
    v_cents bigint := coalesce(p_inv.charged_cents, 0);
BEGIN
    IF p_inv.execution_id IS NOT NULL THEN
        UPDATE llm.executions AS x
           SET request_count = x.request_count + 1,
               credits = x.credits + v_charge,
               cents = x.cents + v_cents
         WHERE x.organization_id = p_inv.organization_id AND x.id = p_inv.execution_id;
    END IF;
    -- charge in, hold out; crossed thresholds recorded on the exact path
    PERFORM llm._move_stripe(p_inv.organization_id, p_inv.period_start, p_inv.stripe,
                             v_charge, -p_inv.hold_credits, v_cents, p_now);
    -- then the budgets it was admitted under, in their windows of its admission (most
    -- requests have none: one probe of the key of invocation_scopes)
    IF EXISTS (SELECT FROM llm.invocation_scopes AS s
                WHERE s.organization_id = p_inv.organization_id AND s.invocation_id = p_inv.id
                  AND s.budget_mask <> 0) THEN
        PERFORM llm._move_budgets(p_inv.organization_id, ARRAY[p_inv], false, p_now);
    END IF;
END
$$;
COMMENT ON FUNCTION llm._book_terminal(llm.invocations, timestamptz) IS
    'Books a just-terminated invocation: its task''s totals, then its stripe''s movement (charge in, hold out) and the threshold notices the period crosses, then its budgets'' counters and theirs.';

-- A live request ends here, settled (measured) or failed: compare-and-set on its
-- open status (a concurrent settlement or recovery wins, and this returns false),
-- then booked in the same transaction. Recovery ends its batch in 60_recovery.sql.
CREATE OR REPLACE FUNCTION llm._end_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_status text, p_error text,
    p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    UPDATE llm.invocations AS i
       SET status = p_status,
           settlement_kind = CASE WHEN p_status = 'settled' THEN 'measured' END,
           settled_at = p_now, error = p_error,
           charged_credits = p_credits, charged_cents = p_cents,
           input_tokens = p_input_tokens, output_tokens = p_output_tokens
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id
       AND i.status IN ('reserved', 'dispatched')
    RETURNING i.* INTO v_inv;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM llm._book_terminal(v_inv, p_now);
    RETURN true;
END
$$;
COMMENT ON FUNCTION llm._end_invocation(uuid, uuid, text, text, bigint, bigint, bigint, bigint, timestamptz) IS
    'Ends an open (reserved or dispatched) invocation as settled (measured) or failed with its charge and books it; false when it was no longer open.';

-- A true-up moves the daily usage of its request's settlement day by the signed
-- difference, whatever a concurrent rebuild of that day does (issue 20 defect 1).
-- The row it adds to is the latest committed one: the UPDATE waits for a rebuild that
-- deleted the row, then finds it gone; the INSERT then waits for the rebuild's new row
-- and adds to it (ON CONFLICT sees rows committed after the statement began). A rebuild
-- never counts this request's new figures, as they commit after the rebuild read them.
-- A day without the row (not rebuilt since the recovery) gets it computed from the
-- requests, this one included; a rebuild meeting that row rebuilds again (80_reporting).
CREATE OR REPLACE FUNCTION llm._true_up_daily_usage(p_inv llm.invocations, p_credits bigint, p_cents bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_day date := (p_inv.settled_at AT TIME ZONE 'UTC')::date;
    v_row llm.daily_usage;
BEGIN
    UPDATE llm.daily_usage AS d
       SET credits = d.credits + p_credits,
           cents = d.cents + p_cents,
           input_tokens = d.input_tokens + coalesce(p_inv.input_tokens, 0),
           output_tokens = d.output_tokens + coalesce(p_inv.output_tokens, 0)
     WHERE d.organization_id = p_inv.organization_id AND d.day = v_day AND d.model = p_inv.model;
    IF FOUND THEN
        RETURN;
    END IF;
    -- rare (a true-up before the pass rebuilt its recovery day): the row as a rebuild
    -- would give it now; one table per statement (docs/architecture.md "Citus rules" 9)
    SELECT p_inv.organization_id, v_day, p_inv.model, count(*),
           count(*) FILTER (WHERE i.settlement_kind IN ('recovered', 'trued_up')),
           coalesce(sum(i.charged_credits), 0), coalesce(sum(i.charged_cents), 0),
           coalesce(sum(i.input_tokens), 0), coalesce(sum(i.output_tokens), 0)
      INTO v_row.organization_id, v_row.day, v_row.model, v_row.requests, v_row.recovered_requests,
           v_row.credits, v_row.cents, v_row.input_tokens, v_row.output_tokens
      FROM llm.invocations AS i
     WHERE i.organization_id = p_inv.organization_id AND i.model = p_inv.model
       AND i.settled_at >= (v_day::timestamp AT TIME ZONE 'UTC')
       AND i.settled_at < ((v_day + 1)::timestamp AT TIME ZONE 'UTC');
    INSERT INTO llm.daily_usage AS d
           (organization_id, day, model, requests, recovered_requests, credits, cents,
            input_tokens, output_tokens)
    VALUES (v_row.organization_id, v_row.day, v_row.model, v_row.requests, v_row.recovered_requests,
            v_row.credits, v_row.cents, v_row.input_tokens, v_row.output_tokens)
    ON CONFLICT (organization_id, day, model) DO UPDATE
       SET credits = d.credits + p_credits,
           cents = d.cents + p_cents,
           input_tokens = d.input_tokens + coalesce(p_inv.input_tokens, 0),
           output_tokens = d.output_tokens + coalesce(p_inv.output_tokens, 0);
END
$$;
COMMENT ON FUNCTION llm._true_up_daily_usage(llm.invocations, bigint, bigint) IS
    'Moves the daily usage row of a trued-up request''s settlement day and model by the signed difference (inserting the row, computed from the requests, when the day has none); never lost to a concurrent rebuild_daily_usage.';

-- A recovered request trued up to its late measured settlement: the signed
-- difference moves its task, its own period (a closed month too) and the daily
-- usage of its settlement day (its 'adjustment' ledger row is derived); the same lock
-- order as _book_terminal (invocation -> execution -> period -> notices).
CREATE OR REPLACE FUNCTION llm._book_true_up(p_inv llm.invocations, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_credits bigint := p_inv.charged_credits - p_inv.recovered_credits;  -- signed
    v_cents bigint := coalesce(p_inv.charged_cents, 0);  -- recovery charged no cents
BEGIN
    -- its adjustment ledger row is derived from the request (llm.ledger)
    IF p_inv.execution_id IS NOT NULL THEN
        UPDATE llm.executions AS x
           SET credits = x.credits + v_credits, cents = x.cents + v_cents
         WHERE x.organization_id = p_inv.organization_id AND x.id = p_inv.execution_id;
    END IF;
    -- its own period's stripe (a closed month too); a rise records the thresholds it crosses
    PERFORM llm._move_stripe(p_inv.organization_id, p_inv.period_start, p_inv.stripe,
                             v_credits, 0, v_cents, p_now);
    -- the budgets it was admitted under, by the same difference
    PERFORM llm._move_budgets(p_inv.organization_id, ARRAY[p_inv], true, p_now);
    -- the daily usage of its settlement day, last: the cache the pass rebuilds
    PERFORM llm._true_up_daily_usage(p_inv, v_credits, v_cents);
END
$$;
COMMENT ON FUNCTION llm._book_true_up(llm.invocations, timestamptz) IS
    'Books a true-up by the signed difference (the request''s adjustment ledger row): the task''s totals, the stripe of the request''s period (crossings when usage rises) and the daily usage of its settlement day, in the settlement''s transaction.';

-- ---------------------------------------------------------------- settlement

CREATE OR REPLACE FUNCTION llm._terminal_outcome(p_organization_id uuid, p_invocation_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    SELECT * INTO v_inv FROM llm.invocations AS i
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_invocation(p_organization_id, p_invocation_id);
    END IF;
    RETURN CASE
        WHEN v_inv.status = 'failed' THEN 'already_failed'
        WHEN v_inv.settlement_kind = 'recovered' THEN 'already_recovered'
        ELSE 'already_settled'
    END;
END
$$;
COMMENT ON FUNCTION llm._terminal_outcome(uuid, uuid) IS
    'For an invocation that is no longer open: already_settled, already_recovered or already_failed (LL005 when unknown).';

-- A report on a request no longer open. Most are retries and get their already_*
-- answer. A late report: the worker comes back after recovery with its measured
-- settlement or its failure (a failure reports usage too: its partial charge, 0 by
-- default, as the provider charged nothing). The late_settlement policy in force now decides:
-- audit keeps the figures (and the error) in late_* and charges nothing; true_up
-- makes them the request's charge through _book_true_up. Either way only the first
-- late report counts: a request whose late figures were recorded is never trued up.
-- The request keeps its terminal status ('settled' by recovery).
CREATE OR REPLACE FUNCTION llm._settle_late(
    p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint,
    p_input_tokens bigint, p_output_tokens bigint, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_inv llm.invocations;
    v_outcome text;
    v_true_up boolean;
BEGIN
    v_outcome := llm._terminal_outcome(p_organization_id, p_invocation_id);  -- LL005 if unknown
    IF v_outcome <> 'already_recovered' THEN
        RETURN v_outcome;  -- settled, failed or trued up before: nothing changes
    END IF;
    SELECT o.late_settlement = 'true_up' INTO v_true_up
      FROM llm.organizations AS o WHERE o.id = p_organization_id;
    -- the compare on 'recovered' and no late report yet: one late report wins
    UPDATE llm.invocations AS i
       SET late_credits = p_credits, late_cents = p_cents,
           late_input_tokens = p_input_tokens, late_output_tokens = p_output_tokens,
           late_reported_at = p_now,
           error = p_error,  -- a recovered request has none; a late settlement has none
           settlement_kind = CASE WHEN v_true_up THEN 'trued_up' ELSE i.settlement_kind END,
           charged_credits = CASE WHEN v_true_up THEN p_credits ELSE i.charged_credits END,
           charged_cents = CASE WHEN v_true_up THEN p_cents ELSE i.charged_cents END,
           input_tokens = CASE WHEN v_true_up THEN p_input_tokens ELSE i.input_tokens END,
           output_tokens = CASE WHEN v_true_up THEN p_output_tokens ELSE i.output_tokens END
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id
       AND i.settlement_kind = 'recovered' AND i.late_reported_at IS NULL
    RETURNING i.* INTO v_inv;
    IF NOT FOUND THEN
        -- recorded before (already_recovered) or trued up by a concurrent call (already_settled)
        RETURN llm._terminal_outcome(p_organization_id, p_invocation_id);
    END IF;
    IF v_true_up THEN
        PERFORM llm._book_true_up(v_inv, p_now);
        RETURN 'trued_up';
    END IF;
    RETURN 'already_recovered';  -- audit: kept for audit, never charged
END
$$;
COMMENT ON FUNCTION llm._settle_late(uuid, uuid, text, bigint, bigint, bigint, bigint, timestamptz) IS
    'Answers a report (measured settlement or failure) on a request no longer open: its already_* outcome, except for the first late report of a recovered request, which under late_settlement = true_up becomes its charge (trued_up, the books moved by the signed difference) and under audit is recorded in late_* with its error (already_recovered).';

CREATE OR REPLACE FUNCTION llm._settle_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint,
    p_input_tokens bigint, p_output_tokens bigint, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF llm._end_invocation(p_organization_id, p_invocation_id, 'settled', NULL, p_credits, p_cents,
                           p_input_tokens, p_output_tokens, p_now) THEN
        RETURN 'settled';
    END IF;
    RETURN llm._settle_late(p_organization_id, p_invocation_id, NULL, p_credits, p_cents,
                            p_input_tokens, p_output_tokens, p_now);
END
$$;
COMMENT ON FUNCTION llm._settle_invocation(uuid, uuid, bigint, bigint, bigint, bigint, timestamptz) IS
    'Distributed twin of settle_invocation; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.settle_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint,
    p_input_tokens bigint DEFAULT NULL, p_output_tokens bigint DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL
            AND llm._amount_ok(p_credits) AND llm._amount_ok(p_cents)
            AND llm._amount_ok(p_input_tokens, true) AND llm._amount_ok(p_output_tokens, true)) IS NOT TRUE THEN
        PERFORM llm._check_call(p_organization_id, p_now, 'invocation', p_invocation_id);
        PERFORM llm._check_amount('p_credits', p_credits);
        PERFORM llm._check_amount('p_cents', p_cents);
        PERFORM llm._check_amount('p_input_tokens', p_input_tokens, true);
        PERFORM llm._check_amount('p_output_tokens', p_output_tokens, true);
    END IF;
    SELECT s INTO v_outcome
      FROM llm._settle_invocation(p_organization_id, p_invocation_id, p_credits, p_cents,
                                  p_input_tokens, p_output_tokens, coalesce(p_now, pg_catalog.now())) AS s;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION llm.settle_invocation(uuid, uuid, bigint, bigint, bigint, bigint, timestamptz) IS
    'Settles a request with measured usage: charges it once, releases its hold, moves its own period, adds to its task and records crossed thresholds. Returns settled, or already_settled / already_recovered / already_failed with nothing charged; under late_settlement = true_up the first measured settlement of a recovered request returns trued_up and moves the books by the signed difference.';

CREATE OR REPLACE FUNCTION llm._fail_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint,
    p_now timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF llm._end_invocation(p_organization_id, p_invocation_id, 'failed', p_error, p_credits, p_cents,
                           NULL, NULL, p_now) THEN
        RETURN 'failed';
    END IF;
    -- a late failure reports usage too: the partial charge it names (0: none)
    RETURN llm._settle_late(p_organization_id, p_invocation_id, p_error, p_credits, p_cents,
                            NULL, NULL, p_now);
END
$$;
COMMENT ON FUNCTION llm._fail_invocation(uuid, uuid, text, bigint, bigint, timestamptz) IS
    'Distributed twin of fail_invocation; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.fail_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_error text,
    p_credits bigint DEFAULT 0, p_cents bigint DEFAULT 0, p_now timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL
            AND llm._text_ok(p_error, 4000) AND llm._amount_ok(p_credits) AND llm._amount_ok(p_cents)) IS NOT TRUE THEN
        PERFORM llm._check_call(p_organization_id, p_now, 'invocation', p_invocation_id);
        PERFORM llm._check_text('p_error', p_error, 4000);
        PERFORM llm._check_amount('p_credits', p_credits);
        PERFORM llm._check_amount('p_cents', p_cents);
    END IF;
    SELECT f INTO v_outcome
      FROM llm._fail_invocation(p_organization_id, p_invocation_id, p_error, p_credits, p_cents,
                                coalesce(p_now, pg_catalog.now())) AS f;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION llm.fail_invocation(uuid, uuid, text, bigint, bigint, timestamptz) IS
    'Fails a request: releases its hold and charges the optional partial usage once. Returns failed, or already_settled / already_recovered / already_failed with nothing changed; the first failure of a recovered request is a late report: under late_settlement = true_up it returns trued_up and moves the books to its partial charge by the signed difference, under audit it records its figures and error and returns already_recovered.';
