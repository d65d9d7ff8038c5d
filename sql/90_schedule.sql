-- pg_cron scheduling of the hourly pass. pg_cron runs jobs from one database
-- (cron.database_name); when llm lives elsewhere, LL010's HINT gives the
-- cron.schedule_in_database call to run there (`llm-db schedule --cron-dsn`).

CREATE OR REPLACE FUNCTION llm._require_cron(p_schedule text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_cron_db text := pg_catalog.current_setting('cron.database_name', true);
BEGIN
    PERFORM FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_cron';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'llm: pg_cron is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = 'LL010',
                  DETAIL = CASE WHEN v_cron_db IS NULL
                           THEN 'pg_cron is not loaded: add it to shared_preload_libraries and restart.'
                           ELSE pg_catalog.format('pg_cron runs jobs from database %s.', v_cron_db) END,
                  HINT = CASE WHEN v_cron_db IS NULL OR v_cron_db = pg_catalog.current_database()
                         THEN 'CREATE EXTENSION pg_cron; then SELECT llm.schedule_reconciliation();'
                         ELSE pg_catalog.format(
                             'In database %s run: SELECT cron.schedule_in_database(%L, %L, %L, %L); or use llm-db schedule --cron-dsn.',
                             v_cron_db, 'llm-reconciliation', coalesce(p_schedule, '0 * * * *'),
                             'CALL llm.run_reconciliation()', pg_catalog.current_database()) END;
    END IF;
END
$$;
COMMENT ON FUNCTION llm._require_cron(text) IS
    'Raises LL010 when pg_cron is not installed in this database, with a HINT that schedules the pass from the cron database.';

CREATE OR REPLACE FUNCTION llm.schedule_reconciliation(p_schedule text DEFAULT '0 * * * *')
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_job bigint;
    v_message text;
BEGIN
    PERFORM llm._check_text('p_schedule', p_schedule, 200);
    PERFORM llm._require_cron(p_schedule);
    BEGIN
        -- pg_cron replaces a job of the same name and owner: idempotent
        EXECUTE pg_catalog.format('SELECT %I.schedule($1, $2, $3)', 'cron')
           INTO v_job
          USING 'llm-reconciliation', p_schedule, 'CALL llm.run_reconciliation()';
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
        RAISE EXCEPTION 'llm: pg_cron refused schedule %', p_schedule
            USING ERRCODE = '22023', DETAIL = v_message,
                  HINT = 'Use a five-field cron expression such as ''0 * * * *''.';
    END;
    RETURN v_job;
END
$$;
COMMENT ON FUNCTION llm.schedule_reconciliation(text) IS
    'Schedules (or reschedules) the pg_cron job llm-reconciliation running CALL llm.run_reconciliation(); returns its job id; LL010 without pg_cron.';

CREATE OR REPLACE FUNCTION llm.unschedule_reconciliation()
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_job bigint;
BEGIN
    PERFORM llm._require_cron(NULL);
    EXECUTE pg_catalog.format('SELECT jobid FROM %I.job WHERE jobname = $1 LIMIT 1', 'cron') INTO v_job USING 'llm-reconciliation';
    IF v_job IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE pg_catalog.format('SELECT %I.unschedule($1)', 'cron') USING v_job;
    RETURN true;
END
$$;
COMMENT ON FUNCTION llm.unschedule_reconciliation() IS
    'Removes the pg_cron job llm-reconciliation; false when there was none; LL010 without pg_cron.';
