-- Requests (CAP-PFM-LLM-007 admission and the request lifecycle):
-- admit with a hold, mark dispatched, settle with measured usage or fail.
-- Every call is one transaction; the organization's period row is the hot row
-- and is always taken last (invocation -> execution -> period -> notices).

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

CREATE OR REPLACE FUNCTION llm._record_crossings(
    p_organization_id uuid, p_period_start date, p_old_used bigint, p_new_used bigint,
    p_allowance bigint, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_created integer;
BEGIN
    IF NOT coalesce(llm._may_cross(p_old_used, p_new_used, p_allowance), false) THEN
        RETURN 0;  -- unlimited, no movement, or no whole percentage passed
    END IF;
    -- one owed notice for every threshold this movement crossed (below -> at or above)
    INSERT INTO llm.threshold_notices
           (organization_id, period_start, threshold_pct, crossed_at, used_credits,
            allowance_credits, next_attempt_at)
    SELECT p_organization_id, p_period_start, t.pct, p_now, p_new_used, p_allowance, p_now
      FROM llm.organizations AS o
     CROSS JOIN LATERAL pg_catalog.unnest(o.notice_thresholds) AS t(pct)
     WHERE o.id = p_organization_id
       AND p_old_used::numeric * 100 < t.pct::numeric * p_allowance
       AND p_new_used::numeric * 100 >= t.pct::numeric * p_allowance
    ON CONFLICT (organization_id, period_start, threshold_pct) DO NOTHING;
    GET DIAGNOSTICS v_created = ROW_COUNT;
    IF v_created > 0 THEN
        PERFORM llm._notify_notices_owed('created');  -- delivered at commit (llm-db worker)
    END IF;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._record_crossings(uuid, date, bigint, bigint, bigint, timestamptz) IS
    'Creates one owed notice per threshold crossed when used credits moved from p_old_used to p_new_used; at most one per (organization, period, threshold); NOTIFY llm_notices at commit when it created one.';

-- The one place an invocation becomes terminal: status, task totals, then its
-- stripe of the period (and, on the exact path, the period's notices), in that
-- lock order. The caller has locked the invocation row (UPDATE ... WHERE status
-- IN ('reserved','dispatched')). Its ledger rows are derived (llm.ledger).
CREATE OR REPLACE FUNCTION llm._book_terminal(p_inv llm.invocations, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, llm, pg_temp
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
END
$$;
COMMENT ON FUNCTION llm._book_terminal(llm.invocations, timestamptz) IS
    'Books a just-terminated invocation: its task''s totals, then its stripe''s movement (charge in, hold out) and the threshold notices the period crosses.';

-- A recovered request trued up to its late measured settlement: the signed
-- difference moves its task, its own period (a closed month too) and the daily
-- usage of its settlement day (its 'adjustment' ledger row is derived); the same lock
-- order as _book_terminal (invocation -> execution -> period -> notices).
CREATE OR REPLACE FUNCTION llm._book_true_up(p_inv llm.invocations, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, llm, pg_temp
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

    -- the day's row as a rebuild would give it now (a day not built yet is built by the pass)
    UPDATE llm.daily_usage AS d
       SET credits = d.credits + v_credits,
           cents = d.cents + v_cents,
           input_tokens = d.input_tokens + coalesce(p_inv.input_tokens, 0),
           output_tokens = d.output_tokens + coalesce(p_inv.output_tokens, 0)
     WHERE d.organization_id = p_inv.organization_id
       AND d.day = (p_inv.settled_at AT TIME ZONE 'UTC')::date
       AND d.model = p_inv.model;
END
$$;
COMMENT ON FUNCTION llm._book_true_up(llm.invocations, timestamptz) IS
    'Books a true-up by the signed difference (the request''s adjustment ledger row): the task''s totals, the stripe of the request''s period (crossings when usage rises) and the daily usage of its settlement day, in the settlement''s transaction.';

-- ---------------------------------------------------------------- admission

CREATE OR REPLACE FUNCTION llm._admit_invocation(
    p_organization_id uuid, p_estimate_credits bigint, p_model text,
    p_execution_id uuid, p_invocation_id uuid, p_now timestamptz)
RETURNS llm.invocations
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_org_status text;
    v_stripes integer;
    v_stripe smallint;
    v_inv llm.invocations;
    v_exec_status text;
    v_period date := llm._period_start(p_now);
BEGIN
    SELECT o.status, o.period_stripes INTO v_org_status, v_stripes
      FROM llm.organizations AS o
     WHERE o.id = p_organization_id;
    IF v_org_status IS DISTINCT FROM 'operational' THEN
        PERFORM llm._operational_org(p_organization_id);  -- raises LL002 (unknown) or LL003
    END IF;

    IF p_execution_id IS NOT NULL THEN
        SELECT x.status INTO v_exec_status
          FROM llm.executions AS x
         WHERE x.organization_id = p_organization_id AND x.id = p_execution_id;
        IF NOT FOUND THEN
            PERFORM llm._raise_unknown_execution(p_organization_id, p_execution_id);
        END IF;
    END IF;

    IF v_exec_status IS DISTINCT FROM 'running' AND p_execution_id IS NOT NULL THEN
        -- a retry of a request admitted while its task ran still returns it
        IF p_invocation_id IS NOT NULL THEN
            SELECT * INTO v_inv FROM llm.invocations AS i
             WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
            IF FOUND THEN
                RETURN llm._same_admission(v_inv, p_estimate_credits, p_model, p_execution_id);
            END IF;
        END IF;
        RAISE EXCEPTION 'llm: execution % is %', p_execution_id, v_exec_status
            USING ERRCODE = 'LL009',
                  DETAIL = 'Only a running execution admits new requests.',
                  HINT = 'Open a new execution for new work.';
    END IF;

    -- This session's stripe: concurrent sessions of one organization hold on
    -- different rows (a session keeps its stripe, and its cache lines, between calls).
    v_stripe := pg_catalog.mod(pg_catalog.pg_backend_pid(), v_stripes)::smallint;
    INSERT INTO llm.invocations AS i
           (organization_id, id, period_start, execution_id, model, status,
            estimate_credits, hold_credits, created_at, stripe)
    VALUES (p_organization_id, coalesce(p_invocation_id, pg_catalog.gen_random_uuid()), v_period,
            p_execution_id, p_model, 'reserved', p_estimate_credits, p_estimate_credits, p_now, v_stripe)
    ON CONFLICT (organization_id, id) DO NOTHING
    RETURNING i.* INTO v_inv;
    IF NOT FOUND THEN
        -- A retried id (admitted before, or concurrently and committed since): the same
        -- arguments return the first admission and place no second hold; others LL007.
        SELECT * INTO STRICT v_inv FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
        RETURN llm._same_admission(v_inv, p_estimate_credits, p_model, p_execution_id);
    END IF;

    -- The hot row last: the hold from this stripe's room, in one row; else the exact
    -- path (the period locked, LL001 unless used + held + estimate <= allowance, the
    -- period created on its month's first admission).
    PERFORM llm._move_stripe(p_organization_id, v_period, v_stripe, 0, p_estimate_credits, 0, p_now, true);
    RETURN v_inv;
END
$$;
COMMENT ON FUNCTION llm._admit_invocation(uuid, bigint, text, uuid, uuid, timestamptz) IS
    'Distributed twin of admit_invocation; arguments already checked.';

CREATE OR REPLACE FUNCTION llm._same_admission(
    p_inv llm.invocations, p_estimate_credits bigint, p_model text, p_execution_id uuid)
RETURNS llm.invocations
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, llm, pg_temp
AS $$
BEGIN
    IF p_inv.estimate_credits IS DISTINCT FROM p_estimate_credits
       OR p_inv.model IS DISTINCT FROM p_model
       OR p_inv.execution_id IS DISTINCT FROM p_execution_id THEN
        RAISE EXCEPTION 'llm: invocation % was admitted with different arguments', p_inv.id
            USING ERRCODE = 'LL007',
                  DETAIL = pg_catalog.format('stored: estimate=%s model=%s execution=%s; given: estimate=%s model=%s execution=%s',
                                             p_inv.estimate_credits, p_inv.model, p_inv.execution_id,
                                             p_estimate_credits, p_model, p_execution_id),
                  HINT = 'Use a new invocation id for a new request; reuse an id only to retry the same one.';
    END IF;
    RETURN p_inv;
END
$$;
COMMENT ON FUNCTION llm._same_admission(llm.invocations, bigint, text, uuid) IS
    'Returns the stored invocation when a retried admission repeats its arguments, else raises LL007.';

CREATE OR REPLACE FUNCTION llm.admit_invocation(
    p_organization_id uuid, p_estimate_credits bigint, p_model text,
    p_execution_id uuid DEFAULT NULL, p_invocation_id uuid DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS llm.invocations
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now)
            AND llm._amount_ok(p_estimate_credits) AND llm._text_ok(p_model, 200)) IS NOT TRUE THEN
        PERFORM llm._require_org_id(p_organization_id);
        PERFORM llm._check_clock(p_now);
        PERFORM llm._check_amount('p_estimate_credits', p_estimate_credits);
        PERFORM llm._check_text('p_model', p_model, 200);
    END IF;
    SELECT * INTO v_inv
      FROM llm._admit_invocation(p_organization_id, p_estimate_credits, p_model, p_execution_id,
                                 p_invocation_id, coalesce(p_now, pg_catalog.now()));
    RETURN v_inv;
END
$$;
COMMENT ON FUNCTION llm.admit_invocation(uuid, bigint, text, uuid, uuid, timestamptz) IS
    'Admits a request iff used + held + estimate <= allowance and places its hold on the current period (LL001 otherwise); a repeated p_invocation_id with the same arguments returns the first admission, with different ones LL007.';

-- ---------------------------------------------------------------- dispatch

CREATE OR REPLACE FUNCTION llm._mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamptz)
RETURNS llm.invocations
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    UPDATE llm.invocations AS i
       SET status = 'dispatched', dispatched_at = p_now
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id AND i.status = 'reserved'
    RETURNING i.* INTO v_inv;
    IF FOUND THEN
        RETURN v_inv;
    END IF;
    SELECT * INTO v_inv FROM llm.invocations AS i
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_invocation(p_organization_id, p_invocation_id);
    ELSIF v_inv.status <> 'dispatched' THEN
        RAISE EXCEPTION 'llm: invocation % is already %', p_invocation_id, v_inv.status
            USING ERRCODE = 'LL009',
                  DETAIL = pg_catalog.format('status=%s settlement_kind=%s', v_inv.status, v_inv.settlement_kind),
                  HINT = 'A terminal request must not be sent to the provider; admit a new one.';
    END IF;
    RETURN v_inv;  -- already dispatched: idempotent
END
$$;
COMMENT ON FUNCTION llm._mark_dispatched(uuid, uuid, timestamptz) IS
    'Distributed twin of mark_dispatched; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.mark_dispatched(
    p_organization_id uuid, p_invocation_id uuid, p_now timestamptz DEFAULT now())
RETURNS llm.invocations
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL) IS NOT TRUE THEN
        PERFORM llm._require_org_id(p_organization_id);
        PERFORM llm._check_clock(p_now);
        PERFORM llm._require_invocation_id(p_invocation_id);
    END IF;
    SELECT * INTO v_inv
      FROM llm._mark_dispatched(p_organization_id, p_invocation_id, coalesce(p_now, pg_catalog.now()));
    RETURN v_inv;
END
$$;
COMMENT ON FUNCTION llm.mark_dispatched(uuid, uuid, timestamptz) IS
    'Marks a reserved request as sent to the provider (idempotent when already dispatched); LL009 when it is already terminal.';

-- ---------------------------------------------------------------- settlement

CREATE OR REPLACE FUNCTION llm._terminal_outcome(p_organization_id uuid, p_invocation_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, llm, pg_temp
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

CREATE OR REPLACE FUNCTION llm._settle_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint,
    p_input_tokens bigint, p_output_tokens bigint, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_inv llm.invocations;
    v_outcome text;
    v_policy text;
BEGIN
    UPDATE llm.invocations AS i
       SET status = 'settled', settlement_kind = 'measured', settled_at = p_now,
           charged_credits = p_credits, charged_cents = p_cents,
           input_tokens = p_input_tokens, output_tokens = p_output_tokens
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id
       AND i.status IN ('reserved', 'dispatched')
    RETURNING i.* INTO v_inv;
    IF FOUND THEN
        PERFORM llm._book_terminal(v_inv, p_now);
        RETURN 'settled';
    END IF;

    v_outcome := llm._terminal_outcome(p_organization_id, p_invocation_id);
    IF v_outcome <> 'already_recovered' THEN
        RETURN v_outcome;
    END IF;
    -- The worker came back after recovery. The late_settlement policy in force now
    -- decides; a request whose late figures were already recorded is never trued up.
    SELECT o.late_settlement INTO v_policy FROM llm.organizations AS o WHERE o.id = p_organization_id;
    UPDATE llm.invocations AS i
       SET late_credits = p_credits, late_cents = p_cents,
           late_input_tokens = p_input_tokens, late_output_tokens = p_output_tokens,
           late_reported_at = p_now,
           settlement_kind = CASE WHEN v_policy = 'true_up' THEN 'trued_up' ELSE i.settlement_kind END,
           charged_credits = CASE WHEN v_policy = 'true_up' THEN p_credits ELSE i.charged_credits END,
           charged_cents = CASE WHEN v_policy = 'true_up' THEN p_cents ELSE i.charged_cents END,
           input_tokens = CASE WHEN v_policy = 'true_up' THEN p_input_tokens ELSE i.input_tokens END,
           output_tokens = CASE WHEN v_policy = 'true_up' THEN p_output_tokens ELSE i.output_tokens END
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id
       AND i.settlement_kind = 'recovered' AND i.late_reported_at IS NULL
    RETURNING i.* INTO v_inv;
    IF NOT FOUND THEN
        -- recorded before (already_recovered) or trued up by a concurrent call (already_settled)
        RETURN llm._terminal_outcome(p_organization_id, p_invocation_id);
    END IF;
    IF v_policy = 'true_up' THEN
        PERFORM llm._book_true_up(v_inv, p_now);
        RETURN 'trued_up';
    END IF;
    RETURN 'already_recovered';  -- audit: kept for audit, never charged
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
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL
            AND llm._amount_ok(p_credits) AND llm._amount_ok(p_cents)
            AND llm._amount_ok(p_input_tokens, true) AND llm._amount_ok(p_output_tokens, true)) IS NOT TRUE THEN
        PERFORM llm._require_org_id(p_organization_id);
        PERFORM llm._check_clock(p_now);
        PERFORM llm._require_invocation_id(p_invocation_id);
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
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    UPDATE llm.invocations AS i
       SET status = 'failed', settled_at = p_now, error = p_error,
           charged_credits = p_credits, charged_cents = p_cents
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id
       AND i.status IN ('reserved', 'dispatched')
    RETURNING i.* INTO v_inv;
    IF FOUND THEN
        PERFORM llm._book_terminal(v_inv, p_now);
        RETURN 'failed';
    END IF;
    RETURN llm._terminal_outcome(p_organization_id, p_invocation_id);
END
$$;
COMMENT ON FUNCTION llm._fail_invocation(uuid, uuid, text, bigint, bigint, timestamptz) IS
    'Distributed twin of fail_invocation; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.fail_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_error text,
    p_credits bigint DEFAULT 0, p_cents bigint DEFAULT 0, p_now timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL
            AND llm._text_ok(p_error, 4000) AND llm._amount_ok(p_credits) AND llm._amount_ok(p_cents)) IS NOT TRUE THEN
        PERFORM llm._require_org_id(p_organization_id);
        PERFORM llm._check_clock(p_now);
        PERFORM llm._require_invocation_id(p_invocation_id);
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
    'Fails a request: releases its hold and charges the optional partial usage once. Returns failed, or already_settled / already_recovered / already_failed with nothing changed.';
