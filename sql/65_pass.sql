-- The hourly pass (WF-PFM-LLM-004): one at a time, organizations visited in
-- order with a commit after each, one organization's error recorded and the
-- pass carried on, then notices re-armed and daily usage rebuilt as
-- independent steps. Each step is a SECURITY DEFINER function with its own
-- exception handler; the procedure only sequences them and commits.
--
-- The one file that calls forward (the documented exception to the dependency
-- order of sql/, tests/test_sql_order.py): it orchestrates, so it calls the daily
-- usage rebuild of 80_reporting.sql as one of its steps, which keeps its name
-- beside the reporting it belongs to.
--
-- One at a time: a lease (llm.pass_lease), not a session lock, so the guard
-- keeps nothing past the pass's own transactions. The pass renews it after each
-- organization and holds it locked through each follow-up step; a pass whose
-- backend is gone or no longer runs it (cancelled through a pooler) or whose
-- lease lapsed is taken over and marked failed; a pass that finds its lease
-- taken over stops at once.

CREATE OR REPLACE FUNCTION llm._lease_holder_running(p_lease llm.pass_lease)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_backend_start timestamptz;
    v_state text;
    v_query_start timestamptz;
BEGIN
    SELECT a.backend_start, a.state, a.query_start INTO v_backend_start, v_state, v_query_start
      FROM pg_catalog.pg_stat_activity AS a
     WHERE a.pid = p_lease.holder_pid;
    IF NOT FOUND THEN
        RETURN false;  -- the backend is gone: terminated, crashed, or the server restarted
    END IF;
    IF v_backend_start IS NULL THEN
        -- another login role's session, whose details this role may not read
        -- (pg_read_all_stats): it may be the pass, so only its lease's expiry frees it
        RETURN true;
    END IF;
    -- The same backend (a pid is reused), still inside the statement that took the
    -- lease. A pass cancelled through a pooler leaves its backend alive and idle,
    -- or busy with another client's statement, which started after acquired_at.
    RETURN v_backend_start = p_lease.holder_backend_start
       AND v_state = 'active'
       AND v_query_start <= p_lease.acquired_at;
END
$$;
COMMENT ON FUNCTION llm._lease_holder_running(llm.pass_lease) IS
    'True while the lease holder''s backend (same pid and start time) is still running the statement that took the lease; a session this role cannot inspect counts as running.';

CREATE OR REPLACE FUNCTION llm._lease_locker_pid()
RETURNS integer
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- A row lock shows in pg_locks only while someone waits on it: the lease row's
    -- xmax names the transaction holding it, and every transaction holds the lock
    -- on its own id. The pass takes the lease row outside any subtransaction, so
    -- that id is its backend's (0 or a finished transaction: NULL).
    RETURN (SELECT l.pid
              FROM pg_catalog.pg_locks AS l
             WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
               AND l.transactionid = (SELECT p.xmax FROM llm.pass_lease AS p)
             LIMIT 1);
END
$$;
COMMENT ON FUNCTION llm._lease_locker_pid() IS
    'The pid of the backend whose open transaction holds the pass lease row locked, or NULL.';

CREATE OR REPLACE FUNCTION llm._skip_run(p_now timestamptz, p_lease llm.pass_lease, p_holder_pid integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    -- the lease as read names the holder, or (taken but not committed yet) no one
    v_named boolean := p_lease.holder_pid IS NOT DISTINCT FROM p_holder_pid;
BEGIN
    INSERT INTO llm.reconciliation_runs (started_at, finished_at, clock, status, errors)
    SELECT pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp(), p_now, 'skipped',
           pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
               'step', 'lease', 'error', 'another reconciliation pass is running',
               'holder_run_id', CASE WHEN v_named THEN p_lease.run_id END,
               'holder_pid', p_holder_pid,
               'holder_backend_start', CASE WHEN v_named THEN p_lease.holder_backend_start END,
               'holder_application_name', a.application_name,
               'holder_state', a.state,
               'lease_expires_at', CASE WHEN v_named THEN p_lease.expires_at END))
      FROM (SELECT NULL) AS one
      LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = p_holder_pid;
