-- depends: 0004_pass_lease
-- llm-db 0005: books that stay right.
--
-- 1. A recovery-charge policy per organization (the seeds leave it to product,
--    WF-PFM-LLM-004 "Open Design Questions"): recovery_charge says what a
--    recovered request is charged (its estimate, only if it was dispatched, or
--    nothing); late_settlement says what a measured settlement arriving after
--    recovery does (kept for audit, or trued up: the books move to the measured
--    figures by the signed difference, one 'adjustment' ledger row).
-- 2. invocations.recovered_credits keeps what recovery charged, also after a
--    true-up replaced charged_credits with the measured figure.
-- 3. The daily audit of every period counter: llm.period_findings, reported and
--    never repaired, and llm.sweep_totals, which the sweep and the audit keep
--    per organization (monotonic counters of what recovery did, and when the
--    organization's periods were last audited).
-- 4. Runs count recovered requests charged nothing, period findings, and how
--    far daily usage has been rebuilt, so a later pass can heal an outage.
--
-- Upgrading a populated database: the new columns have constant defaults (no
-- rewrite); recovered_credits is filled for the requests recovery settled
-- (those rows only); the new constraints scan invocations and ledger once.

ALTER TABLE llm.organizations
    ADD COLUMN recovery_charge text NOT NULL DEFAULT 'estimate'
        CHECK (recovery_charge IN ('estimate', 'dispatched', 'none')),
    ADD COLUMN late_settlement text NOT NULL DEFAULT 'audit'
        CHECK (late_settlement IN ('audit', 'true_up'));
COMMENT ON COLUMN llm.organizations.recovery_charge IS
    'What recovery charges a stranded request: estimate (rule BR-CAP-PFM-LLM-009-01), dispatched (its estimate only if it was sent to the provider, else 0), none (0).';
COMMENT ON COLUMN llm.organizations.late_settlement IS
    'What a measured settlement of a recovered request does: audit (recorded in late_*, never charged) or true_up (the books move to the measured figures).';

-- a true-up: settlement_kind 'trued_up', and a signed 'adjustment' ledger row.
-- Each domain's DROP and ADD run as one statement (a DO block): yoyo runs every
-- statement in a savepoint, and PostgreSQL 15 refuses to start one between them
-- ("cannot start a subtransaction when there are unprocessed inval messages").
DO $domains$
BEGIN
    ALTER DOMAIN llm.settlement_kind DROP CONSTRAINT settlement_kind_check;
    ALTER DOMAIN llm.settlement_kind ADD CONSTRAINT settlement_kind_check
        CHECK (VALUE IN ('measured', 'recovered', 'trued_up'));
    ALTER DOMAIN llm.ledger_entry DROP CONSTRAINT ledger_entry_check1;
    ALTER DOMAIN llm.ledger_entry ADD CONSTRAINT ledger_entry_check
        CHECK (VALUE IN ('hold', 'release', 'charge', 'adjustment'));
END
$domains$;
COMMENT ON DOMAIN llm.settlement_kind IS
    'How a settled invocation was charged: measured usage, recovered by the pass (per its organization''s recovery_charge), or trued_up to a measured settlement that arrived after recovery.';

COMMENT ON DOMAIN llm.ledger_entry IS
    'The kind of a ledger row: one hold, one release, at most one charge and at most one adjustment (a true-up, signed) per invocation.';

-- an adjustment is signed; every other entry stays non-negative (a plain bigint
-- from the llm.amount domain is binary-coercible: no rewrite)
ALTER TABLE llm.ledger
    ALTER COLUMN credits TYPE bigint,
    ALTER COLUMN cents TYPE bigint,
    ADD CONSTRAINT ledger_signed_only_adjustments
        CHECK (entry = 'adjustment' OR (credits >= 0 AND coalesce(cents, 0) >= 0));

ALTER TABLE llm.invocations ADD COLUMN recovered_credits llm.amount;
COMMENT ON COLUMN llm.invocations.recovered_credits IS
    'What recovery charged this request (its estimate, or 0 under its organization''s recovery_charge); kept after a true-up.';
UPDATE llm.invocations AS i
   SET recovered_credits = i.charged_credits
 WHERE i.settlement_kind = 'recovered';
-- was: a recovered request is charged exactly its estimate, with no cents
ALTER TABLE llm.invocations
    DROP CONSTRAINT invocations_check3,
    ADD CONSTRAINT invocations_recovered_charge CHECK (
        CASE settlement_kind
            WHEN 'recovered' THEN charged_cents IS NULL AND charged_credits = recovered_credits
                                  AND recovered_credits IN (0, estimate_credits)
            WHEN 'trued_up' THEN recovered_credits IS NOT NULL AND charged_cents IS NOT NULL
            ELSE recovered_credits IS NULL
        END);

-- the daily audit
CREATE TABLE llm.period_findings (
    organization_id       uuid   NOT NULL,
    period_start          date   NOT NULL,
    recorded_used_credits bigint NOT NULL,
    computed_used_credits bigint NOT NULL,
    recorded_used_cents   bigint NOT NULL,
    computed_used_cents   bigint NOT NULL,
    recorded_held_credits bigint NOT NULL,
    computed_held_credits bigint NOT NULL,
    first_seen_at         timestamptz NOT NULL,
    last_seen_at          timestamptz NOT NULL,
    resolved_at           timestamptz,
    last_run_id           uuid,
    PRIMARY KEY (organization_id, period_start)
);
COMMENT ON TABLE llm.period_findings IS
    'Periods whose counters (used credits, used cents, held credits) disagreed with their requests when the pass audited them; reported, never repaired; resolved_at once they agree again.';
CREATE INDEX period_findings_open ON llm.period_findings (organization_id) WHERE resolved_at IS NULL;

CREATE TABLE llm.sweep_totals (
    organization_id     uuid   PRIMARY KEY,
    recovered_requests  bigint NOT NULL DEFAULT 0,
    recovered_uncharged bigint NOT NULL DEFAULT 0,
    past_window_alerts  bigint NOT NULL DEFAULT 0,
    audited_at          timestamptz,
    audit_due_at        timestamptz,
    updated_at          timestamptz
);
COMMENT ON TABLE llm.sweep_totals IS
    'Per organization, written by its sweeps (the pass''s and direct reconcile_org calls alike): monotonic totals of requests recovered, of those charged nothing, and of past-window alerts; and when its periods were last audited and are due again.';
-- what the 0.1.0 sweeps did, so the totals start from the books as they are
INSERT INTO llm.sweep_totals (organization_id, recovered_requests, recovered_uncharged, past_window_alerts)
SELECT i.organization_id,
       count(*) FILTER (WHERE i.settlement_kind = 'recovered'),
       count(*) FILTER (WHERE i.settlement_kind = 'recovered' AND i.charged_credits = 0),
       count(*) FILTER (WHERE i.past_window_alerted_at IS NOT NULL)
  FROM llm.invocations AS i
 WHERE i.settlement_kind = 'recovered' OR i.past_window_alerted_at IS NOT NULL
 GROUP BY i.organization_id;

ALTER TABLE llm.reconciliation_runs
    ADD COLUMN recovered_uncharged bigint NOT NULL DEFAULT 0,
    ADD COLUMN period_findings bigint NOT NULL DEFAULT 0,
    ADD COLUMN daily_rebuilt_through date;
COMMENT ON COLUMN llm.reconciliation_runs.recovered_uncharged IS
    'Requests the pass recovered and charged nothing (recovery_charge dispatched or none); requests_recovered counts them too.';
COMMENT ON COLUMN llm.reconciliation_runs.period_findings IS
    'Periods whose counters disagreed with their requests in this pass''s audit.';
COMMENT ON COLUMN llm.reconciliation_runs.daily_rebuilt_through IS
    'Set when this pass rebuilt every day of daily usage it owed, up to this day (its clock''s day); the next pass rebuilds from there.';

ALTER TYPE llm.org_sweep ADD ATTRIBUTE recovered_uncharged integer;
