-- depends: 0014_result_types
-- llm-db 0015: budgets at every level and window (issue 23), the expand step.
--
-- A request may name a project, an API key and an end user; a budget caps one
-- scope id (or the scope's '*' default) per calendar window in UTC (day, week
-- from Monday, month). Two new tables hold them: budget_limits (what
-- llm.set_budget sets, listed by the view llm.budgets) and budget_counters (one
-- row per scope, id, window and window start, moved by every movement of the
-- requests admitted under it). A request records the counters it moves in
-- budget_mask, fixed at admission: bit 3 * scope + window, scopes organization
-- 0, project 1, api_key 2, end_user 3, windows day 0, week 1, month 2
-- (organization month is the allowance, never a bit).
--
-- threshold_notices gains the scope, id and window a notice is for. The
-- allowance's notices are (organization, NULL, month); the columns' defaults
-- say so for the rows the previous release's functions insert while the
-- upgrade runs, and 0016 backfills the rest and builds the new unique key.
--
-- Under live traffic: new tables, nullable columns of plain types on
-- invocations and threshold_notices (no rewrite, no scan), two column
-- defaults, a settings column (one row) and an attribute on the type
-- claim_notices returns; the notices' foreign key dropped. Lock order of
-- migrations: organizations, settings (outside the list), invocations,
-- period_heads, threshold_notices.

CREATE TABLE llm.budget_limits (
    organization_id uuid NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    scope text NOT NULL CHECK (scope IN ('organization', 'project', 'api_key', 'end_user')),
    scope_id text,
    budget_window text NOT NULL CHECK (budget_window IN ('day', 'week', 'month')),
    limit_credits bigint NOT NULL CHECK (limit_credits BETWEEN 0 AND 1000000000000000),
    thresholds integer[] NOT NULL,
    revision uuid NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT budget_limits_scope_id CHECK ((scope = 'organization') = (scope_id IS NULL)),
    CONSTRAINT budget_limits_not_allowance CHECK (NOT (scope = 'organization' AND budget_window = 'month')),
    CONSTRAINT budget_limits_pkey PRIMARY KEY (organization_id, id),
    CONSTRAINT budget_limits_key UNIQUE NULLS NOT DISTINCT (organization_id, scope, scope_id, budget_window)
);
COMMENT ON TABLE llm.budget_limits IS
    'The budgets llm.set_budget sets: a limit and thresholds per (organization, scope, scope id or ''*'', window); listed by llm.budgets.';

CREATE TABLE llm.budget_counters (
    organization_id uuid NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    scope text NOT NULL,
    scope_id text,
    budget_window text NOT NULL,
    window_start date NOT NULL,
    used_credits bigint NOT NULL DEFAULT 0,
    held_credits bigint NOT NULL DEFAULT 0,
    used_cents bigint NOT NULL DEFAULT 0,
    admitted_limit bigint NOT NULL,
    admitted_revision uuid NOT NULL,
    CONSTRAINT budget_counters_pkey PRIMARY KEY (organization_id, id),
    CONSTRAINT budget_counters_key UNIQUE NULLS NOT DISTINCT
        (organization_id, scope, scope_id, budget_window, window_start)
) WITH (fillfactor = 70);
COMMENT ON TABLE llm.budget_counters IS
    'What the requests admitted under a budget use, per (organization, scope, id, window, window start); an own budget and its scope''s ''*'' share the row.';
COMMENT ON COLUMN llm.budget_counters.admitted_limit IS
    'The limit the last admission counted here was decided against (invariant 14).';
COMMENT ON COLUMN llm.budget_counters.admitted_revision IS
    'The revision of the budget that limit came from (budget_limits.revision, new at every set_budget): when the budget that applies now has another, the limit changed after the last admission.';

ALTER TABLE llm.organizations ADD COLUMN has_budgets boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN llm.organizations.has_budgets IS
    'Whether the organization has a budget (set_budget keeps it): admission looks its budgets up only then.';

ALTER TABLE llm.settings ADD COLUMN budget_retention interval NOT NULL DEFAULT '400 days',
    ADD CONSTRAINT settings_budget_retention_range
        CHECK (budget_retention > interval '0' AND budget_retention <= interval '100 years');
COMMENT ON COLUMN llm.settings.budget_retention IS
    'The pass deletes budget counters of windows that ended longer ago than this.';

ALTER TABLE llm.invocations ADD COLUMN project text, ADD COLUMN api_key text,
    ADD COLUMN end_user text, ADD COLUMN budget_mask smallint;
COMMENT ON COLUMN llm.invocations.budget_mask IS
    'The budget counters the request moves, fixed at admission: bit 3 * scope + window (organization 0, project 1, api_key 2, end_user 3; day 0, week 1, month 2); NULL or 0 when none.';

-- A budget's notice holds its window's start in period_start (a day, a Monday, a
-- month's first day), which is no period of the allowance: the notices lose their
-- foreign key to llm.period_heads (dropping it locks the referenced table too, so
-- that table first, in the lock order of migrations).
LOCK TABLE llm.period_heads IN ACCESS EXCLUSIVE MODE;
ALTER TABLE llm.threshold_notices DROP CONSTRAINT threshold_notices_organization_id_period_start_fkey;
ALTER TABLE llm.threshold_notices ADD COLUMN scope text, ADD COLUMN scope_id text,
    ADD COLUMN budget_window text;
ALTER TABLE llm.threshold_notices ALTER COLUMN scope SET DEFAULT 'organization';
ALTER TABLE llm.threshold_notices ALTER COLUMN budget_window SET DEFAULT 'month';
COMMENT ON COLUMN llm.threshold_notices.scope IS
    'organization for the allowance and the organization''s day and week budgets; else the budget''s scope.';
COMMENT ON COLUMN llm.threshold_notices.scope_id IS
    'The real id the budget counted (never ''*''); NULL for the organization scope.';

ALTER TYPE llm.notice_claim ADD ATTRIBUTE scope text, ADD ATTRIBUTE scope_id text,
    ADD ATTRIBUTE budget_window text;