END
$$;
COMMENT ON FUNCTION llm._skip_run(timestamptz, llm.pass_lease, integer) IS
    'Records a skipped pass naming the pass that holds the lease: its pid, and its run, backend start and expiry once its lease is committed.';

CREATE OR REPLACE FUNCTION llm._begin_run(p_now timestamptz, OUT run_id uuid, OUT token uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_lease llm.pass_lease;
    v_running boolean;
    v_why text;
BEGIN
    -- A pass locks the lease row while it takes it, for an instant when it renews it
    -- after each organization, and through each follow-up step: locked means a pass is
    -- running, whatever the row reads here. A pass taking the lease at this very moment
    -- has not committed it, so this snapshot shows the lease free; reading that as
    -- free let two passes started together both run. SKIP LOCKED,
    -- not NOWAIT in a subtransaction: the lock stays the holder's own transaction id,
    -- which names it (llm._lease_locker_pid).
    SELECT * INTO v_lease FROM llm.pass_lease FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT * INTO STRICT v_lease FROM llm.pass_lease;
        PERFORM llm._skip_run(v_now, v_lease, llm._lease_locker_pid());
        RETURN;  -- run_id and token NULL: skipped
    END IF;
    IF v_lease.token IS NOT NULL THEN
        v_running := llm._lease_holder_running(v_lease);
        IF v_running AND v_lease.expires_at > pg_catalog.clock_timestamp() THEN
            PERFORM llm._skip_run(v_now, v_lease, v_lease.holder_pid);
            RETURN;  -- run_id and token NULL: skipped
        END IF;
        v_why := CASE WHEN v_running
                      THEN pg_catalog.format('its lease expired at %s without renewal; taken over',
                                             v_lease.expires_at)
                      ELSE 'abandoned: its backend is gone or no longer runs the pass (terminated, cancelled or disconnected)'
                 END;
        UPDATE llm.reconciliation_runs AS r
           SET status = 'failed', finished_at = pg_catalog.clock_timestamp(),
               errors = r.errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                   'step', 'pass', 'error', v_why, 'taken_over_by_pid', pg_catalog.pg_backend_pid()))
         WHERE r.id = v_lease.run_id AND r.status = 'running';
    END IF;
    -- any other run left running (a pass that died before it held a lease)
    UPDATE llm.reconciliation_runs AS r
       SET status = 'failed', finished_at = pg_catalog.clock_timestamp(),
           errors = r.errors || '[{"step": "pass", "error": "interrupted before it finished"}]'
     WHERE r.status = 'running';

    INSERT INTO llm.reconciliation_runs (started_at, clock, status)
    VALUES (pg_catalog.clock_timestamp(), v_now, 'running')
    RETURNING id INTO run_id;
    token := pg_catalog.gen_random_uuid();
    UPDATE llm.pass_lease AS l
       SET run_id = _begin_run.run_id, token = _begin_run.token,
           holder_pid = pg_catalog.pg_backend_pid(),
           holder_backend_start = (SELECT a.backend_start FROM pg_catalog.pg_stat_activity AS a
                                    WHERE a.pid = pg_catalog.pg_backend_pid()),
           acquired_at = pg_catalog.clock_timestamp(),
           renewed_at = pg_catalog.clock_timestamp(),
           expires_at = pg_catalog.clock_timestamp() + (llm._settings()).pass_lease;
END
$$;
COMMENT ON FUNCTION llm._begin_run(timestamptz) IS
    'Takes the pass lease and records a running pass (its run id and lease token), marking a pass that lost it failed; or, while another pass really holds the lease, records a skipped pass naming the holder and returns NULLs.';

