-- depends: 0020_limit_reached_notices
-- llm-db 0021: a lean write path (issue 32), the expand step.
--
-- What 0.4.0's functions keep that 0.3.0's did not (docs/architecture.md "The
-- write path"):
-- - a request's scope ids, the bits of the budgets it is held on and the stripe of
--   their counters live on the request itself (llm.invocations: project, api_key,
--   end_user, budget_mask, budget_stripe), so a request under budgets writes one row
--   at admission and finds its counters in the row its settlement updates; requests
--   admitted before keep theirs in llm.invocation_scopes (budget_mask NULL here);
-- - whether an organization has a budget at all (organizations.has_budgets; NULL:
--   not known, looked up), so a request without budgets pays nothing for them, and
--   the revision of its budgets as a whole (organizations.budgets_revision), which a
--   counter's escrow rooms are valid under;
-- - per period stripe, what the pass and the reports read instead of the indexes
--   settlement used to touch (period_stripes: open_requests, open_since, quiet, and
--   the bounds settle_lag_hours / settle_lead_hours on how far a terminal request's
--   settlement lies from its admission; NULL: not known yet, the contract step of
--   this release computes them once the previous release's calls are gone);
-- - striped budget counters with their escrow (budget_counters: stripe, stripes,
--   admit_room, notice_room, cents_room, rooms_revision; budget_limits.stripes);
-- - llm.upgrade_steps, the contract steps migrate has finished.
--
-- And llm.invocations gets the fillfactor a HOT settlement needs: a settlement
-- rewrites its row on the same page, which only new pages leave room for.
--
-- Under live traffic: only new nullable columns of plain types and a storage
-- parameter; budget_counters' stripe and stripes take a constant default, which
-- PostgreSQL stores without rewriting the table. The previous release's functions
-- keep working: they never name the new columns, and since 0017 none reads a row of
-- these tables through a plan that fixes its columns (0017's last section). Its
-- counters' upserts name the old key, which stays until this release's contract
-- step.

-- Tables in the lock order of migrations (docs/architecture.md Conventions 15).
ALTER TABLE llm.organizations ADD COLUMN has_budgets boolean, ADD COLUMN budgets_revision uuid;
COMMENT ON COLUMN llm.organizations.has_budgets IS
    'Whether the organization has a budget (llm.budget_limits); NULL: not known, looked up. Kept by set_budget, so an admission of an organization without one reads no budget.';
COMMENT ON COLUMN llm.organizations.budgets_revision IS
    'New at every change of one of its budgets (set_budget, set_budget_stripes): a counter''s escrow rooms serve only under the revision they were spread under (budget_counters.rooms_revision).';

ALTER TABLE llm.invocations
    ADD COLUMN project text,
    ADD COLUMN api_key text,
    ADD COLUMN end_user text,
    ADD COLUMN budget_mask smallint,
    ADD COLUMN budget_stripe smallint;
COMMENT ON COLUMN llm.invocations.project IS 'The project id the request named at admission (0.4.0 on; before, llm.invocation_scopes).';
COMMENT ON COLUMN llm.invocations.api_key IS 'The API key id the request named at admission (0.4.0 on; before, llm.invocation_scopes).';
COMMENT ON COLUMN llm.invocations.end_user IS 'The end user id the request named at admission (0.4.0 on; before, llm.invocation_scopes).';
COMMENT ON COLUMN llm.invocations.budget_mask IS
    'The budget counters the request moves, fixed at admission: bit 3 * scope + window (organization 0, project 1, api_key 2, end_user 3; day 0, week 1, month 2); 0: none; NULL: admitted before 0.4.0 (llm.invocation_scopes holds it).';
COMMENT ON COLUMN llm.invocations.budget_stripe IS
    'Which stripe of each budget counter holds the request: budget_stripe modulo the counter''s stripes (0 to 63, its admitting session''s).';
ALTER TABLE llm.invocations SET (fillfactor = 70);

ALTER TABLE llm.period_stripes
    ADD COLUMN open_requests integer,
    ADD COLUMN open_since timestamptz,
    ADD COLUMN quiet boolean,
    ADD COLUMN settle_lag_hours integer,
    ADD COLUMN settle_lead_hours integer;
COMMENT ON COLUMN llm.period_stripes.open_requests IS
    'How many reserved or dispatched requests hold on this stripe (NULL: not known yet).';
COMMENT ON COLUMN llm.period_stripes.open_since IS
    'No open request of this stripe was admitted before it (NULL: none is open, or not known yet while open_requests is): where the pass and the reports start reading open requests.';
COMMENT ON COLUMN llm.period_stripes.quiet IS
    'True: a pass found no open request here and none was admitted since; the index period_stripes_open holds the others.';
COMMENT ON COLUMN llm.period_stripes.settle_lag_hours IS
    'No terminal request of this stripe was settled more than this many hours (rounded up) after its admission: the daily rebuild reads requests by admission time from the settlement day less this.';
COMMENT ON COLUMN llm.period_stripes.settle_lead_hours IS
    'No terminal request of this stripe was settled more than this many hours (rounded up) before its admission (a clock behind at settlement).';

ALTER TABLE llm.budget_limits ADD COLUMN stripes smallint;
COMMENT ON COLUMN llm.budget_limits.stripes IS
    'Over how many stripes the counters of this budget spread (llm.set_budget_stripes; NULL: 1).';

ALTER TABLE llm.budget_counters
    ADD COLUMN stripe smallint NOT NULL DEFAULT 0,
    ADD COLUMN stripes smallint NOT NULL DEFAULT 1,
    ADD COLUMN admit_room bigint,
    ADD COLUMN notice_room bigint,
    ADD COLUMN cents_room bigint,
    ADD COLUMN rooms_revision uuid;
COMMENT ON COLUMN llm.budget_counters.stripe IS 'Which of its counter''s stripes this row is (0 .. stripes - 1).';
COMMENT ON COLUMN llm.budget_counters.stripes IS 'How many stripes its counter has (the same on every stripe of a counter).';
COMMENT ON COLUMN llm.budget_counters.admit_room IS
    'Credits this stripe may still hold on its own; the stripes'' rooms never add up to more than the limit of rooms_revision less the counter''s used + held (NULL: spread on its next exact movement).';
COMMENT ON COLUMN llm.budget_counters.notice_room IS
    'Usage this stripe may still add on its own before the counter could reach the next threshold of rooms_revision not notified yet (NULL: none ahead).';
COMMENT ON COLUMN llm.budget_counters.cents_room IS
    'Cents this stripe may still charge on its own, under the sum limit (NULL: spread on its next exact movement).';
COMMENT ON COLUMN llm.budget_counters.rooms_revision IS
    'The budget revision the rooms were spread under: a movement that reads another revision in force takes the exact path.';

CREATE TABLE llm.upgrade_steps (
    step text NOT NULL,
    finished_at timestamptz NOT NULL,
    CONSTRAINT upgrade_steps_pkey PRIMARY KEY (step)
);
COMMENT ON TABLE llm.upgrade_steps IS
    'The contract steps migrate has finished (migrations/contract/), and the marks they leave for the functions: only what this release''s functions wrote is in the books.';
