-- depends: 0013_allowance_excess
-- llm-db 0014: the public routines' own result types (issue 22 item 3).
--
-- admit_invocation and mark_dispatched returned the llm.invocations row,
-- upsert_organization and set_recovery_policy the llm.organizations row, and
-- claim_notices a set of llm.threshold_notices rows: a column added to one of
-- those tables changed a public result, and a client that had prepared
-- `SELECT * FROM llm.admit_invocation(...)` failed from then on with 0A000
-- ("cached plan must not change result type"). Each of them now returns a type
-- of its own, declared here; sql/ switches the functions over.
--
-- The shim: each type has exactly the columns, names, types (domains included)
-- and order of its table's row today, so a statement the previous release's
-- client prepared still sees the same result and its plan keeps working.
--
-- Under live traffic: CREATE TYPE only; no table is touched.

CREATE TYPE llm.admission AS (
    organization_id        uuid,
    id                     uuid,
    period_start           date,
    execution_id           uuid,
    model                  text,
    status                 llm.invocation_status,
    estimate_credits       llm.amount,
    hold_credits           llm.amount,
    charged_credits        llm.amount,
    charged_cents          llm.amount,
    input_tokens           llm.amount,
    output_tokens          llm.amount,
    settlement_kind        llm.settlement_kind,
    created_at             timestamptz,
    dispatched_at          timestamptz,
    settled_at             timestamptz,
    past_window_alerted_at timestamptz,
    error                  text,
    late_credits           bigint,
    late_cents             bigint,
    late_input_tokens      bigint,
    late_output_tokens     bigint,
    late_reported_at       timestamptz,
    recovered_credits      llm.amount,
    stripe                 smallint
);
COMMENT ON TYPE llm.admission IS
    'A request as admit_invocation and mark_dispatched return it: the columns of llm.invocations as of 0.2.0, fixed.';

CREATE TYPE llm.organization_settings AS (
    id                        uuid,
    name                      text,
    status                    text,
    monthly_allowance_credits bigint,
    notice_thresholds         integer[],
    created_at                timestamptz,
    updated_at                timestamptz,
    recovery_charge           text,
    late_settlement           text,
    period_stripes            integer
);
COMMENT ON TYPE llm.organization_settings IS
    'An organization as upsert_organization and set_recovery_policy return it: the columns of llm.organizations as of 0.2.0, fixed.';

CREATE TYPE llm.notice_claim AS (
    organization_id   uuid,
    id                uuid,
    period_start      date,
    threshold_pct     integer,
    crossed_at        timestamptz,
    used_credits      bigint,
    allowance_credits bigint,
    status            text,
    attempts          integer,
    last_error        text,
    next_attempt_at   timestamptz,
    claimed_at        timestamptz,
    sent_at           timestamptz,
    claim_token       uuid
);
COMMENT ON TYPE llm.notice_claim IS
    'A notice as claim_notices returns it, with its claim''s token: the columns of llm.threshold_notices as of 0.3.0, fixed.';