CREATE OR REPLACE FUNCTION llm._renew_lease(p_run_id uuid, p_token uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- locks the lease row until the caller's transaction ends
    UPDATE llm.pass_lease AS l
       SET renewed_at = pg_catalog.clock_timestamp(),
           expires_at = pg_catalog.clock_timestamp() + (llm._settings()).pass_lease
     WHERE l.run_id = p_run_id AND l.token = p_token;
    IF FOUND THEN
        RETURN true;
    END IF;
    -- taken over (the taker marked this run failed already): this pass stops at once
    UPDATE llm.reconciliation_runs AS r
       SET status = 'failed', finished_at = coalesce(r.finished_at, pg_catalog.clock_timestamp()),
           errors = r.errors || '[{"step": "lease", "error": "lease lost: another pass took it over"}]'
     WHERE r.id = p_run_id;
    RAISE WARNING 'llm: reconciliation pass % lost its lease to another pass and stops', p_run_id;
    RETURN false;
END
$$;
COMMENT ON FUNCTION llm._renew_lease(uuid, uuid) IS
    'Extends the pass lease by settings.pass_lease while this pass still holds it (true); otherwise records the run failed ("lease lost") and returns false.';

CREATE OR REPLACE FUNCTION llm._pass_organizations()
RETURNS uuid[]
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN ARRAY(SELECT o.id FROM llm.organizations AS o WHERE o.status = 'operational' ORDER BY o.id);
END
$$;
COMMENT ON FUNCTION llm._pass_organizations() IS 'The operational organizations a pass visits, in id order.';

CREATE OR REPLACE FUNCTION llm._audits_due(p_now timestamptz)
RETURNS uuid[]
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    -- due: never audited, or audited 23 hours ago or more (llm._audit_org sets the time)
    RETURN ARRAY(
        SELECT o.id
          FROM llm.organizations AS o
          LEFT JOIN llm.sweep_totals AS t ON t.organization_id = o.id
         WHERE o.status = 'operational'
           AND (t.audit_due_at IS NULL OR t.audit_due_at <= coalesce(p_now, pg_catalog.now()))
         ORDER BY o.id);
END
$$;
COMMENT ON FUNCTION llm._audits_due(timestamptz) IS
    'The operational organizations whose periods are due for their daily audit at p_now, in id order.';

CREATE OR REPLACE FUNCTION llm._run_org(
    p_run_id uuid, p_token uuid, p_organization_id uuid, p_now timestamptz, p_batch integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_sweep llm.org_sweep;
    v_state text;
    v_message text;
    v_column text;
    v_kept boolean;
BEGIN
    BEGIN
        SELECT * INTO v_sweep
          FROM llm.reconcile_org(p_organization_id, coalesce(p_now, pg_catalog.now()), p_batch, p_run_id);
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                v_column = COLUMN_NAME;
        IF v_state = '57014' AND v_column IS DISTINCT FROM 'org_time_budget' THEN
            RAISE;  -- a real cancel (statement_timeout, pg_cancel_backend) stops the pass
        END IF;
        IF v_state = 'LL003' THEN
            RETURN llm._renew_lease(p_run_id, p_token);  -- suspended or closed since listed
        END IF;
        RAISE WARNING 'llm: reconciliation of organization % failed: % (%)', p_organization_id, v_message, v_state;
        -- lock order: the lease, then the run row (docs/architecture.md "Lock order")
        v_kept := llm._renew_lease(p_run_id, p_token);
        UPDATE llm.reconciliation_runs AS r
           SET orgs_visited = r.orgs_visited + 1,
               orgs_failed = r.orgs_failed + 1,
               errors = r.errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                   'step', 'organization', 'organization_id', p_organization_id,
                   'sqlstate', v_state, 'error', v_message))
         WHERE r.id = p_run_id;
        RETURN v_kept;
    END;
    -- lock order: the lease, then the run row, as a pass taking over an expired lease
    -- takes them (docs/architecture.md "Lock order")
    v_kept := llm._renew_lease(p_run_id, p_token);
    UPDATE llm.reconciliation_runs AS r
       SET orgs_visited = r.orgs_visited + 1,
           requests_recovered = r.requests_recovered + v_sweep.recovered_requests,
           released_hold_credits = r.released_hold_credits + v_sweep.released_hold_credits,
           past_window_alerts = r.past_window_alerts + v_sweep.past_window_alerts,
           executions_abandoned = r.executions_abandoned + v_sweep.abandoned_executions,
           drift_findings = r.drift_findings + v_sweep.drift_findings,
           more_pending_orgs = r.more_pending_orgs + v_sweep.more_pending::integer,
           recovered_uncharged = r.recovered_uncharged + v_sweep.recovered_uncharged
     WHERE r.id = p_run_id;
    RETURN v_kept;
