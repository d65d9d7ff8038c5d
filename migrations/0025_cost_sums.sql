-- depends: 0024_priced_requests
-- llm-db 0025: every sum carries the cost beside the credits (docs/architecture.md
-- "The price book").
--
-- A request's cost in nanos is charged_cents * 10^7 when the caller priced it
-- (settle_invocation, fail_invocation with cents) and cost_nanos when the book did
-- (its charged_cents is then NULL); a request recovered at its estimate has none. So a
-- sum's cost is its used cents * 10^7 plus the nanos the book priced, and each sum
-- keeps only the second part, priced_nanos (the cost of its requests priced from usage,
-- plus the corrections llm.reprice applied to them: llm.cost_corrections, below). The
-- reading views add the two (llm.periods in 0026, a transaction of its own):
-- llm.periods.used_cost_nanos, llm.budget_usage.used_cost_nanos, the reports'.
--
-- Why that split, under live traffic: a call of the previous release still running
-- after this commits moves cents and nothing else, and what it books is caller-priced,
-- whose priced part is 0. Every column below is right from the moment it exists, with
-- no recount after the barrier. numeric: a sum never overflows, nor is it rounded.
-- No CHECK (it would scan each table under its lock); invariant 20 checks the sums.
-- On the large tables, llm.executions and llm.daily_usage, plain nullable columns
-- (docs/architecture.md Conventions 14): NULL is 0, what a row of the previous
-- release's functions holds; the period's and the counters' are NOT NULL DEFAULT 0.

-- The tables in the lock order of a request's calls (its task, its period's stripes, its
-- budget counters, the daily usage last), so a call holding one never waits here for
-- another while this waits for it.
ALTER TABLE llm.executions ADD COLUMN priced_nanos numeric;
COMMENT ON COLUMN llm.executions.priced_nanos IS
    'The cost (nanos) of the task''s requests priced from usage, corrections included; its cost is cents * 10^7 + priced_nanos (NULL: 0).';
ALTER TABLE llm.period_stripes ADD COLUMN priced_nanos numeric NOT NULL DEFAULT 0;
COMMENT ON COLUMN llm.period_stripes.priced_nanos IS
    'The cost (nanos) of the stripe''s requests priced from usage, corrections included; its used cost is used_cents * 10^7 + priced_nanos.';
ALTER TABLE llm.budget_counters ADD COLUMN priced_nanos numeric NOT NULL DEFAULT 0;
COMMENT ON COLUMN llm.budget_counters.priced_nanos IS
    'The cost (nanos) of the counter stripe''s requests priced from usage, corrections included; its used cost is used_cents * 10^7 + priced_nanos.';
ALTER TABLE llm.daily_usage
    ADD COLUMN priced_nanos numeric,
    ADD COLUMN uncosted_requests bigint,
    ADD COLUMN fallback_requests bigint;
COMMENT ON COLUMN llm.daily_usage.priced_nanos IS
    'The cost (nanos) of the day''s requests priced from usage, as first priced (their corrections: corrections_nanos; NULL: 0).';
COMMENT ON COLUMN llm.daily_usage.uncosted_requests IS
    'The day''s requests with no money figure (recovered at their estimate): in no cost sum (NULL: a row built before 0.4.0).';
COMMENT ON COLUMN llm.daily_usage.fallback_requests IS
    'The day''s requests the book priced at the fallback price (''*''): their model has no price of its own (NULL: 0).';

ALTER TABLE llm.daily_usage ADD COLUMN corrections_nanos numeric;
COMMENT ON COLUMN llm.daily_usage.corrections_nanos IS
    'The corrections llm.reprice applied to the day''s requests (signed nanos): the day''s corrected cost is cents * 10^7 + priced_nanos + corrections_nanos (NULL: 0).';

-- A price corrected after the fact (llm.reprice): one entry per request and
-- application, never an edit of the settled request. A request's corrected cost is its
-- cost_nanos plus its entries' differences; each entry names the version it priced the
-- request at, and the last (the highest seq) the one that prices it now.
CREATE TABLE llm.cost_corrections (
    organization_id  uuid        NOT NULL,
    invocation_id    uuid        NOT NULL,
    seq              integer     NOT NULL,
    price_version_id bigint      NOT NULL,
    difference_nanos bigint      NOT NULL,
    corrected_at     timestamptz NOT NULL,
    PRIMARY KEY (organization_id, invocation_id, seq)
);
COMMENT ON TABLE llm.cost_corrections IS
    'Corrections of priced requests written by llm.reprice: a request''s cost moves by difference_nanos, priced from then on at price_version_id (its last entry, by seq, names the version in force for it); its settled row is never edited.';
