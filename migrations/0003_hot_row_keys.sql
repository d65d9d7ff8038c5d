-- depends: 0002_domains
-- llm-db 0003: no foreign keys from invocations to the hot rows.
--
-- Why: a foreign key check takes FOR KEY SHARE on the referenced row. Every
-- admission therefore share-locked its organization's period row and its task
-- row, the two rows that every admission and settlement of that organization
-- (and task) also updates; PostgreSQL records such mixed lockers as a
-- MultiXact, so a busy organization's period row carried a growing MultiXact
-- that every later locker had to read (MultiXact SLRU waits, tuple-lock waits).
-- Measured with 8 clients on one organization: 340-650 requests/s with both
-- keys, 1,000 without (docs/benchmarks.md); 100 organizations: +18 %.
--
-- What keeps the rule: an invocation is only ever written by the llm functions,
-- which check its task (LL006 / LL008) and create its period row before they
-- insert it, in the same transaction; periods and executions are never deleted
-- (no function does, and no role may); and llm.check_invariants() reports
-- invariant 8 for any invocation whose period or task row is missing. The
-- other foreign keys (ledger -> invocations, threshold_notices -> periods,
-- drift_findings -> executions) reference rows that are not hot and stay.

ALTER TABLE llm.invocations
    DROP CONSTRAINT invocations_organization_id_period_start_fkey,
    DROP CONSTRAINT invocations_organization_id_execution_id_fkey;