END
$$;
COMMENT ON FUNCTION llm._run_org(uuid, uuid, uuid, timestamptz, integer) IS
    'Sweeps one organization for a pass (bounded by org_lock_timeout and org_time_budget), adds its figures to the run and renews the lease; an error is recorded on the run and the pass goes on. False when the lease was lost: the pass stops.';

CREATE OR REPLACE FUNCTION llm._run_followup(
    p_run_id uuid, p_token uuid, p_step text, p_now timestamptz, p_day date DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_count integer;
    v_state text;
    v_message text;
BEGIN
    -- The lease stays locked through the step, so a pass that takes over cannot run
    -- the same step at the same time (two rebuilds of one day would collide).
    IF NOT llm._renew_lease(p_run_id, p_token) THEN
        RETURN false;
    END IF;
    BEGIN
        PERFORM llm._bound_locks();  -- no client holds a step longer than org_lock_timeout
        IF p_step = 'rearm_notices' THEN
            v_count := llm.rearm_notices(v_now);
            UPDATE llm.reconciliation_runs AS r SET notices_rearmed = v_count WHERE r.id = p_run_id;
        ELSIF p_step = 'rebuild_daily_usage' AND p_day IS NOT NULL THEN
            v_count := llm.rebuild_daily_usage(p_day, p_day);
            UPDATE llm.reconciliation_runs AS r
               SET daily_rows_rebuilt = r.daily_rows_rebuilt + v_count
             WHERE r.id = p_run_id;
        ELSE
            RAISE EXCEPTION 'llm: unknown pass step % (day %)', p_step, p_day USING ERRCODE = '22023';
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        RAISE WARNING 'llm: reconciliation step % failed: % (%)', p_step, v_message, v_state;
        UPDATE llm.reconciliation_runs AS r
           SET errors = r.errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_strip_nulls(
                   pg_catalog.jsonb_build_object('step', p_step, 'day', p_day,
                                                 'sqlstate', v_state, 'error', v_message)))
         WHERE r.id = p_run_id;
        RETURN true;
    END;
    RETURN true;
END
$$;
COMMENT ON FUNCTION llm._run_followup(uuid, uuid, text, timestamptz, date) IS
    'Runs one follow-up step of a pass (rearm_notices, or rebuild_daily_usage of one day) under the lease and org_lock_timeout; an error is recorded on the run and does not stop the next step. False only when the lease was lost.';

CREATE OR REPLACE FUNCTION llm._rebuild_days(p_now timestamptz)
RETURNS date[]
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
DECLARE
    v_today date := (coalesce(p_now, pg_catalog.now()) AT TIME ZONE 'UTC')::date;
    v_recent date := v_today - (llm._settings()).reporting_days + 1;
    v_through date;
    v_from date;
BEGIN
    -- the last day a pass rebuilt completely (it may have been rebuilt before the day
    -- ended, so it is rebuilt again), never more than 35 days back. Only passes whose
    -- clock was not ahead of this one's count: a pass run ahead (llm-db reconcile --now)
    -- rebuilt days whose requests had not settled yet, and would hide from the catch-up
    -- every day between.
    SELECT max(r.daily_rebuilt_through) INTO v_through
      FROM llm.reconciliation_runs AS r
     WHERE r.clock <= coalesce(p_now, pg_catalog.now());
    v_from := GREATEST(LEAST(v_recent, coalesce(v_through, v_recent)), v_today - 34);
    RETURN ARRAY(SELECT d::date FROM pg_catalog.generate_series(v_from, v_today, interval '1 day') AS d);
END
$$;
COMMENT ON FUNCTION llm._rebuild_days(timestamptz) IS
    'The days of daily usage a pass rebuilds, oldest first: every day since the last complete rebuild by a pass whose clock was not ahead of this one (at most 35 days back) and the last settings.reporting_days, up to the pass clock''s day.';

