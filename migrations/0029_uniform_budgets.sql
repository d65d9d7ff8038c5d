-- depends: 0028_notice_names
-- llm-db 0029: an organization's budgets on its own row, when no budget names an id.
--
-- Admission reads the organization's row anyway. When every budget of the
-- organization is its own (a day or a week) or a scope's default ('*'), which
-- budgets apply to a request follows from the scopes it names alone, so the row can
-- say it: the budgets' bits, and their limits and revisions in bit order, and
-- admission reads no budget. An organization with a budget of a named id (a project's
-- own, a key's own) keeps them NULL and admission reads llm.budget_limits, as
-- before. set_budget and set_budget_stripes write them with has_budgets and
-- budgets_revision, under the organization's row (docs/architecture.md "Budgets");
-- invariant 21 checks them against llm.budget_limits.
--
-- Under live traffic: three nullable columns (no rewrite), locked briefly. NULL
-- means not known, and admission reads the budgets then, so the previous release's
-- functions, which never write them, leave nothing wrong; the contract step
-- (migrations/contract/0029_uniform_budgets.sql) fills them once those are gone.

ALTER TABLE llm.organizations
    ADD COLUMN uniform_budget_mask integer,
    ADD COLUMN uniform_budget_limits bigint[],
    ADD COLUMN uniform_budget_revisions uuid[];
COMMENT ON COLUMN llm.organizations.uniform_budget_mask IS
    'When no budget of the organization names an id (each is its own day or week, or a scope''s ''*''): the bits of its budgets (as invocations.budget_mask), 0 with none. NULL: a budget names an id, or not known; admission reads llm.budget_limits then.';
COMMENT ON COLUMN llm.organizations.uniform_budget_limits IS
    'The limits of the budgets of uniform_budget_mask, in bit order (NULL with it).';
COMMENT ON COLUMN llm.organizations.uniform_budget_revisions IS
    'The revisions (llm.budget_limits.revision) of the budgets of uniform_budget_mask, in bit order (NULL with it).';
