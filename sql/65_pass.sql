-- The hourly pass (WF-PFM-LLM-004): one at a time, organizations visited in
-- order with a commit after each, one organization's error recorded and the
-- pass carried on, then notices re-armed and daily usage rebuilt as
-- independent steps. Each step is a SECURITY DEFINER function with its own
-- exception handler; the procedure only sequences them and commits.

CREATE OR REPLACE FUNCTION llm._pass_lock_key()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, llm, pg_temp
AS $$ SELECT 7310209001::bigint $$;
COMMENT ON FUNCTION llm._pass_lock_key() IS 'The session advisory lock key that lets one reconciliation pass run at a time.';

CREATE OR REPLACE FUNCTION llm._begin_run(p_now timestamptz)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_run uuid;
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_key bigint := llm._pass_lock_key();
    v_holder_pid integer;
    v_holder_state text;
BEGIN
    -- Who holds the pass lock, if anyone (a bigint advisory key shows as classid/objid).
    SELECT l.pid, a.state INTO v_holder_pid, v_holder_state
      FROM pg_catalog.pg_locks AS l
      LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d
                          WHERE d.datname = pg_catalog.current_database())
       AND l.classid = (v_key >> 32)::oid AND l.objid = (v_key & 4294967295)::oid
     LIMIT 1;
    -- A pass of this very session that was cancelled (statement_timeout, query cancel:
    -- neither is caught by the steps' handlers) could not release the session lock.
    -- Reuse that hold instead of stacking a second one _finish_run would never release,
    -- which would leave every other session's pass skipped for as long as this one lives.
    IF v_holder_pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
       AND NOT pg_catalog.pg_try_advisory_lock(v_key) THEN
        INSERT INTO llm.reconciliation_runs (started_at, finished_at, clock, status, errors)
        VALUES (pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp(), v_now, 'skipped',
                pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                    'step', 'lock', 'error', 'another reconciliation pass is running',
                    'holder_pid', v_holder_pid, 'holder_state', v_holder_state)));
        RETURN NULL;
    END IF;
    -- a pass that died (server stopped, backend terminated) left its row running
    UPDATE llm.reconciliation_runs AS r
       SET status = 'failed', finished_at = pg_catalog.clock_timestamp(),
           errors = r.errors || '[{"step": "pass", "error": "interrupted before it finished"}]'
     WHERE r.status = 'running';
    INSERT INTO llm.reconciliation_runs (started_at, clock, status)
    VALUES (pg_catalog.clock_timestamp(), v_now, 'running')
    RETURNING id INTO v_run;
    RETURN v_run;
END
$$;
COMMENT ON FUNCTION llm._begin_run(timestamptz) IS
    'Takes the pass lock (or reuses the one an interrupted pass of this session left) and records a running pass (returns its id), or records a skipped pass naming the lock holder and returns NULL.';

CREATE OR REPLACE FUNCTION llm._pass_organizations()
RETURNS uuid[]
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_ids uuid[];
BEGIN
    SELECT coalesce(pg_catalog.array_agg(o.id ORDER BY o.id), '{}') INTO v_ids
      FROM llm.organizations AS o WHERE o.status = 'operational';
    RETURN v_ids;
END
$$;
COMMENT ON FUNCTION llm._pass_organizations() IS 'The operational organizations a pass visits, in id order.';

CREATE OR REPLACE FUNCTION llm._run_org(p_run_id uuid, p_organization_id uuid, p_now timestamptz, p_batch integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_sweep llm.org_sweep;
    v_state text;
    v_message text;
BEGIN
    BEGIN
        SELECT * INTO v_sweep
          FROM llm.reconcile_org(p_organization_id, coalesce(p_now, pg_catalog.now()), p_batch, p_run_id);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        IF v_state = 'LL003' THEN
            RETURN true;  -- suspended or closed since the pass listed it: not ours to sweep
        END IF;
        RAISE WARNING 'llm: reconciliation of organization % failed: % (%)', p_organization_id, v_message, v_state;
        UPDATE llm.reconciliation_runs AS r
           SET orgs_visited = r.orgs_visited + 1,
               orgs_failed = r.orgs_failed + 1,
               errors = r.errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                   'step', 'organization', 'organization_id', p_organization_id,
                   'sqlstate', v_state, 'error', v_message))
         WHERE r.id = p_run_id;
        RETURN false;
    END;
    UPDATE llm.reconciliation_runs AS r
       SET orgs_visited = r.orgs_visited + 1,
           requests_recovered = r.requests_recovered + v_sweep.recovered_requests,
           released_hold_credits = r.released_hold_credits + v_sweep.released_hold_credits,
           past_window_alerts = r.past_window_alerts + v_sweep.past_window_alerts,
           executions_abandoned = r.executions_abandoned + v_sweep.abandoned_executions,
           drift_findings = r.drift_findings + v_sweep.drift_findings,
           more_pending_orgs = r.more_pending_orgs + v_sweep.more_pending::integer
     WHERE r.id = p_run_id;
    RETURN true;
