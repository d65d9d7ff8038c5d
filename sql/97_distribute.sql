-- Citus: one statement after migrate shards every per-organization table by
-- organization_id (co-located), makes catalogs reference tables and
-- distributes the per-organization twins on their first argument.
--
-- Why a public routine has a twin (`_<name>`), and why none folds into it: the
-- public routine checks its arguments before anything is delegated, a NULL
-- organization among them, which crashes a Citus coordinator routing a delegated
-- call (docs/architecture.md "Citus rules" 4); the twin, distributed with
-- force_delegation, does the work on the organization's node. A single node runs
-- the same twin behind the same check, so every test of the single-node suite runs
-- the code a cluster delegates; tests/test_citus_readiness.py checks that each
-- public per-organization routine reaches its twin in the form Citus delegates.

-- Long on purpose: one call that shards the schema, step after step in the order
-- Citus needs (check, reference tables, distributed tables, twins), read top to bottom.
CREATE OR REPLACE FUNCTION llm.distribute(p_shard_count integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_table text;
    v_fn regprocedure;
    v_done text[] := '{}'::text[];
BEGIN
    PERFORM FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'llm: citus is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = 'LL011',
                  HINT = 'Add citus to shared_preload_libraries, CREATE EXTENSION citus, add workers, then SELECT llm.distribute();';
    END IF;
    IF p_shard_count IS NOT NULL THEN
        EXECUTE pg_catalog.format('SET LOCAL citus.shard_count = %s', p_shard_count);
    END IF;

    -- executions.task_key references task_kinds: with Citus' default, making
    -- task_kinds a reference table first turns every table connected to it by
    -- foreign keys into a "Citus local table"; distributing organizations then
    -- fails (a local table's foreign key to a distributed table) and would
    -- drop and recreate the table, and every function depending on its row type.
    PERFORM pg_catalog.set_config('citus.enable_local_reference_table_foreign_keys', 'off', true);
    FOREACH v_table IN ARRAY ARRAY['llm.task_kinds', 'llm.settings', 'llm.upgrade_steps',
                                   'llm.price_versions', 'llm.credit_rates'] LOOP
        EXECUTE pg_catalog.format('SELECT %I($1)', 'create_reference_table') USING v_table;
        v_done := pg_catalog.array_append(v_done, v_table);
    END LOOP;

    EXECUTE pg_catalog.format('SELECT %I($1, $2)', 'create_distributed_table') USING 'llm.organizations', 'id';
    v_done := pg_catalog.array_append(v_done, 'llm.organizations'::text);
    -- parents before children so co-located foreign keys resolve
    FOREACH v_table IN ARRAY ARRAY['llm.period_heads', 'llm.period_stripes', 'llm.executions',
                                   'llm.invocations', 'llm.threshold_notices', 'llm.daily_usage',
                                   'llm.drift_findings', 'llm.period_findings', 'llm.sweep_totals',
                                   'llm.budget_limits', 'llm.budget_counters', 'llm.invocation_scopes',
                                   'llm.budget_horizons', 'llm.cost_corrections'] LOOP
        EXECUTE pg_catalog.format('SELECT %I($1, $2, colocate_with => $3)', 'create_distributed_table')
          USING v_table, 'organization_id', 'llm.organizations';
        v_done := pg_catalog.array_append(v_done, v_table);
    END LOOP;

    -- the twins: every private per-organization function whose first argument is the organization
    FOR v_fn IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'llm'::regnamespace
           AND p.proname IN ('_upsert_organization', '_admit_invocation', '_mark_dispatched',
                             '_settle_invocation', '_settle_usage', '_fail_invocation', '_open_execution',
                             '_close_execution', '_reconcile_org', '_end_claim',
                             '_set_recovery_policy', '_set_allowance', '_audit_org',
                             '_set_period_stripes', '_set_budget', '_set_budget_stripes', '_note_refusal',
                             '_reprice_org')
    LOOP
        EXECUTE pg_catalog.format('SELECT %I($1::regprocedure, $2, colocate_with => $3, force_delegation => true)', 'create_distributed_function')
          USING v_fn::text, 'p_organization_id', 'llm.organizations';
        v_done := pg_catalog.array_append(v_done, v_fn::text);
    END LOOP;

    -- every other llm routine, to the workers, where the twins call them: Citus
    -- ships a routine when it is created, except one whose signature uses the
    -- row type of a table that was still local then (_settings, _operational_org,
    -- admit_invocation, ...); without this a delegated twin fails with 42883.
    -- llm leaves the search_path first: Citus deparses the GRANT it sends with
    -- the routine with argument types unqualified when they are visible
    -- (GRANT ... llm._move_budgets(uuid, invocations[], ...)), which fails on a worker.
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    -- dynamic: the Citus catalogs exist only where citus is installed
    FOR v_fn IN EXECUTE pg_catalog.format($q$
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'llm'::regnamespace
           AND NOT EXISTS (SELECT FROM pg_catalog.%I AS d
                            WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid)
           -- not one tied to a coordinator-local table (_finish_run: reconciliation_runs);
           -- a standalone composite type (llm.admission_result, llm.organization_settings)
           -- is no table: Citus sends it with the routine
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend AS dep
                             JOIN pg_catalog.pg_type AS t ON t.oid = dep.refobjid
                             JOIN pg_catalog.pg_class AS c ON c.oid = t.typrelid
                            WHERE dep.classid = 'pg_catalog.pg_proc'::regclass AND dep.objid = p.oid
                              AND dep.refclassid = 'pg_catalog.pg_type'::regclass AND c.relkind <> 'c'
                              AND NOT EXISTS (SELECT FROM pg_catalog.%I AS dp
                                               WHERE dp.logicalrelid = t.typrelid))
         ORDER BY p.oid
    $q$, 'pg_dist_object', 'pg_dist_partition')
    LOOP
        EXECUTE pg_catalog.format('SELECT %I($1::regprocedure)', 'create_distributed_function')
          USING v_fn::text;
        v_done := pg_catalog.array_append(v_done, v_fn::text);
    END LOOP;
    RETURN pg_catalog.array_to_string(v_done, ', ');
END
$$;
COMMENT ON FUNCTION llm.distribute(integer) IS
    'Under Citus: reference tables for catalogs, per-organization tables distributed on organization_id co-located with organizations, per-organization twins distributed with force_delegation, the other llm routines propagated to the workers; LL011 without citus.';
