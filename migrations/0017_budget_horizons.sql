-- depends: 0016_notice_scope_key
-- llm-db 0017: the budget retention horizon of each organization.
--
-- Retention deletes budget counters of windows that ended long enough ago. An
-- admission takes its clock from the caller, so one dated into a purged window
-- would re-create its counter from zero and be decided against a window that
-- looks unused. The horizon is where retention stands: every counter of a window
-- that ended on or before it may have been deleted. Retention raises it (never
-- lowers it) in the transaction that deletes, and an admission that would create a
-- counter of such a window is refused (LL012) instead of starting it from zero
-- (docs/architecture.md "Budgets", Retention).
--
-- Under live traffic: a new table, and one INSERT ... SELECT of a row per
-- organization that has budget counters. Their horizon is what 0.3.0's retention
-- could have deleted with a true clock: the UTC day of now() - budget_retention.

CREATE TABLE llm.budget_horizons (
    organization_id uuid NOT NULL,
    horizon date NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT budget_horizons_pkey PRIMARY KEY (organization_id)
);
COMMENT ON TABLE llm.budget_horizons IS
    'Per organization, the day on or before which every budget window ended may have lost its counter to retention; admissions that would create a counter of such a window are refused (LL012). Only raised.';

INSERT INTO llm.budget_horizons (organization_id, horizon, updated_at)
SELECT c.organization_id,
       pg_catalog.date_trunc('day', pg_catalog.timezone('UTC', now() - s.budget_retention))::date, now()
  FROM (SELECT DISTINCT b.organization_id FROM llm.budget_counters AS b) AS c
 CROSS JOIN llm.settings AS s;
