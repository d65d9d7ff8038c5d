-- The daily audit of every period counter (docs/architecture.md, "The daily audit"):
-- each organization's current and previous period (used credits, used cents,
-- held credits) recomputed from its requests at least once every 24 hours, and
-- every older period with an unresolved finding. A mismatch is a finding in
-- llm.period_findings, logged and counted, never repaired; a finding that no
-- longer holds is resolved. The budget counters of the windows containing the
-- audit's clock and of the windows before them are recomputed too:
-- a mismatch is logged and counted with the periods' findings, never repaired.

-- The budget counters of the current and the previous day, week and month that
-- disagree with their requests (invariant 14, on those windows only), logged as
-- WARNINGs; returns how many. Counters and requests in one statement, so one
-- snapshot: a movement moves a request and its counters in one transaction. The
-- previous week and month start in the previous period at the earliest, so the
-- requests are those admitted in the two periods (index invocations_created; a
-- counter is the sum of its stripes). A missing
-- counter is a finding unless retention may have deleted it (invariant 14: its
-- window ended on or before the organization's horizon, no open request under it).
CREATE OR REPLACE FUNCTION llm._audit_budgets(p_organization_id uuid, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_current date := llm._period_start(p_now);
    v_windows date[] := ARRAY[llm._window_start('day', p_now), llm._window_start('day', p_now - interval '1 day'),
                              llm._window_start('week', p_now), llm._window_start('week', p_now - interval '7 days'),
                              llm._window_start('month', p_now), llm._window_start('month', p_now - interval '1 month')];
    v_counter record;
    v_found integer := 0;
    v_horizon date;
BEGIN
    SELECT h.horizon INTO v_horizon FROM llm.budget_horizons AS h WHERE h.organization_id = p_organization_id;
    FOR v_counter IN
        SELECT coalesce(c.scope, r.scope) AS scope, coalesce(c.scope_id, r.scope_id) AS scope_id,
               coalesce(c.budget_window, r.budget_window) AS budget_window,
               coalesce(c.window_start, r.window_start) AS window_start,
               c.used_credits AS recorded_used, coalesce(r.used, 0) AS computed_used,
               c.used_cents AS recorded_cents, coalesce(r.cents, 0) AS computed_cents,
               c.held_credits AS recorded_held, coalesce(r.held, 0) AS computed_held
          FROM (SELECT b.scope, b.scope_id, b.budget_window, b.window_start,
                       sum(b.used_credits)::bigint AS used_credits, sum(b.used_cents)::bigint AS used_cents,
                       sum(b.held_credits)::bigint AS held_credits
                  FROM llm.budget_counters AS b
                 WHERE b.organization_id = p_organization_id
                   AND b.window_start = ANY (v_windows)
                 GROUP BY b.scope, b.scope_id, b.budget_window, b.window_start) AS c
          FULL JOIN (
                SELECT k.scope, k.scope_id, k.budget_window, k.window_start,
                       sum(k.charged_credits) FILTER (WHERE k.status IN ('settled', 'failed'))::bigint AS used,
                       sum(coalesce(k.charged_cents, 0)) FILTER (WHERE k.status IN ('settled', 'failed'))::bigint AS cents,
                       sum(k.hold_credits) FILTER (WHERE k.status IN ('reserved', 'dispatched'))::bigint AS held
                  FROM llm._invocation_budget_keys AS k
                 WHERE k.organization_id = p_organization_id
                   AND k.created_at >= ((v_current - interval '1 month') AT TIME ZONE 'UTC')
                   AND k.created_at < ((v_current + interval '1 month') AT TIME ZONE 'UTC')
                 GROUP BY 1, 2, 3, 4) AS r
            ON r.scope = c.scope AND r.scope_id IS NOT DISTINCT FROM c.scope_id
           AND r.budget_window = c.budget_window AND r.window_start = c.window_start
         -- a window start is current or previous for its own window
         WHERE coalesce(c.window_start, r.window_start)
               IN (llm._window_start(coalesce(c.budget_window, r.budget_window), p_now),
                   llm._window_start(coalesce(c.budget_window, r.budget_window),
                                     p_now - ('1 ' || coalesce(c.budget_window, r.budget_window))::interval))
           AND CASE WHEN c.scope IS NULL
                    THEN r.held IS NOT NULL OR v_horizon IS NULL
                         OR llm._window_end(r.budget_window, r.window_start) > v_horizon
                    ELSE (c.used_credits, c.used_cents, c.held_credits)
                         IS DISTINCT FROM (coalesce(r.used, 0), coalesce(r.cents, 0), coalesce(r.held, 0)) END
         ORDER BY 1, 2, 3, 4
    LOOP
        v_found := v_found + 1;
        -- 'none': the counter is missing where retention could not have deleted it
        RAISE WARNING 'llm: budget counter % % % % of organization % disagrees with its requests: used credits % (requests say %), used cents % (%), held credits % (%)',
            v_counter.scope, coalesce(v_counter.scope_id, '-'), v_counter.budget_window, v_counter.window_start,
            p_organization_id, coalesce(v_counter.recorded_used::text, 'none'), v_counter.computed_used,
            coalesce(v_counter.recorded_cents::text, 'none'), v_counter.computed_cents,
            coalesce(v_counter.recorded_held::text, 'none'), v_counter.computed_held;
    END LOOP;
    RETURN v_found;
END
$$;
COMMENT ON FUNCTION llm._audit_budgets(uuid, timestamptz) IS
    'Recomputes the organization''s budget counters of the day, week and month containing p_now and of the ones before them from their requests in one statement; logs (WARNING) and returns how many disagree. Never repairs.';

-- Long on purpose: one statement (one snapshot) reads the periods, and each period
-- is recorded or resolved in the same loop; most of the length is the findings row.
CREATE OR REPLACE FUNCTION llm._audit_org(p_organization_id uuid, p_now timestamptz, p_run_id uuid)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_current date := llm._period_start(p_now);
    v_due timestamptz;
    v_period record;
    v_found integer := 0;
    v_next timestamptz;
    v_first timestamptz;
    v_open date[];
BEGIN
    SELECT t.audit_due_at INTO v_due FROM llm.sweep_totals AS t WHERE t.organization_id = p_organization_id;
    IF v_due > p_now THEN
        RETURN NULL;  -- audited within the last 23 hours: not due
    END IF;

    -- Periods with an unresolved finding are audited whatever their age, or a finding
    -- on a period older than the previous month would never be resolved.
    -- Read first, on its own: one per-organization table per statement
    -- inside a delegated twin (docs/architecture.md, "Citus rules" 9).
    SELECT pg_catalog.array_agg(f.period_start) INTO v_open
      FROM llm.period_findings AS f
     WHERE f.organization_id = p_organization_id AND f.resolved_at IS NULL;

    -- The periods in one statement, so one snapshot: every state change moves a
    -- request and its period's counters in one transaction, so live traffic cannot
    -- make a period look wrong here.
    FOR v_period IN
        SELECT p.period_start,
               p.used_credits AS recorded_used, coalesce(c.used, 0) AS computed_used,
               p.used_cents AS recorded_cents, coalesce(c.cents, 0) AS computed_cents,
               p.held_credits AS recorded_held, coalesce(c.held, 0) AS computed_held
          FROM llm.periods AS p
          LEFT JOIN LATERAL (
                SELECT sum(i.charged_credits) FILTER (WHERE i.status IN ('settled', 'failed'))::bigint AS used,
                       sum(coalesce(i.charged_cents, 0)) FILTER (WHERE i.status IN ('settled', 'failed'))::bigint AS cents,
                       sum(i.hold_credits) FILTER (WHERE i.status IN ('reserved', 'dispatched'))::bigint AS held
                  FROM llm.invocations AS i
                 WHERE i.organization_id = p_organization_id
                   -- its requests: those admitted in its month (index invocations_created)
                   AND i.created_at >= (p.period_start::timestamp AT TIME ZONE 'UTC')
                   AND i.created_at < (p.period_end::timestamp AT TIME ZONE 'UTC')) AS c ON true
         WHERE p.organization_id = p_organization_id
           AND (p.period_start IN (v_current, (v_current - interval '1 month')::date)
                OR p.period_start = ANY (v_open))
    LOOP
        IF (v_period.recorded_used, v_period.recorded_cents, v_period.recorded_held)
           IS DISTINCT FROM (v_period.computed_used, v_period.computed_cents, v_period.computed_held) THEN
            v_found := v_found + 1;
            RAISE WARNING 'llm: period % of organization % disagrees with its requests: used credits % (requests say %), used cents % (%), held credits % (%)',
                v_period.period_start, p_organization_id, v_period.recorded_used, v_period.computed_used,
                v_period.recorded_cents, v_period.computed_cents, v_period.recorded_held, v_period.computed_held;
            INSERT INTO llm.period_findings AS f
                   (organization_id, period_start, recorded_used_credits, computed_used_credits,
                    recorded_used_cents, computed_used_cents, recorded_held_credits, computed_held_credits,
                    first_seen_at, last_seen_at, resolved_at, last_run_id)
            VALUES (p_organization_id, v_period.period_start, v_period.recorded_used, v_period.computed_used,
                    v_period.recorded_cents, v_period.computed_cents, v_period.recorded_held,
                    v_period.computed_held, p_now, p_now, NULL, p_run_id)
            ON CONFLICT (organization_id, period_start) DO UPDATE
               SET recorded_used_credits = excluded.recorded_used_credits,
                   computed_used_credits = excluded.computed_used_credits,
                   recorded_used_cents = excluded.recorded_used_cents,
                   computed_used_cents = excluded.computed_used_cents,
                   recorded_held_credits = excluded.recorded_held_credits,
                   computed_held_credits = excluded.computed_held_credits,
                   -- a finding that comes back after it was resolved starts again
                   first_seen_at = CASE WHEN f.resolved_at IS NULL THEN f.first_seen_at
                                        ELSE excluded.first_seen_at END,
                   last_seen_at = excluded.last_seen_at,
                   resolved_at = NULL,
                   last_run_id = excluded.last_run_id;
        ELSE
            UPDATE llm.period_findings AS f
               SET resolved_at = p_now, last_run_id = p_run_id
             WHERE f.organization_id = p_organization_id AND f.period_start = v_period.period_start
               AND f.resolved_at IS NULL;
        END IF;
    END LOOP;

    -- The budget counters: logged and counted with the periods' findings (no table
    -- keeps them; invariant 14 names them too).
    v_found := v_found + llm._audit_budgets(p_organization_id, p_now);

    -- Due again in 23 hours, so hourly passes audit each organization at least once a
    -- day. Its first audit sets the phase from its id, so audits spread over the day.
    -- (Times computed first: Citus rejects timestamptz arithmetic on columns in an UPDATE.)
    v_next := p_now + interval '23 hours';
    v_first := p_now + pg_catalog.make_interval(
        hours => 1 + (pg_catalog.hashtext(p_organization_id::text) OPERATOR(pg_catalog.&) 2147483647) % 23);
    INSERT INTO llm.sweep_totals AS t (organization_id, audited_at, audit_due_at, updated_at)
    VALUES (p_organization_id, p_now, v_first, p_now)
    ON CONFLICT (organization_id) DO UPDATE
       SET audited_at = excluded.audited_at,
           audit_due_at = CASE WHEN t.audited_at IS NULL THEN v_first ELSE v_next END,
           updated_at = excluded.updated_at;
    RETURN v_found;
END
$$;
COMMENT ON FUNCTION llm._audit_org(uuid, timestamptz, uuid) IS
    'When due (at least daily), recomputes the organization''s current and previous period, and every period with an unresolved finding, from their requests in one statement; records, logs and returns the periods that disagree (llm.period_findings), resolves findings that no longer hold; then logs and adds the budget counters of the current and previous windows that disagree (llm._audit_budgets); NULL when not due.';
