-- depends: 0016_notice_scope_key
-- llm-db 0017: the budget retention horizon of each organization; and the previous
-- release's routines made safe for the migrations after this one (the last section).
--
-- Retention deletes budget counters of windows that ended long enough ago. An
-- admission takes its clock from the caller, so one dated into a purged window
-- would re-create its counter from zero and be decided against a window that
-- looks unused. The horizon is where retention stands: every counter of a window
-- that ended on or before it may have been deleted. Retention raises it (never
-- lowers it) in the transaction that deletes, and an admission that would create a
-- counter of such a window is refused (LL012) instead of starting it from zero
-- (docs/architecture.md "Budgets", Retention).
--
-- Under live traffic: a new table, and one INSERT ... SELECT of a row per
-- organization that has budget counters. Their horizon is what 0.3.0's retention
-- could have deleted with a true clock: the UTC day of now() - budget_retention.

CREATE TABLE llm.budget_horizons (
    organization_id uuid NOT NULL,
    horizon date NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT budget_horizons_pkey PRIMARY KEY (organization_id)
);
COMMENT ON TABLE llm.budget_horizons IS
    'Per organization, the day on or before which every budget window ended may have lost its counter to retention; admissions that would create a counter of such a window are refused (LL012). Only raised.';

INSERT INTO llm.budget_horizons (organization_id, horizon, updated_at)
SELECT c.organization_id,
       pg_catalog.date_trunc('day', pg_catalog.timezone('UTC', now() - s.budget_retention))::date, now()
  FROM (SELECT DISTINCT b.organization_id FROM llm.budget_counters AS b) AS c
 CROSS JOIN llm.settings AS s;

-- ---------------------------------------------------------------- the previous release's routines
--
-- What the later migrations of this release do under live traffic needs two changes
-- to 0.3.0's routines first, made here from their own definitions (pg_get_functiondef:
-- body, SECURITY DEFINER and search_path as they are), so that this serves whichever
-- release is installed; a fresh database has none of them yet, and a second run finds
-- nothing left to change. migrate applies 0018 after the barrier (its `-- barrier:
-- before`): once every transaction open when 0018 comes has ended, no call still
-- runs them as they were. The functions step replaces them all.
--
-- 1. 0018 rewrites llm.executions (ALTER COLUMN TYPE), and a rewritten row is new to
--    every snapshot taken before the rewrite committed. A STABLE routine reads with its
--    caller's snapshot, taken before it queued behind the rewrite's lock: 0.3.0's
--    _task_admits then found no row and raised LL006 for a running task. VOLATILE,
--    each of its statements takes its snapshot once it holds its table's lock.
-- 2. 0021 adds columns to llm.organizations and llm.invocations. Four public routines
--    (admit_invocation, mark_dispatched, upsert_organization, set_recovery_policy)
--    read their twin's result with `SELECT * INTO v FROM llm._twin(...)`, and the twin
--    returns the row of one of those tables. That statement's plan fixes the row's
--    columns when it is made and depends on no table, so a call that planned it before
--    0021 committed and ran the twin after (queued behind 0021's locks) got a row with
--    more columns than its plan: 42804, "function return row and query-specified
--    return row do not match". Read as a value (`v := llm._twin(...)`, assigned column
--    by column as SELECT INTO does), the row has no columns fixed in a plan.

DO $$
DECLARE
    v_routine regprocedure;
    v_definition text;
    v_rewritten text;
BEGIN
    IF (SELECT p.provolatile FROM pg_catalog.pg_proc AS p
         WHERE p.oid = pg_catalog.to_regprocedure('llm._task_admits(uuid, uuid, uuid, bigint, text, text, text, text)'))
       = 's' THEN
        ALTER FUNCTION llm._task_admits(uuid, uuid, uuid, bigint, text, text, text, text) VOLATILE;
    END IF;
    FOR v_routine IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'llm'::regnamespace
           AND p.proname IN ('admit_invocation', 'mark_dispatched', 'upsert_organization', 'set_recovery_policy')
    LOOP
        v_definition := pg_catalog.pg_get_functiondef(v_routine);
        v_rewritten := pg_catalog.regexp_replace(
            v_definition, 'SELECT \* INTO (v_[a-z_]+)\s+FROM (llm\._[a-z_]+)\(', '\1 := \2(');
        IF v_rewritten <> v_definition THEN
            EXECUTE v_rewritten;
        END IF;
    END LOOP;
END
$$;