CREATE OR REPLACE FUNCTION llm._run_audit(p_run_id uuid, p_organization_id uuid, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_found integer;
    v_state text;
    v_message text;
BEGIN
    -- its own transaction after the organization's sweep: a slow or failed audit
    -- never rolls back that organization's recovery
    BEGIN
        PERFORM llm._bound_locks();
        SELECT a INTO v_found
          FROM llm._audit_org(p_organization_id, coalesce(p_now, pg_catalog.now()), p_run_id) AS a;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        RAISE WARNING 'llm: audit of organization % failed: % (%)', p_organization_id, v_message, v_state;
        UPDATE llm.reconciliation_runs AS r
           SET errors = r.errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                   'step', 'audit', 'organization_id', p_organization_id,
                   'sqlstate', v_state, 'error', v_message))
         WHERE r.id = p_run_id;
        RETURN;
    END;
    IF v_found > 0 THEN
        UPDATE llm.reconciliation_runs AS r
           SET period_findings = r.period_findings + v_found
         WHERE r.id = p_run_id;
    END IF;
END
$$;
COMMENT ON FUNCTION llm._run_audit(uuid, uuid, timestamptz) IS
    'A step of the pass: audits one organization''s periods when due (llm._audit_org) and counts its findings on the run; an error is recorded on the run and the pass goes on.';

CREATE OR REPLACE FUNCTION llm._finish_run(p_run_id uuid, p_token uuid)
RETURNS llm.reconciliation_runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_run llm.reconciliation_runs;
BEGIN
    IF NOT llm._renew_lease(p_run_id, p_token) THEN
        SELECT * INTO v_run FROM llm.reconciliation_runs AS r WHERE r.id = p_run_id;
        RETURN v_run;
    END IF;
    UPDATE llm.pass_lease AS l
       SET run_id = NULL, token = NULL, holder_pid = NULL, holder_backend_start = NULL,
           acquired_at = NULL, renewed_at = NULL, expires_at = NULL
     WHERE l.token = p_token;
    UPDATE llm.reconciliation_runs AS r
       SET finished_at = pg_catalog.clock_timestamp(),
           -- every day it owed rebuilt: the next pass starts from this clock's day, or
           -- from the day it really ran when its clock was ahead (llm-db reconcile
           -- --now): it cannot vouch for days whose requests had not settled yet
           daily_rebuilt_through = CASE WHEN NOT r.errors @> '[{"step": "rebuild_daily_usage"}]'
                                        THEN LEAST((r.clock AT TIME ZONE 'UTC')::date,
                                                   (r.started_at AT TIME ZONE 'UTC')::date) END,
           status = CASE
               WHEN pg_catalog.jsonb_array_length(r.errors) = 0 THEN 'succeeded'
               WHEN r.orgs_failed > 0 AND r.orgs_failed = r.orgs_visited THEN 'failed'
               ELSE 'partial'
           END
     WHERE r.id = p_run_id
    RETURNING r.* INTO v_run;
    RETURN v_run;
END
$$;
COMMENT ON FUNCTION llm._finish_run(uuid, uuid) IS
    'Closes a pass that still holds its lease: succeeded without errors, failed when every organization failed, partial otherwise; frees the lease.';

