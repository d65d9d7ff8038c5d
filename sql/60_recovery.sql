-- Recovery (WF-PFM-LLM-004, CAP-PFM-LLM-009): one organization's sweep is one
-- transaction of plain statements in the lock order of
-- docs/architecture.md "Lock order" (its requests taken with SKIP LOCKED: a live
-- settlement wins), so the sweep never waits on a row a settlement holds while
-- holding one it needs. What recovery charges follows the organization's
-- recovery_charge.
--
-- No client can stall a sweep: it waits at most settings.org_lock_timeout for
-- any one lock (55P03) and runs at most settings.org_time_budget, checked
-- between its statements (57014); the pass records either as that
-- organization's error and goes on.

CREATE OR REPLACE FUNCTION llm._bound_locks()
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_before text := pg_catalog.current_setting('lock_timeout');
    v_ms bigint := GREATEST(1, (pg_catalog.date_part('epoch', (llm._settings()).org_lock_timeout)
                                * 1000)::bigint);
BEGIN
    -- transaction-local; on the worker that runs the sweep under Citus
    PERFORM pg_catalog.set_config('lock_timeout', v_ms::text || 'ms', true);
    RETURN v_before;
END
$$;
COMMENT ON FUNCTION llm._bound_locks() IS
    'Sets lock_timeout to settings.org_lock_timeout for the rest of the transaction (or until restored); returns the value it replaced.';

