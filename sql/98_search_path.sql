-- docs/architecture.md "Conventions" 2: every PL/pgSQL function of schema llm runs with
-- search_path = pg_catalog, llm, pg_temp, so nothing in a caller's schemas can stand
-- in for an operator, function or table of ours (tests/test_security.py tries).
--
-- Spelled once, here, for every function the files before this one define:
-- CREATE OR REPLACE resets a function's settings and migrate applies sql/ as a
-- whole, so this runs after each definition, in the same transaction. A file of
-- sql/ applied alone (psql -f) leaves its functions unpinned until the next
-- migrate: never do that (docs/install.md, "Installing").
-- Not pinned, by rule: the SQL predicates of the request path (a SET clause stops
-- PostgreSQL from inlining them; each is one fully qualified expression), the
-- committing procedure (a procedure with a SET clause cannot COMMIT), and the
-- private routines of the request path listed below. Entering a pinned routine saves
-- and restores the setting (2 to 5 us a call, measured; a cycle makes a dozen calls),
-- and these run only inside a pinned one: each is SECURITY INVOKER and no role may
-- execute it (tests/test_roles.py), so its callers are our pinned routines (or the
-- owner, or Citus delegating a twin to a worker), and each names everything fully
-- qualified (tests/test_lint.py checks every routine under a path without llm).
DO $$
DECLARE
    v_fn regprocedure;
    v_request_path constant text[] := ARRAY[
        -- the twins of the request calls (sql/30_admission.sql, sql/35_settlement.sql)
        'llm._admit_invocation', 'llm._mark_dispatched', 'llm._settle_invocation',
        'llm._fail_invocation', 'llm._end_invocation',
        -- a stripe's movement (sql/20_stripes.sql)
        'llm._move_within_rooms', 'llm._move_stripe',
        -- a request's budgets (sql/28_budgets.sql)
        'llm._budgets_revision', 'llm._move_request_counters', 'llm._move_within_counter_room',
        'llm._mask_elements',
        -- a request's price (sql/27_prices.sql, sql/35_settlement.sql)
        'llm._usage_cost', 'llm._require_price', 'llm._price_request', 'llm._settle_usage'];
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
         WHERE p.pronamespace = 'llm'::pg_catalog.regnamespace
           AND p.prokind = 'f' AND l.lanname = 'plpgsql'
           AND NOT ('llm.' || p.proname = ANY (v_request_path) AND NOT p.prosecdef)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, llm, pg_temp', v_fn);
    END LOOP;
END
$$;
