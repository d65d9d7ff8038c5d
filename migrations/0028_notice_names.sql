-- depends: 0027_price_units
-- llm-db 0028: a notice's window start and limit under their own names.
--
-- Since budgets (0015), llm.threshold_notices.period_start also holds a budget
-- window's start (a day, a week) and allowance_credits a budget's limit. The new
-- columns window_start and limit_credits say what they hold. No column is renamed
-- (Conventions 14): this release's functions write both, claim_notices returns both,
-- and its contract step (migrations/contract/0028_notice_names.sql) fills the rows
-- the previous release wrote and checks that every row's new names equal its old
-- ones. The old names stay through 0.4.x; 0.5.0 drops them (CHANGELOG 0.4.0).
--
-- The result type of claim_notices gains the two at its end, in the table's order
-- (claim_notices returns the claimed row column for column): a breaking change of a
-- public result (Conventions 16) only for a client that reads it by position.
--
-- Under live traffic: two nullable columns (no rewrite), locked briefly.

ALTER TABLE llm.threshold_notices ADD COLUMN window_start date, ADD COLUMN limit_credits bigint;
COMMENT ON COLUMN llm.threshold_notices.window_start IS
    'The first day of the window the notice is for: the month of the allowance, a budget''s day, week or month. The same as period_start, its name until 0.4.0.';
COMMENT ON COLUMN llm.threshold_notices.limit_credits IS
    'The limit whose threshold was crossed: the monthly allowance, or the budget''s limit. The same as allowance_credits, its name until 0.4.0.';

ALTER TYPE llm.notice_claim ADD ATTRIBUTE window_start date, ADD ATTRIBUTE limit_credits bigint;
COMMENT ON TYPE llm.notice_claim IS
    'A notice as claim_notices returns it: the columns of llm.threshold_notices, with its claim''s token, the scope, id and window it is for (0015), and the window start and limit under their own names (0028).';
