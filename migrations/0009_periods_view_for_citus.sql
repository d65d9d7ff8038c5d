-- depends: 0008_ledger_view
-- llm-db 0009: llm.periods groups by every column it shows.
--
-- 0007 grouped by (organization_id, period_start) and showed period_end and
-- allowance_credits through the primary key of period_heads (a functional
-- dependency). That makes the view depend on the key constraint, and Citus does
-- not propagate such a view to its workers: the daily audit, delegated to the
-- worker holding the organization, then failed there with 42P01 (relation
-- llm.periods does not exist). Same rows, same columns, no dependency on a
-- constraint (tests/test_citus_readiness.py keeps it so).

CREATE OR REPLACE VIEW llm.periods AS
SELECT h.organization_id, h.period_start, h.period_end, h.allowance_credits,
       sum(s.used_credits)::bigint AS used_credits,
       sum(s.held_credits)::bigint AS held_credits,
       sum(s.used_cents)::bigint AS used_cents
  FROM llm.period_heads AS h
  JOIN llm.period_stripes AS s
    ON s.organization_id = h.organization_id AND s.period_start = h.period_start
 GROUP BY h.organization_id, h.period_start, h.period_end, h.allowance_credits;