CREATE OR REPLACE FUNCTION llm._check_deadline(p_organization_id uuid, p_deadline timestamptz, p_step text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF pg_catalog.clock_timestamp() > p_deadline THEN
        RAISE EXCEPTION 'llm: the sweep of organization % ran past its time budget (after %)',
                p_organization_id, p_step
            -- SCHEMA/TABLE/COLUMN tell this bound from a real cancel, which shares 57014
            USING ERRCODE = '57014', SCHEMA = 'llm', TABLE = 'settings', COLUMN = 'org_time_budget',
                  DETAIL = pg_catalog.format('deadline %s, settings.org_time_budget %s',
                                             p_deadline, (llm._settings()).org_time_budget),
                  HINT = 'Its work waits for the next pass; lower sweep_batch or raise org_time_budget if this repeats.';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_deadline(uuid, timestamptz, text) IS
    'Raises 57014 (column org_time_budget of llm.settings in its diagnostics) when clock_timestamp() is past p_deadline: the bound on one organization''s sweep, checked between its statements.';

CREATE OR REPLACE FUNCTION llm._abandon_stale_tasks(
    p_organization_id uuid, p_now timestamptz, p_cutoff timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_task record;
    v_count integer := 0;
BEGIN
    -- BR-CAP-PFM-LLM-009-05: stale running tasks become abandoned at detection time,
    -- with no duration and their totals kept; the compare on running loses to a close.
    FOR v_task IN
        UPDATE llm.executions AS x
           SET status = 'abandoned', ended_at = p_now, duration_ms = NULL
         WHERE x.organization_id = p_organization_id AND x.status = 'running'
           AND x.started_at <= p_cutoff
        RETURNING x.id, x.task_key, x.started_at, x.request_count, x.credits, x.cents
    LOOP
        RAISE LOG 'llm: abandoned execution % of organization % (task %, started %, requests %, credits %, cents %)',
            v_task.id, p_organization_id, v_task.task_key, v_task.started_at,
            v_task.request_count, v_task.credits, v_task.cents;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION llm._abandon_stale_tasks(uuid, timestamptz, timestamptz) IS
    'Marks the organization''s tasks running since p_cutoff or earlier abandoned at p_now (no duration, totals kept); returns how many.';

-- The open floor, raised (docs/architecture.md "The write path"): each stripe of the
-- organization with open requests admitted at p_cutoff or before starts at the earliest
-- of them still open, else at p_cutoff (its other open requests were admitted later);
-- a stripe with none open of a month ended by p_now is quiet, and leaves the index
-- period_stripes_open until an admission comes back to it. Each stripe is raised only
-- under its lock, taken in the lock order (row 9) with SKIP LOCKED: an
-- admission into it either committed before, and is read by the statement after the
-- lock, or waits and lowers open_since after; a stripe a call holds is left to the next
-- pass, so the sweep never waits on a live request (the stripes of the periods it
-- recovered into it holds already). One read of the requests per period, from its
-- stripes' earliest open_since to p_cutoff. Returns how many stripes it raised.
CREATE OR REPLACE FUNCTION llm._raise_open_floors(
    p_organization_id uuid, p_now timestamptz, p_cutoff timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_locked record;
    v_period date;
    v_since timestamptz;
    v_stripes smallint[];
    v_oldest timestamptz[];
    v_floor timestamptz;
    v_raised integer := 0;
BEGIN
    FOR v_period IN
        SELECT DISTINCT s.period_start FROM llm.period_stripes AS s
         WHERE s.organization_id = p_organization_id AND s.quiet IS NOT TRUE
           AND ((s.open_requests > 0 AND s.open_since <= p_cutoff)
                OR (s.open_requests = 0 AND s.period_start + interval '1 month' <= p_now AT TIME ZONE 'UTC'))
         ORDER BY s.period_start
    LOOP
        -- the period's stripes to raise or quiet, locked in stripe order, those a call holds skipped
        SELECT pg_catalog.array_agg(l.stripe ORDER BY l.stripe) AS stripes INTO v_locked
          FROM (SELECT s.stripe FROM llm.period_stripes AS s
                 WHERE s.organization_id = p_organization_id AND s.period_start = v_period
                   AND s.quiet IS NOT TRUE AND s.open_requests IS NOT NULL
                 ORDER BY s.stripe
                   FOR UPDATE SKIP LOCKED) AS l;
        CONTINUE WHEN v_locked.stripes IS NULL;
        -- what they hold now (a fresh snapshot, after the locks)
        SELECT min(s.open_since) INTO v_since
          FROM llm.period_stripes AS s
         WHERE s.organization_id = p_organization_id AND s.period_start = v_period
           AND s.stripe = ANY (v_locked.stripes) AND s.open_requests > 0 AND s.open_since <= p_cutoff;
        IF v_since IS NOT NULL THEN
            -- one table per statement (docs/architecture.md "Citus rules" 9)
            SELECT pg_catalog.array_agg(o.stripe ORDER BY o.stripe), pg_catalog.array_agg(o.oldest ORDER BY o.stripe)
              INTO v_stripes, v_oldest
              FROM (SELECT i.stripe, min(i.created_at) AS oldest
                      FROM llm.invocations AS i
                     WHERE i.organization_id = p_organization_id
                       AND i.created_at >= v_since AND i.created_at <= p_cutoff
                       AND i.period_start = v_period
                       AND i.status IN ('reserved', 'dispatched')
                     GROUP BY i.stripe) AS o;
            FOR v_i IN 1 .. pg_catalog.cardinality(v_locked.stripes) LOOP
                v_floor := coalesce(v_oldest[pg_catalog.array_position(v_stripes, v_locked.stripes[v_i]::smallint)],
                                    p_cutoff);
                UPDATE llm.period_stripes AS s
                   SET open_since = GREATEST(s.open_since, v_floor)
                 WHERE s.organization_id = p_organization_id AND s.period_start = v_period
                   AND s.stripe = v_locked.stripes[v_i] AND s.open_requests > 0 AND s.open_since < v_floor;
                v_raised := v_raised + 1;
            END LOOP;
        END IF;
        IF v_period + interval '1 month' <= p_now AT TIME ZONE 'UTC' THEN
            UPDATE llm.period_stripes AS s
               SET quiet = true
             WHERE s.organization_id = p_organization_id AND s.period_start = v_period
               AND s.stripe = ANY (v_locked.stripes) AND s.open_requests = 0 AND s.quiet IS NOT TRUE;
        END IF;
    END LOOP;
    RETURN v_raised;
END
$$;
COMMENT ON FUNCTION llm._raise_open_floors(uuid, timestamptz, timestamptz) IS
    'Raises the open_since of the organization''s stripes that start at p_cutoff or before to their earliest open request (else p_cutoff), and marks quiet the stripes with none open of months ended by p_now; each stripe under its lock, those a call holds skipped.';

-- Long on purpose: the lock order of docs/architecture.md "Lock order", written as its
-- numbered statements in that order over the same batch (v_ids), read top to bottom.
CREATE OR REPLACE FUNCTION llm._recover_stranded(
    p_organization_id uuid, p_now timestamptz, p_cutoff timestamptz, p_batch integer,
    p_recovery_charge text, INOUT p_sweep llm.org_sweep)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ids uuid[];
    v_invs llm.invocations[];  -- the same requests, recovered, for their budgets
    v_floor timestamptz := llm._open_floor(p_organization_id);
    v_period date;
    v_head llm.period_heads;
    v_old_used bigint;
    v_new_used bigint;
BEGIN
    -- BR-CAP-PFM-LLM-009-01/-03/-04/-07. The lock order is the settlement's
    -- (_end_invocation): requests, then their tasks, then their periods, then notices.
    -- Their ledger rows are derived from them (llm.ledger).

    -- 1. The requests: a bounded batch of the oldest stranded ones, locked and settled
    --    by recovery in one statement, read by admission time from the organization's
    --    open floor. SKIP LOCKED: a request a live settlement holds is left to it. The
    --    charge follows the organization's recovery_charge; no cents; the past-window
    --    alert is stamped once.
    WITH picked AS (
        SELECT i.id, i.past_window_alerted_at IS NULL AS first_alert,
               CASE WHEN p_recovery_charge = 'estimate'
                         OR (p_recovery_charge = 'dispatched' AND i.dispatched_at IS NOT NULL)
                    THEN i.estimate_credits ELSE 0 END AS charge
          FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id
           AND i.created_at >= v_floor AND i.created_at <= p_cutoff
           AND i.status IN ('reserved', 'dispatched')
         ORDER BY i.created_at, i.id
         LIMIT p_batch
           FOR UPDATE SKIP LOCKED
    ), recovered AS (
        UPDATE llm.invocations AS i
           SET status = 'settled', settlement_kind = 'recovered', settled_at = p_now,
               charged_credits = picked.charge, recovered_credits = picked.charge, charged_cents = NULL,
               past_window_alerted_at = coalesce(i.past_window_alerted_at, p_now)
          FROM picked
         WHERE i.organization_id = p_organization_id AND i.id = picked.id
           AND i.status IN ('reserved', 'dispatched')
        RETURNING i.id, i.hold_credits, picked.charge, i.estimate_credits, picked.first_alert,
                  i AS inv
    )
    SELECT pg_catalog.array_agg(r.id), pg_catalog.array_agg(r.inv), count(*),
           count(*) FILTER (WHERE r.charge = 0 AND r.estimate_credits > 0),
           coalesce(sum(r.hold_credits), 0), count(*) FILTER (WHERE r.first_alert)
      INTO v_ids, v_invs, p_sweep.recovered_requests, p_sweep.recovered_uncharged,
           p_sweep.released_hold_credits, p_sweep.past_window_alerts
      FROM recovered AS r;
    p_sweep.notices_created := 0;

    -- 2. Their tasks' totals (also of closed tasks, which never reopen).
    IF p_sweep.recovered_requests > 0 THEN
    UPDATE llm.executions AS x
       SET request_count = x.request_count + t.n, credits = x.credits + t.credits
      FROM (SELECT i.execution_id, count(*) AS n, sum(i.charged_credits) AS credits
              FROM llm.invocations AS i
             WHERE i.organization_id = p_organization_id AND i.id = ANY (v_ids)
               AND i.execution_id IS NOT NULL
             GROUP BY i.execution_id) AS t
     WHERE x.organization_id = p_organization_id AND x.id = t.execution_id;
    END IF;

    -- 3. Their periods, in period order, each locked for an exact decision (head, then
    --    its stripes in order): charge in, hold out on each request's stripe, its open
    --    requests fewer, its settle lag; then 4. one owed notice per threshold the
    --    period's total crossed; then the rooms.
    FOR v_period IN
        SELECT DISTINCT i.period_start
          FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id AND i.id = ANY (v_ids)
         ORDER BY i.period_start
    LOOP
        v_head := llm._lock_period(p_organization_id, v_period);
        SELECT sum(s.used_credits) INTO v_old_used
          FROM llm.period_stripes AS s
         WHERE s.organization_id = p_organization_id AND s.period_start = v_period;
        WITH moved AS (
            UPDATE llm.period_stripes AS s
               SET used_credits = s.used_credits + m.credits,
                   held_credits = s.held_credits - m.held,
                   open_requests = s.open_requests - m.n,
                   open_since = llm._open_since(s.open_requests, s.open_since, -m.n, NULL),
                   settle_lag_hours = GREATEST(s.settle_lag_hours, m.lag),
                   settle_lead_hours = GREATEST(s.settle_lead_hours, m.lead)
              FROM (SELECT i.stripe, sum(i.charged_credits)::bigint AS credits,
                           sum(i.hold_credits)::bigint AS held, count(*)::integer AS n,
                           max(llm._hours_up(i.settled_at - i.created_at)) AS lag,
                           max(llm._hours_up(i.created_at - i.settled_at)) AS lead
                      FROM llm.invocations AS i
                     WHERE i.organization_id = p_organization_id AND i.id = ANY (v_ids)
                       AND i.period_start = v_period
                     GROUP BY i.stripe) AS m
             WHERE s.organization_id = p_organization_id AND s.period_start = v_period
               AND s.stripe = m.stripe
            RETURNING m.credits
        )
        SELECT v_old_used + coalesce(sum(moved.credits), 0) INTO v_new_used FROM moved;
        p_sweep.notices_created := p_sweep.notices_created
            + llm._record_crossings(p_organization_id, v_period, v_old_used, v_new_used,
                                    v_head.allowance_credits, p_now);
        PERFORM llm._spread_rooms(p_organization_id, v_period, v_head.allowance_credits);
    END LOOP;
    -- The open floors, raised past what it recovered (and what recovered before), each
    -- stripe under its lock (held already for those periods, or skipped when a call holds it).
    PERFORM llm._raise_open_floors(p_organization_id, p_now, p_cutoff);
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    -- 5. The budgets they were admitted under: counters in lock order, after the
    --    periods, each moved like a settlement's (charge in, hold out), and the
    --    thresholds they crossed.
    p_sweep.notices_created := p_sweep.notices_created
        + llm._move_budgets(p_organization_id, v_invs, false, p_now);

    IF p_sweep.past_window_alerts > 0 THEN
        RAISE LOG 'llm: % request(s) of organization % were past the recovery window and were recovered',
            p_sweep.past_window_alerts, p_organization_id;
    END IF;
END
$$;
COMMENT ON FUNCTION llm._recover_stranded(uuid, timestamptz, timestamptz, integer, text, llm.org_sweep) IS
    'Recovers up to p_batch of the organization''s requests unsettled since p_cutoff, oldest first, charged per p_recovery_charge: releases their holds, adds to their tasks, moves their periods'' stripes (each period locked), then their budgets'' counters, and records crossed thresholds; fills the sweep''s figures.';

CREATE OR REPLACE FUNCTION llm._reconcile_org(
    p_organization_id uuid, p_now timestamptz, p_batch integer, p_run_id uuid)
RETURNS llm.org_sweep
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_settings llm.settings := llm._settings();
    v_cutoff timestamptz := p_now - v_settings.recovery_window;
    v_deadline timestamptz := pg_catalog.clock_timestamp() + v_settings.org_time_budget;
    v_lock_timeout text := llm._bound_locks();
    v_org llm.organizations;
    v_result llm.org_sweep;
BEGIN
    v_org := llm._operational_org(p_organization_id);
    -- one sweep of an organization at a time, and none beside its repricing
    PERFORM llm._lock_sweep_of(p_organization_id);
    v_result := ROW(p_organization_id, 0, 0, 0, 0, 0, 0, false, 0)::llm.org_sweep;

    -- Lock order of the whole sweep, one statement after the other: stale running
    -- tasks; then stranded requests, their tasks, their periods, their notices;
    -- then the organization's totals. A settlement locks request, task, period.
    v_result.abandoned_executions := llm._abandon_stale_tasks(p_organization_id, p_now, v_cutoff);
    PERFORM llm._check_deadline(p_organization_id, v_deadline, 'abandoning tasks');

    v_result := llm._recover_stranded(p_organization_id, p_now, v_cutoff,
                                      coalesce(p_batch, v_settings.sweep_batch),
                                      v_org.recovery_charge, v_result);
    PERFORM llm._check_deadline(p_organization_id, v_deadline, 'recovering requests');

    -- BR-CAP-PFM-LLM-009-04: whatever the batch left waits for the next pass (read from
    -- the raised open floor: no open request was admitted earlier)
    v_result.more_pending := EXISTS (
        SELECT FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id
           AND i.created_at >= llm._open_floor(p_organization_id) AND i.created_at <= v_cutoff
           AND i.status IN ('reserved', 'dispatched'));

    -- BR-CAP-PFM-LLM-009-06: compare recently closed tasks with their terminal requests;
    -- log and store both figures, change no totals.
    v_result.drift_findings := llm._refresh_drift(p_organization_id, p_now,
                                                  p_now - v_settings.drift_window, p_run_id);
    PERFORM llm._check_deadline(p_organization_id, v_deadline, 'checking drift');

    -- Retention: the counters of windows long ended (docs/architecture.md "Budgets")
    PERFORM llm._retain_budgets(p_organization_id, p_now, v_settings.budget_retention);

    -- BR-CAP-PFM-LLM-009-07: every recovery and past-window alert is counted where it
    -- happens, by the pass or by a direct call alike (monotonic totals)
    IF v_result.recovered_requests > 0 OR v_result.past_window_alerts > 0 THEN
        INSERT INTO llm.sweep_totals AS t
               (organization_id, recovered_requests, recovered_uncharged, past_window_alerts, updated_at)
        VALUES (p_organization_id, v_result.recovered_requests, v_result.recovered_uncharged,
                v_result.past_window_alerts, p_now)
        ON CONFLICT (organization_id) DO UPDATE
           SET recovered_requests = t.recovered_requests + excluded.recovered_requests,
               recovered_uncharged = t.recovered_uncharged + excluded.recovered_uncharged,
               past_window_alerts = t.past_window_alerts + excluded.past_window_alerts,
               updated_at = excluded.updated_at;
    END IF;
    PERFORM pg_catalog.set_config('lock_timeout', v_lock_timeout, true);  -- the caller's again
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION llm._reconcile_org(uuid, timestamptz, integer, uuid) IS
    'Distributed twin of reconcile_org; arguments already checked.';

CREATE OR REPLACE FUNCTION llm._refresh_drift(
    p_organization_id uuid, p_now timestamptz, p_since timestamptz, p_run_id uuid)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_row record;
    v_count integer := 0;
    v_findings uuid[];
BEGIN
    -- The tasks that have a finding: each is revisited whatever its age, so a finding
    -- is dropped once its task agrees again and every finding kept still holds
    -- (invariant 13); an old one is not reported again.
    SELECT pg_catalog.array_agg(f.execution_id) INTO v_findings
      FROM llm.drift_findings AS f WHERE f.organization_id = p_organization_id;
    -- Most organizations, most hours, closed no task inside the window and have no
    -- finding: for them these two probes (primary key, executions_closed index) are
    -- all the drift check costs; the per-task query below is planned afresh on every
    -- call, which was a large part of an idle pass's CPU (docs/benchmarks.md).
    PERFORM FROM llm.executions AS x
     WHERE x.organization_id = p_organization_id AND x.status <> 'running' AND x.ended_at >= p_since
     LIMIT 1;
    IF NOT FOUND AND v_findings IS NULL THEN
        RETURN 0;
    END IF;

    FOR v_row IN
        SELECT x.id, x.task_key, x.status, x.ended_at >= p_since AS recent,
               x.request_count, x.credits, x.cents,
               coalesce(s.n, 0) AS settled_n, coalesce(s.credits, 0) AS settled_credits,
               coalesce(s.cents, 0) AS settled_cents,
               (x.request_count, x.credits, x.cents)
                   IS DISTINCT FROM (coalesce(s.n, 0), coalesce(s.credits, 0), coalesce(s.cents, 0)) AS drifts
          FROM llm.executions AS x
          LEFT JOIN LATERAL (
                SELECT count(*) AS n, sum(i.charged_credits) AS credits,
                       sum(coalesce(i.charged_cents, 0)) AS cents
                  FROM llm.invocations AS i
                 WHERE i.organization_id = p_organization_id AND i.execution_id = x.id
                   AND i.status IN ('settled', 'failed')) AS s ON true
         WHERE x.organization_id = p_organization_id
           AND ((x.status <> 'running' AND x.ended_at >= p_since) OR x.id = ANY (v_findings))
    LOOP
        IF v_row.drifts AND v_row.recent THEN
            v_count := v_count + 1;
            RAISE LOG 'llm: drift in execution % of organization % (task %, %): recorded requests=% credits=% cents=%, settled requests=% credits=% cents=%',
                v_row.id, p_organization_id, v_row.task_key, v_row.status,
                v_row.request_count, v_row.credits, v_row.cents,
                v_row.settled_n, v_row.settled_credits, v_row.settled_cents;
            INSERT INTO llm.drift_findings AS f
                   (organization_id, execution_id, recorded_request_count, recorded_credits, recorded_cents,
                    settled_request_count, settled_credits, settled_cents, first_seen_at, last_seen_at, last_run_id)
            VALUES (p_organization_id, v_row.id, v_row.request_count, v_row.credits, v_row.cents,
                    v_row.settled_n, v_row.settled_credits, v_row.settled_cents, p_now, p_now, p_run_id)
            ON CONFLICT (organization_id, execution_id) DO UPDATE
               SET recorded_request_count = excluded.recorded_request_count,
                   recorded_credits = excluded.recorded_credits,
                   recorded_cents = excluded.recorded_cents,
                   settled_request_count = excluded.settled_request_count,
                   settled_credits = excluded.settled_credits,
                   settled_cents = excluded.settled_cents,
                   last_seen_at = excluded.last_seen_at,
                   last_run_id = excluded.last_run_id;
        ELSIF NOT v_row.drifts AND v_row.id = ANY (v_findings) THEN
            DELETE FROM llm.drift_findings AS f
             WHERE f.organization_id = p_organization_id AND f.execution_id = v_row.id;
        END IF;
    END LOOP;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION llm._refresh_drift(uuid, timestamptz, timestamptz, uuid) IS
    'Compares tasks closed since p_since with their terminal requests; stores and logs each disagreement, drops findings (of any age) that no longer disagree, changes no totals.';

CREATE OR REPLACE FUNCTION llm.reconcile_org(
    p_organization_id uuid, p_now timestamptz DEFAULT now(), p_batch integer DEFAULT NULL,
    p_run_id uuid DEFAULT NULL)
RETURNS llm.org_sweep
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_result llm.org_sweep;
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now);
    IF p_batch IS NOT NULL AND (p_batch < 1 OR p_batch > 100000) THEN
        RAISE EXCEPTION 'llm: batch % is out of range', p_batch
            USING ERRCODE = '22023', HINT = 'Pass 1 .. 100000, or NULL for settings.sweep_batch.';
    END IF;
    SELECT * INTO v_result
      FROM llm._reconcile_org(p_organization_id, coalesce(p_now, pg_catalog.now()), p_batch, p_run_id);
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION llm.reconcile_org(uuid, timestamptz, integer, uuid) IS
    'One organization''s recovery sweep in one transaction: abandons tasks running past the recovery window, recovers up to p_batch stranded requests at their estimate (oldest first), refreshes drift findings; returns its figures with more_pending. Bounded: 55P03 after settings.org_lock_timeout waiting for a lock, 57014 past settings.org_time_budget.';
