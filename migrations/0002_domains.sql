-- depends: 0001_schema
-- llm-db 0002: the single-column checks of the request-path tables become domains.
--
-- Why: PostgreSQL re-reads and re-plans every CHECK expression of a table in
-- each statement that writes it (ExecRelCheck builds them per query), whatever
-- columns the statement changes. On the request path (invocations, ledger,
-- periods, executions) constraint checking was 17 % of a request's backend CPU
-- (perf); with these domains it is 8 %. A domain's check is parsed and planned
-- once per session (the type cache) and runs only on the values a statement
-- actually assigns. The rule each column obeys is the same as before, with the
-- same SQLSTATE (23514, check_violation); only the constraint's name changes
-- (it is now the domain's).
--
-- Left as table CHECKs: the rules that tie several columns together
-- (status <-> settled_at, settlement kind, recovered charge, period bounds).
--
-- Upgrading a populated database rewrites these four tables under an ACCESS
-- EXCLUSIVE lock (PostgreSQL verifies a domain by rewriting); docs/operations.md.

CREATE DOMAIN llm.amount AS bigint CHECK (VALUE >= 0);
COMMENT ON DOMAIN llm.amount IS 'A non-negative credit, cent, token, count or duration amount (NULL allowed where the column allows it).';

CREATE DOMAIN llm.invocation_status AS text
    CHECK (VALUE IN ('reserved', 'dispatched', 'settled', 'failed'));
COMMENT ON DOMAIN llm.invocation_status IS 'reserved -> dispatched -> settled | failed.';

CREATE DOMAIN llm.execution_status AS text
    CHECK (VALUE IN ('running', 'completed', 'failed', 'abandoned'));
COMMENT ON DOMAIN llm.execution_status IS 'running -> completed | failed | abandoned.';

CREATE DOMAIN llm.settlement_kind AS text CHECK (VALUE IN ('measured', 'recovered'));
COMMENT ON DOMAIN llm.settlement_kind IS 'How a settled invocation was charged: measured usage, or its estimate by recovery.';

CREATE DOMAIN llm.ledger_entry AS text CHECK (VALUE IN ('hold', 'release', 'charge'));
COMMENT ON DOMAIN llm.ledger_entry IS 'The kind of a ledger row: one hold, one release, at most one charge per invocation.';

ALTER TABLE llm.periods
    DROP CONSTRAINT periods_allowance_credits_check,
    DROP CONSTRAINT periods_used_credits_check,
    DROP CONSTRAINT periods_held_credits_check,
    DROP CONSTRAINT periods_used_cents_check,
    ALTER COLUMN allowance_credits TYPE llm.amount,
    ALTER COLUMN used_credits TYPE llm.amount,
    ALTER COLUMN held_credits TYPE llm.amount,
    ALTER COLUMN used_cents TYPE llm.amount;

ALTER TABLE llm.executions
    DROP CONSTRAINT executions_status_check,
    DROP CONSTRAINT executions_duration_ms_check,
    DROP CONSTRAINT executions_request_count_check,
    DROP CONSTRAINT executions_credits_check,
    DROP CONSTRAINT executions_cents_check,
    ALTER COLUMN status TYPE llm.execution_status,
    ALTER COLUMN duration_ms TYPE llm.amount,
    ALTER COLUMN request_count TYPE llm.amount,
    ALTER COLUMN credits TYPE llm.amount,
    ALTER COLUMN cents TYPE llm.amount;

ALTER TABLE llm.invocations
    DROP CONSTRAINT invocations_status_check,
    DROP CONSTRAINT invocations_estimate_credits_check,
    DROP CONSTRAINT invocations_hold_credits_check,
    DROP CONSTRAINT invocations_charged_credits_check,
    DROP CONSTRAINT invocations_charged_cents_check,
    DROP CONSTRAINT invocations_input_tokens_check,
    DROP CONSTRAINT invocations_output_tokens_check,
    DROP CONSTRAINT invocations_settlement_kind_check,
    ALTER COLUMN status TYPE llm.invocation_status,
    ALTER COLUMN estimate_credits TYPE llm.amount,
    ALTER COLUMN hold_credits TYPE llm.amount,
    ALTER COLUMN charged_credits TYPE llm.amount,
    ALTER COLUMN charged_cents TYPE llm.amount,
    ALTER COLUMN input_tokens TYPE llm.amount,
    ALTER COLUMN output_tokens TYPE llm.amount,
    ALTER COLUMN settlement_kind TYPE llm.settlement_kind;

ALTER TABLE llm.ledger
    DROP CONSTRAINT ledger_entry_check,
    DROP CONSTRAINT ledger_credits_check,
    DROP CONSTRAINT ledger_cents_check,
    ALTER COLUMN entry TYPE llm.ledger_entry,
    ALTER COLUMN credits TYPE llm.amount,
    ALTER COLUMN cents TYPE llm.amount;
