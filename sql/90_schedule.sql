-- pg_cron scheduling of the hourly pass. pg_cron runs jobs from one database
-- (cron.database_name); when llm lives elsewhere, LL010's HINT gives the
-- cron.schedule_in_database call to run there (`llm-db schedule --cron-dsn`).
--
-- Managed PostgreSQL: the owner of these SECURITY DEFINER functions is
-- usually not a superuser, and they run with its rights. So nothing here reads
-- cron.database_name with current_setting (superuser-only: 42501 even with
-- missing_ok), and a missing grant on schema cron is told as 42501 with the GRANT
-- to run, never as a bad schedule. A job belongs to the role that schedules it:
-- the owner (pg_cron lets only a superuser schedule for another role).

CREATE OR REPLACE FUNCTION llm._require_cron(p_schedule text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_cron_db text;
    v_readable boolean;
BEGIN
    PERFORM FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_cron';
    IF FOUND THEN
        -- pg_cron grants nothing on schema cron to PUBLIC: a provider's admin grants USAGE
        IF NOT pg_catalog.has_schema_privilege('cron', 'USAGE') THEN
            RAISE EXCEPTION 'llm: role % may not use schema cron', current_user
                USING ERRCODE = '42501',
                      DETAIL = 'pg_cron is installed in this database, but its schema is not granted to the schema owner.',
                      HINT = pg_catalog.format('As the provider''s admin, in database %s run: GRANT USAGE ON SCHEMA cron TO %I;',
                                               pg_catalog.current_database(), current_user);
        END IF;
        RETURN;
    END IF;
    -- cron.database_name is superuser-only: pg_settings hides it from other roles
    -- (current_setting would raise 42501, missing_ok or not). Not shown to a role that
    -- may read every setting means pg_cron is not loaded; otherwise it is unknown.
    SELECT s.setting INTO v_cron_db FROM pg_catalog.pg_settings AS s WHERE s.name = 'cron.database_name';
    v_readable := pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE');
    RAISE EXCEPTION 'llm: pg_cron is not installed in database %', pg_catalog.current_database()
        USING ERRCODE = 'LL010',
              DETAIL = CASE WHEN v_cron_db IS NOT NULL
                            THEN pg_catalog.format('pg_cron runs jobs from database %s.', v_cron_db)
                            WHEN v_readable
                            THEN 'pg_cron is not loaded: add it to shared_preload_libraries and restart.'
                            ELSE 'pg_cron runs jobs from the database named by the server setting cron.database_name (often postgres), which only a superuser or pg_read_all_settings may read.' END,
              HINT = CASE WHEN v_cron_db = pg_catalog.current_database() OR (v_cron_db IS NULL AND v_readable)
                          THEN 'CREATE EXTENSION pg_cron; then SELECT llm.schedule_reconciliation();'
                          ELSE pg_catalog.format(
                              'In %s run: SELECT cron.schedule_in_database(%L, %L, %L, %L); or use llm-db schedule --cron-dsn.',
                              coalesce('database ' || v_cron_db, 'the pg_cron database (server setting cron.database_name)'),
                              'llm-reconciliation:' || pg_catalog.current_database(),
                              coalesce(p_schedule, '0 * * * *'),
                              'CALL llm.run_reconciliation()', pg_catalog.current_database()) END;
END
$$;
COMMENT ON FUNCTION llm._require_cron(text) IS
    'Raises LL010 when pg_cron is not installed in this database, with a HINT that schedules the pass from the cron database; 42501 with the GRANT to run when the schema cron is not usable.';

CREATE OR REPLACE FUNCTION llm.schedule_reconciliation(p_schedule text DEFAULT '0 * * * *')
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_job bigint;
    v_database text;
    v_message text;
BEGIN
    PERFORM llm._check_text('p_schedule', p_schedule, 200);
    PERFORM llm._require_cron(p_schedule);
    BEGIN
        -- pg_cron replaces a job of the same name and owner: idempotent
        EXECUTE pg_catalog.format('SELECT %I.schedule($1, $2, $3)', 'cron')
           INTO v_job
          USING 'llm-reconciliation', p_schedule, 'CALL llm.run_reconciliation()';
    EXCEPTION
        WHEN invalid_parameter_value THEN  -- pg_cron's own code for a schedule it cannot parse
            GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
            RAISE EXCEPTION 'llm: pg_cron refused schedule %', p_schedule
                USING ERRCODE = '22023', DETAIL = v_message,
                      HINT = 'Use a five-field cron expression such as ''0 * * * *''.';
        WHEN insufficient_privilege THEN
            GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
            RAISE EXCEPTION 'llm: role % may not schedule pg_cron jobs', current_user
                USING ERRCODE = '42501', DETAIL = v_message,
                      HINT = pg_catalog.format('As the provider''s admin, in database %s run: GRANT EXECUTE ON FUNCTION cron.schedule(text, text, text) TO %I;',
                                               pg_catalog.current_database(), current_user);
    END;
    -- pg_cron's upsert on (jobname, username) keeps the job's database: a job of this
    -- name scheduled for another database would go on running there, not here
    EXECUTE pg_catalog.format('SELECT j.database FROM %I.job AS j WHERE j.jobid = $1', 'cron')
       INTO v_database USING v_job;
    IF v_database IS DISTINCT FROM pg_catalog.current_database() THEN
        RAISE EXCEPTION 'llm: pg_cron job llm-reconciliation of role % runs in database %', current_user, v_database
            USING ERRCODE = '42710',
                  DETAIL = 'pg_cron keeps the database of a job scheduled again under the same name and role.',
                  HINT = pg_catalog.format('Unschedule it (SELECT cron.unschedule(%s);) or schedule this database''s job under another name with llm-db schedule --cron-dsn.', v_job);
    END IF;
    RETURN v_job;
END
$$;
COMMENT ON FUNCTION llm.schedule_reconciliation(text) IS
    'Schedules (or reschedules) the pg_cron job llm-reconciliation of the schema owner running CALL llm.run_reconciliation() in this database; returns its job id; LL010 without pg_cron, 42501 without its grants, 42710 when that job runs in another database.';

CREATE OR REPLACE FUNCTION llm.unschedule_reconciliation()
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_job bigint;
BEGIN
    PERFORM llm._require_cron(NULL);
    -- this database's job of the owner only (a superuser sees every role's jobs)
    EXECUTE pg_catalog.format('SELECT j.jobid FROM %I.job AS j WHERE j.jobname = $1 AND j.username = current_user'
                              ' AND j.database = pg_catalog.current_database()', 'cron')
       INTO v_job USING 'llm-reconciliation';
    IF v_job IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE pg_catalog.format('SELECT %I.unschedule($1)', 'cron') USING v_job;
    RETURN true;
END
$$;
COMMENT ON FUNCTION llm.unschedule_reconciliation() IS
    'Removes the schema owner''s pg_cron job llm-reconciliation of this database; false when there was none; LL010 without pg_cron, 42501 without its grants.';
