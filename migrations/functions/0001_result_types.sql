-- A function step (llm_db/migrate.py): run once per database, in migrate's
-- functions transaction, before the files of sql/ re-create the routines, and
-- recorded in llm.upgrade_steps in that transaction.
--
-- CREATE OR REPLACE cannot change a routine's result type, and a public routine
-- returns its own composite type, never a table's row type (docs/architecture.md
-- Conventions 16: a column added to a table then changes no public result). So a
-- database that still holds a routine of an older result type has it dropped here,
-- and its file creates it again:
-- - 0.2.0's public routines that returned a table's row (admit_invocation,
--   mark_dispatched, upsert_organization, set_recovery_policy, claim_notices);
-- - 0.3.0's admit_invocation and mark_dispatched and their twins, which returned
--   llm.admission (llm.admission_result since 0.4.0, migration 0019);
-- - 0.3.0's twins of the organization's setters, which returned the table's row
--   (llm.organization_settings since 0.4.0).
-- It drops them in the transaction that re-creates them, so a caller finds the old
-- routine or the new one, never none; a call planned before the commit runs the
-- routine it planned with to its end. A database installed at 0.4.0 or later holds
-- none of them, and the step finds nothing to drop.
DO $$
DECLARE
    v_routine regprocedure;
BEGIN
    FOR v_routine IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_type AS t ON t.oid = p.prorettype
          JOIN pg_catalog.pg_class AS c ON c.oid = t.typrelid
         WHERE p.pronamespace = 'llm'::regnamespace AND (c.relkind <> 'c' OR t.typname = 'admission')
           AND (p.proname !~ '^_' OR p.proname IN ('_admit_invocation', '_mark_dispatched', '_upsert_organization',
                                                    '_set_allowance', '_set_recovery_policy'))
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', v_routine);
    END LOOP;
END
$$;
