-- depends: 0021_lean_write_path
-- transactional: false
-- llm-db 0022: the indexes of the lean write path (issue 32), built CONCURRENTLY.
--
-- - invocations_created (organization_id, created_at): every read of requests by
--   time, from the open-request floor of the period stripes (the sweep, the stale
--   counts), by period (the audit: a period is a range of admission times) and by
--   settlement day (the daily rebuild, bounded by the stripes' settle lag). It
--   replaces invocations_open, invocations_period and invocations_settled_at, which
--   the previous release's functions read and this release's contract step drops:
--   with none of them a settlement changes no indexed column, so its update is HOT.
-- - budget_counters_stripe_key: a counter's key with its stripe; the previous key,
--   without it, goes in the contract step (the previous release's upserts name it).
-- - period_stripes_open: the stripes a pass still has to look at (not quiet).
-- - period_stripes_settled: the stripes whose requests may have settled on or after a
--   day (the period's last day plus the settle lag), for the daily rebuild.
--
-- Re-runnable from any point: a build interrupted leaves an invalid index, which the
-- DROP removes before the build starts again.

DROP INDEX CONCURRENTLY IF EXISTS llm.invocations_created;
CREATE INDEX CONCURRENTLY invocations_created ON llm.invocations (organization_id, created_at);

DROP INDEX CONCURRENTLY IF EXISTS llm.budget_counters_stripe_key;
CREATE UNIQUE INDEX CONCURRENTLY budget_counters_stripe_key ON llm.budget_counters
    (organization_id, scope, scope_id, budget_window, window_start, stripe) NULLS NOT DISTINCT;

DROP INDEX CONCURRENTLY IF EXISTS llm.period_stripes_open;
CREATE INDEX CONCURRENTLY period_stripes_open ON llm.period_stripes (organization_id)
    WHERE quiet IS NOT TRUE;

DROP INDEX CONCURRENTLY IF EXISTS llm.period_stripes_settled;
CREATE INDEX CONCURRENTLY period_stripes_settled ON llm.period_stripes
    ((period_start + 32 + (coalesce(settle_lag_hours, 0) + 23) / 24));
