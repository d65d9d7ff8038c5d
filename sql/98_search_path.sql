-- docs/architecture.md "Conventions" 2: every PL/pgSQL function of schema llm runs with
-- search_path = pg_catalog, llm, pg_temp, so nothing in a caller's schemas can stand
-- in for an operator, function or table of ours (tests/test_security.py tries).
--
-- Spelled once, here, for every function the files before this one define:
-- CREATE OR REPLACE resets a function's settings and migrate applies sql/ as a
-- whole, so this runs after each definition, in the same transaction. A file of
-- sql/ applied alone (psql -f) leaves its functions unpinned until the next
-- migrate: never do that (docs/operations.md, "Installing and upgrading").
-- Not pinned, by rule: the SQL predicates of the request path (a SET clause stops
-- PostgreSQL from inlining them; each is one fully qualified expression) and the
-- committing procedure (a procedure with a SET clause cannot COMMIT).
DO $$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
         WHERE p.pronamespace = 'llm'::pg_catalog.regnamespace
           AND p.prokind = 'f' AND l.lanname = 'plpgsql'
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, llm, pg_temp', v_fn);
    END LOOP;
END
$$;
