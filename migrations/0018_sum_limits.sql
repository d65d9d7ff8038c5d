-- depends: 0017_budget_horizons
-- barrier: before
-- llm-db 0018: sums that cannot overflow (docs/architecture.md "Sum limits").
--
-- Every amount one call passes is capped at 10^15, but the books add them up: a
-- period's stripe of an organization without an allowance, a task, a day's usage, a
-- report over many periods. 0.3.0 kept those sums in bigint, and the 9,224th open
-- admission of 10^15 of a month failed with 22003 (bigint out of range), as did every
-- admission of that month while the holds stood. From this release on:
-- - what a period and a budget counter keep is refused past the sum limit, 10^18
--   (LL013, the new functions), so they stay bigint; a period's stripes gain
--   cents_room, their escrow of used cents under that limit (NULL, as for a stripe
--   not spread yet, until its next exact movement spreads it);
-- - what nothing bounds becomes numeric of the new domain llm.total: a task's credits
--   and cents, a day's usage, drift findings' figures and a pass's released holds;
--   the public results that sum them (the reports, books_snapshot, last_run, ...)
--   become numeric, so their functions are dropped here and created by sql/.
--
-- Under live traffic: ALTER COLUMN TYPE rewrites llm.executions, llm.daily_usage,
-- llm.drift_findings and llm.reconciliation_runs under an ACCESS EXCLUSIVE lock, held
-- for the rewrite (a task's start or end waits for it; docs/operations.md
-- "Upgrading"); migrate applies it once no transaction from before 0017 is open
-- (the barrier line above), so none reads a rewritten table with a snapshot older than
-- the rewrite (0017's last section). The previous release's functions keep working against the new types
-- (numeric arithmetic and assignment); its report and books functions are gone until
-- migrate puts the new sql/ live, moments later.

-- The ALTERs take their tables' locks in the functions' lock order (executions,
-- period_stripes, daily_usage; docs/architecture.md Conventions 15), the two tables
-- outside that order last.

CREATE DOMAIN llm.total AS numeric CHECK (VALUE >= 0 AND VALUE = pg_catalog.trunc(VALUE));
COMMENT ON DOMAIN llm.total IS
    'A non-negative whole sum of amounts that nothing bounds (a task''s, a day''s): numeric, so it never overflows.';

ALTER TABLE llm.executions
    ALTER COLUMN credits TYPE llm.total,
    ALTER COLUMN cents TYPE llm.total;

ALTER TABLE llm.period_stripes ADD COLUMN cents_room llm.amount;
COMMENT ON COLUMN llm.period_stripes.cents_room IS
    'Cents this stripe may still charge on its own; the stripes'' rooms never add up to more than the sum limit less the period''s used cents (NULL: spread on its next exact movement).';
COMMENT ON COLUMN llm.period_stripes.admit_room IS
    'Credits this stripe may still hold on its own; the stripes'' rooms never add up to more than the period has left to its allowance and to the sum limit (NULL: spread on its next exact movement).';

ALTER TABLE llm.daily_usage
    ALTER COLUMN credits TYPE llm.total,
    ALTER COLUMN cents TYPE llm.total,
    ALTER COLUMN input_tokens TYPE llm.total,
    ALTER COLUMN output_tokens TYPE llm.total;

ALTER TABLE llm.drift_findings
    ALTER COLUMN recorded_credits TYPE llm.total,
    ALTER COLUMN recorded_cents TYPE llm.total,
    ALTER COLUMN settled_credits TYPE llm.total,
    ALTER COLUMN settled_cents TYPE llm.total;

ALTER TABLE llm.reconciliation_runs
    ALTER COLUMN released_hold_credits TYPE llm.total;

ALTER TYPE llm.org_sweep ALTER ATTRIBUTE released_hold_credits TYPE numeric;

-- public results that become numeric: CREATE OR REPLACE cannot change them
DROP FUNCTION IF EXISTS llm.books_snapshot(uuid[], timestamptz);
DROP FUNCTION IF EXISTS llm.stale_by_organization_status(timestamptz);
DROP FUNCTION IF EXISTS llm.organization_totals(uuid[]);
DROP FUNCTION IF EXISTS llm.last_run(timestamptz);
DROP FUNCTION IF EXISTS llm.report_daily_usage(date, date, uuid[]);
DROP FUNCTION IF EXISTS llm.report_open_holds(uuid[], timestamptz);
DROP FUNCTION IF EXISTS llm.report_tasks(date, uuid[]);
DROP FUNCTION IF EXISTS llm.report_scope_usage(text, date, date, uuid[]);