END
$$;
COMMENT ON FUNCTION llm._run_org(uuid, uuid, timestamptz, integer) IS
    'Sweeps one organization for a pass and adds its figures to the run; an error is recorded on the run and swallowed so the pass goes on.';

CREATE OR REPLACE FUNCTION llm._run_followup(p_run_id uuid, p_step text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_count integer;
    v_today date := (v_now AT TIME ZONE 'UTC')::date;
    v_state text;
    v_message text;
BEGIN
    BEGIN
        IF p_step = 'rearm_notices' THEN
            v_count := llm.rearm_notices(v_now);
            UPDATE llm.reconciliation_runs AS r SET notices_rearmed = v_count WHERE r.id = p_run_id;
        ELSIF p_step = 'rebuild_daily_usage' THEN
            v_count := llm.rebuild_daily_usage(v_today - (llm._settings()).reporting_days + 1, v_today);
            UPDATE llm.reconciliation_runs AS r SET daily_rows_rebuilt = v_count WHERE r.id = p_run_id;
        ELSE
            RAISE EXCEPTION 'llm: unknown pass step %', p_step USING ERRCODE = '22023';
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        RAISE WARNING 'llm: reconciliation step % failed: % (%)', p_step, v_message, v_state;
        UPDATE llm.reconciliation_runs AS r
           SET errors = r.errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                   'step', p_step, 'sqlstate', v_state, 'error', v_message))
         WHERE r.id = p_run_id;
        RETURN false;
    END;
    RETURN true;
END
$$;
COMMENT ON FUNCTION llm._run_followup(uuid, text, timestamptz) IS
    'Runs one follow-up step of a pass (rearm_notices or rebuild_daily_usage); an error is recorded on the run and does not stop the next step.';

CREATE OR REPLACE FUNCTION llm._finish_run(p_run_id uuid)
RETURNS llm.reconciliation_runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_run llm.reconciliation_runs;
BEGIN
    UPDATE llm.reconciliation_runs AS r
       SET finished_at = pg_catalog.clock_timestamp(),
           status = CASE
               WHEN pg_catalog.jsonb_array_length(r.errors) = 0 THEN 'succeeded'
               WHEN r.orgs_failed > 0 AND r.orgs_failed = r.orgs_visited THEN 'failed'
               ELSE 'partial'
           END
     WHERE r.id = p_run_id
    RETURNING r.* INTO v_run;
    PERFORM pg_catalog.pg_advisory_unlock(llm._pass_lock_key());
    RETURN v_run;
END
$$;
COMMENT ON FUNCTION llm._finish_run(uuid) IS
    'Closes a pass: succeeded without errors, failed when every organization failed, partial otherwise; releases the pass lock.';

