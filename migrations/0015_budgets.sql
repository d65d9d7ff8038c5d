-- depends: 0014_result_types
-- llm-db 0015: budgets at every level and window (issue 23), the expand step.
--
-- A request may name a project, an API key and an end user; a budget caps one
-- scope id (or the scope's '*' default) per calendar window in UTC (day, week
-- from Monday, month). Two new tables hold them: budget_limits (what
-- llm.set_budget sets, listed by the view llm.budgets) and budget_counters (one
-- row per scope, id, window and window start, moved by every movement of the
-- requests admitted under it). A request records its scope ids and the counters
-- it moves in a third, invocation_scopes (budget_mask, fixed at admission): bit 3 * scope + window, scopes organization
-- 0, project 1, api_key 2, end_user 3, windows day 0, week 1, month 2
-- (organization month is the allowance, never a bit).
--
-- threshold_notices gains the scope, id and window a notice is for. The
-- allowance's notices are (organization, NULL, month); the columns' defaults
-- say so for the rows the previous release's functions insert while the
-- upgrade runs, and 0016 backfills the rest and builds the new unique key.
--
-- Under live traffic: new tables, nullable columns of plain types on
-- threshold_notices (no rewrite, no scan), two column defaults, a settings
-- column (one row), a foreign key dropped (no scan) and an attribute on the type
-- claim_notices returns. No column of a table whose row a previous release's
-- public routine returns (invocations, organizations). Lock order of
-- migrations: settings (outside the list), period_heads, threshold_notices.

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

ALTER TABLE llm.settings ADD COLUMN budget_retention interval NOT NULL DEFAULT '400 days',
    ADD CONSTRAINT settings_budget_retention_range
        CHECK (budget_retention > interval '0' AND budget_retention <= interval '100 years');
COMMENT ON COLUMN llm.settings.budget_retention IS
    'The pass deletes budget counters of windows that ended longer ago than this.';

-- A request's scope ids and budget_mask live beside it, not on llm.invocations: the
-- previous release's admit_invocation and mark_dispatched return the invocations row,
-- and a call planned before a column was added there and run after returns a row the
-- plan does not expect (42804), one call per client under live traffic. From this
-- release on those functions return their own types (0014), so a later release may
-- move the columns onto the request.
CREATE TABLE llm.invocation_scopes (
    organization_id uuid NOT NULL,
    invocation_id uuid NOT NULL,
    project text,
    api_key text,
    end_user text,
    budget_mask smallint NOT NULL,
    CONSTRAINT invocation_scopes_pkey PRIMARY KEY (organization_id, invocation_id)
);
COMMENT ON TABLE llm.invocation_scopes IS
    'The project, API key and end user a request named at admission, and the budget counters it moves (budget_mask); one row per request that named a scope id or was admitted under a budget.';
COMMENT ON COLUMN llm.invocation_scopes.budget_mask IS
    'The budget counters the request moves, fixed at admission: bit 3 * scope + window (organization 0, project 1, api_key 2, end_user 3; day 0, week 1, month 2); 0 when none.';

-- A notice's period_start is its window's start: a budget's day or week starts
-- on no period of the organization, so the notices' foreign key to their period
-- goes (an allowance's notice is still written only under its period's lock,
-- invariant 5). Dropping it locks period_heads as well: taken first, in the
-- lock order.
LOCK TABLE llm.period_heads IN ACCESS EXCLUSIVE MODE;
ALTER TABLE llm.threshold_notices
    DROP CONSTRAINT threshold_notices_organization_id_period_start_fkey;

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
COMMENT ON TYPE llm.notice_claim IS
    'A notice as claim_notices returns it, with its claim''s token and (schema 0015) the scope, id and window it is for: the columns of llm.threshold_notices as of 0.3.0, fixed.';