-- A procedure that commits may not be SECURITY DEFINER nor carry a SET clause,
-- so it calls only schema-qualified SECURITY DEFINER steps and writes its few
-- operators as OPERATOR(pg_catalog.…); the search_path of the caller cannot
-- redirect them (tests/test_security.py shadows them to prove it).
CREATE OR REPLACE PROCEDURE llm.run_reconciliation(p_now timestamptz DEFAULT NULL, p_batch integer DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    v_run uuid;
    v_token uuid;
    v_orgs uuid[];
    v_due uuid[];
    v_org uuid;
    v_day date;
BEGIN
    -- No SET search_path here, so the caller's path resolves this body's operators:
    -- qualify them, or a schema ahead of pg_catalog could supply its own integer <.
    IF p_batch IS NOT NULL
       AND (p_batch OPERATOR(pg_catalog.<) 1 OR p_batch OPERATOR(pg_catalog.>) 100000) THEN
        RAISE EXCEPTION 'llm: batch % is out of range', p_batch
            USING ERRCODE = '22023', HINT = 'Pass 1 .. 100000, or NULL for settings.sweep_batch.';
    END IF;
    PERFORM llm._check_clock(p_now);
    SELECT b.run_id, b.token INTO v_run, v_token FROM llm._begin_run(p_now) AS b;
    COMMIT;
    IF v_run IS NULL THEN
        RAISE NOTICE 'llm: another reconciliation pass is running; this one was recorded as skipped';
        RETURN;
    END IF;
    v_orgs := llm._pass_organizations();
    v_due := llm._audits_due(p_now);
    -- every step returns false once the lease was taken over: stop at once
    FOREACH v_org IN ARRAY v_orgs LOOP
        IF NOT llm._run_org(v_run, v_token, v_org, p_now, p_batch) THEN
            COMMIT;
            RETURN;
        END IF;
        COMMIT;
        IF v_org OPERATOR(pg_catalog.=) ANY (v_due) THEN
            PERFORM llm._run_audit(v_run, v_org, p_now);  -- its own transaction
            COMMIT;
        END IF;
    END LOOP;
    IF NOT llm._run_followup(v_run, v_token, 'rearm_notices', p_now) THEN
        COMMIT;
        RETURN;
    END IF;
    COMMIT;
    -- daily usage, one day per transaction: every day since the last complete rebuild
    FOREACH v_day IN ARRAY llm._rebuild_days(p_now) LOOP
        IF NOT llm._run_followup(v_run, v_token, 'rebuild_daily_usage', p_now, v_day) THEN
            COMMIT;
            RETURN;
        END IF;
        COMMIT;
    END LOOP;
    PERFORM llm._finish_run(v_run, v_token);
    COMMIT;
END
$$;
COMMENT ON PROCEDURE llm.run_reconciliation(timestamptz, integer) IS
    'The hourly pass: one at a time under a lease (a concurrent call is recorded as skipped; a dead, cancelled or pooled-away pass is taken over), sweeps every operational organization committing after each and audits its periods when due, records errors and goes on, then re-arms notices and rebuilds daily usage one day at a time since the last complete rebuild; one llm.reconciliation_runs row per call.';

-- What health says before the first pass: whether the pg_cron job is visible from this
-- database (pg_cron installed here and the job the schema owner's), and its schedule.
CREATE OR REPLACE FUNCTION llm._cron_job_seen()
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_jobs regclass := pg_catalog.to_regclass('cron.job');
    v_schedule text;
BEGIN
    IF v_jobs IS NULL THEN
        RETURN 'pg_cron is not installed in this database, so no job is visible from here: schedule one with '
               'llm-db schedule (--cron-dsn for pg_cron''s database), or ignore this until its first pass';
    END IF;
    BEGIN
        EXECUTE pg_catalog.format('SELECT j.schedule FROM %s AS j WHERE j.jobname = %L
                                     AND j.database = pg_catalog.current_database() AND j.active LIMIT 1',
                                  v_jobs, 'llm-reconciliation') INTO v_schedule;
    EXCEPTION WHEN insufficient_privilege THEN
        RETURN 'the pg_cron jobs are not readable here: check the job llm-reconciliation in cron.job';
    END;
    IF v_schedule IS NULL THEN
        RETURN 'no pg_cron job llm-reconciliation runs in this database: schedule one with llm-db schedule '
               '(or llm.schedule_reconciliation())';
    END IF;
    RETURN pg_catalog.format('the pg_cron job llm-reconciliation is scheduled (%s): the first pass runs at its next match',
                             v_schedule);
END
$$;
COMMENT ON FUNCTION llm._cron_job_seen() IS
    'For health before the first pass: whether the pg_cron job llm-reconciliation of this database is visible and scheduled, and how.';

CREATE OR REPLACE FUNCTION llm.reconciliation_health(p_now timestamptz DEFAULT now())
RETURNS TABLE (status text, last_success_at timestamptz, last_run_status text, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
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
            'no reconciliation pass has completed yet; ' || llm._cron_job_seen();
    ELSIF v_now - v_success > v_max_age THEN
        RETURN QUERY SELECT 'late'::text, v_success, v_last.status,
            pg_catalog.format('the last completed pass finished %s ago (allowed: %s); check the pg_cron job llm-reconciliation'
                              ' (llm-reconciliation:%s when scheduled with llm-db schedule --cron-dsn)',
                              pg_catalog.date_trunc('second', v_now - v_success), v_max_age, pg_catalog.current_database());
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