-- A procedure that commits may not be SECURITY DEFINER nor carry a SET clause,
-- so it calls only schema-qualified SECURITY DEFINER steps and writes its few
-- operators as OPERATOR(pg_catalog.…); the search_path of the caller cannot
-- redirect them (tests/test_security.py shadows them to prove it).
CREATE OR REPLACE PROCEDURE llm.run_reconciliation(p_now timestamptz DEFAULT NULL, p_batch integer DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_run uuid;
    v_orgs uuid[];
    v_org uuid;
BEGIN
    -- No SET search_path here, so the caller's path resolves this body's operators:
    -- qualify them, or a schema ahead of pg_catalog could supply its own integer <.
    IF p_batch IS NOT NULL
       AND (p_batch OPERATOR(pg_catalog.<) 1 OR p_batch OPERATOR(pg_catalog.>) 100000) THEN
        RAISE EXCEPTION 'llm: batch % is out of range', p_batch
            USING ERRCODE = '22023', HINT = 'Pass 1 .. 100000, or NULL for settings.sweep_batch.';
    END IF;
    PERFORM llm._check_clock(p_now);
    v_run := llm._begin_run(p_now);
    COMMIT;
    IF v_run IS NULL THEN
        RAISE NOTICE 'llm: another reconciliation pass is running; this one was recorded as skipped';
        RETURN;
    END IF;
    v_orgs := llm._pass_organizations();
    FOREACH v_org IN ARRAY v_orgs LOOP
        PERFORM llm._run_org(v_run, v_org, p_now, p_batch);
        COMMIT;
    END LOOP;
    PERFORM llm._run_followup(v_run, 'rearm_notices', p_now);
    COMMIT;
    PERFORM llm._run_followup(v_run, 'rebuild_daily_usage', p_now);
    COMMIT;
    PERFORM llm._finish_run(v_run);
    COMMIT;
END
$$;
COMMENT ON PROCEDURE llm.run_reconciliation(timestamptz, integer) IS
    'The hourly pass: one at a time (a concurrent call is recorded as skipped), sweeps every operational organization committing after each, records errors and goes on, then re-arms notices and rebuilds daily usage; one llm.reconciliation_runs row per call.';

CREATE OR REPLACE FUNCTION llm.reconciliation_health(p_now timestamptz DEFAULT now())
RETURNS TABLE (status text, last_success_at timestamptz, last_run_status text, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, llm, pg_temp
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_max_age interval := (llm._settings()).health_max_age;
    v_success timestamptz;
    v_last llm.reconciliation_runs;
BEGIN
    PERFORM llm._check_clock(p_now);
    -- times on the pass's own clock (p_now of the pass), so a moved clock stays consistent
    SELECT max(r.clock + (r.finished_at - r.started_at)) INTO v_success
      FROM llm.reconciliation_runs AS r WHERE r.status IN ('succeeded', 'partial');
    SELECT * INTO v_last FROM llm.reconciliation_runs AS r
     WHERE r.status <> 'skipped' AND r.finished_at IS NOT NULL
     ORDER BY r.clock DESC, r.started_at DESC LIMIT 1;

    IF v_success IS NULL AND v_last.id IS NOT NULL THEN
        RETURN QUERY SELECT 'failing'::text, NULL::timestamptz, v_last.status,
            pg_catalog.format('passes ran but none completed; the last was %s with errors: %s',
                              v_last.status, v_last.errors::text);
    ELSIF v_success IS NULL THEN
        RETURN QUERY SELECT 'never'::text, NULL::timestamptz, v_last.status,
            'no reconciliation pass has completed; schedule one with llm.schedule_reconciliation()'::text;
    ELSIF v_now - v_success > v_max_age THEN
        RETURN QUERY SELECT 'late'::text, v_success, v_last.status,
            pg_catalog.format('the last completed pass finished %s ago (allowed: %s); check the pg_cron job llm-reconciliation',
                              pg_catalog.date_trunc('second', v_now - v_success), v_max_age);
    ELSIF v_last.status IN ('failed', 'partial') THEN
        RETURN QUERY SELECT 'failing'::text, v_success, v_last.status,
            pg_catalog.format('the last pass was %s: %s of %s organizations failed; errors: %s',
                              v_last.status, v_last.orgs_failed, v_last.orgs_visited, v_last.errors::text);
    ELSE
        RETURN QUERY SELECT 'ok'::text, v_success, v_last.status,
            pg_catalog.format('the last pass finished %s ago', pg_catalog.date_trunc('second', v_now - v_success));
    END IF;
END
$$;
COMMENT ON FUNCTION llm.reconciliation_health(timestamptz) IS
    'The missing-run alarm: ok, late (no completed pass within settings.health_max_age), never (no pass ever ran), or failing (the last pass recorded errors, or every pass so far failed).';
