-- depends: 0018_sum_limits
-- llm-db 0019: an admission says whether it replayed an earlier one.
--
-- admit_invocation returns the stored request when its invocation id was admitted
-- before (a retry), and mark_dispatched returns it unchanged when it was already
-- dispatched; neither said so, and a retried HTTP call could not tell a replay from
-- a new request. Their result now ends with one more column,
-- replayed: true when the call created or changed nothing.
--
-- A change of a public result type (docs/architecture.md "Conventions" 16), made with
-- a new type, llm.admission_result: llm.admission's columns, then replayed. The
-- functions step drops the two routines and creates them returning it (sql/10_common.sql);
-- the contract step migrations/contract/0019_admission_replayed.sql drops
-- llm.admission. A client that reads named columns, as the driver of every release
-- does, keeps its statement and its plan. One that prepared `SELECT * FROM
-- llm.admit_invocation(...)` gets 0A000 (cached plan must not change result type)
-- once per prepared statement after the upgrade; the CHANGELOG gives the shim.
--
-- Under live traffic: a new type only. Why not llm.admission altered in place (ALTER
-- TYPE ... ADD ATTRIBUTE, as this migration first did), nor renamed: a call of 0.3.0
-- planned before the change and returning after it failed, named columns or not
-- (42804, "function return row and query-specified return row do not match"), and a
-- routine of 0.3.0 running as the functions went live looked its variable's type up
-- by name again and could not return it. A new type changes nothing a running call
-- has planned with.

CREATE TYPE llm.admission_result AS (
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
    stripe                 smallint,
    replayed               boolean
);
COMMENT ON TYPE llm.admission_result IS
    'A request as admit_invocation and mark_dispatched return it: the columns of llm.invocations as of 0.2.0, then replayed (the call returned an earlier admission or dispatch unchanged).';
