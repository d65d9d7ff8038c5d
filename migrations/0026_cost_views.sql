-- depends: 0025_cost_sums
-- llm-db 0026: llm.periods shows the period's cost, used_cost_nanos: its used cents
-- * 10^7 plus the cost the book priced (0025).
--
-- A transaction of its own, after 0025's: a reader of the view locks the view and
-- then the tables under it, while a request's call locks period_stripes and then
-- period_heads, so a transaction that altered period_stripes and then replaced the view
-- would meet one of them in a deadlock (tests/test_upgrade_live.py). Replacing the view
-- alone waits only for the readers of the moment.

-- appended, as every column of a view is (CREATE OR REPLACE VIEW)
CREATE OR REPLACE VIEW llm.periods AS
SELECT h.organization_id, h.period_start, h.period_end, h.allowance_credits,
       sum(s.used_credits)::bigint AS used_credits,
       sum(s.held_credits)::bigint AS held_credits,
       sum(s.used_cents)::bigint AS used_cents,
       sum(s.used_cents)::numeric * 10000000 + sum(s.priced_nanos) AS used_cost_nanos
  FROM llm.period_heads AS h
  JOIN llm.period_stripes AS s
    ON s.organization_id = h.organization_id AND s.period_start = h.period_start
 GROUP BY h.organization_id, h.period_start, h.period_end, h.allowance_credits;
