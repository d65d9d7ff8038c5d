-- depends: 0005_books
-- transactional: false
-- llm-db 0006: invocations by (organization, period), for the daily audit.
--
-- The audit recomputes an organization's current and previous period from
-- their requests; without this index it would read every request the
-- organization ever made (its primary key), so the pass would grow with
-- history. Built CONCURRENTLY (writes go on during the build), which cannot
-- run inside a transaction: this migration is not transactional. A build that
-- failed leaves an invalid index, which the DROP removes when it runs again.

DROP INDEX CONCURRENTLY IF EXISTS llm.invocations_period;
CREATE INDEX CONCURRENTLY invocations_period ON llm.invocations (organization_id, period_start);
