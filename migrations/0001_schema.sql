-- llm-db 0001: schema, tables, types, indexes and roles.
--
-- Citus rules (DESIGN.md "Scale-out"): every per-organization table carries
-- organization_id in every primary key, unique constraint, unique index and
-- foreign key; no triggers; no int sequences. Catalogs (task_kinds, settings)
-- become reference tables; reconciliation_runs lives on the coordinator.
-- Function bodies live in sql/ and are re-applied by `llm_db.migrate`.

CREATE SCHEMA IF NOT EXISTS llm;

-- Roles are cluster-wide; create them once, whatever database migrates first.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'llm_app') THEN
        CREATE ROLE llm_app NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'llm_operator') THEN
        CREATE ROLE llm_operator NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'llm_reader') THEN
        CREATE ROLE llm_reader NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    -- another database migrated at the same moment and created them
    NULL;
END
$roles$;

REVOKE ALL ON SCHEMA llm FROM PUBLIC;

-- ---------------------------------------------------------------- catalogs

CREATE TABLE llm.settings (
    singleton          boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    recovery_window    interval NOT NULL DEFAULT interval '24 hours' CHECK (recovery_window > interval '0'),
    drift_window       interval NOT NULL DEFAULT interval '7 days' CHECK (drift_window > interval '0'),
    sweep_batch        integer  NOT NULL DEFAULT 200 CHECK (sweep_batch > 0),
    reporting_days     integer  NOT NULL DEFAULT 2 CHECK (reporting_days > 0),
    health_max_age     interval NOT NULL DEFAULT interval '2 hours' CHECK (health_max_age > interval '0'),
    notice_claim_timeout interval NOT NULL DEFAULT interval '15 minutes' CHECK (notice_claim_timeout > interval '0'),
    notice_backoff_base  interval NOT NULL DEFAULT interval '1 minute' CHECK (notice_backoff_base > interval '0'),
    notice_backoff_max   interval NOT NULL DEFAULT interval '6 hours' CHECK (notice_backoff_max > interval '0')
);
INSERT INTO llm.settings DEFAULT VALUES;
COMMENT ON TABLE llm.settings IS
    'One row of tunables: recovery window, drift window, sweep batch, reporting days, health max age, notice timing.';

CREATE TABLE llm.task_kinds (
    key         text PRIMARY KEY CHECK (key <> '' AND length(key) <= 200),
    description text,
    declared_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE llm.task_kinds IS 'The declared task catalog; executions may only open declared keys.';

-- ---------------------------------------------------------------- tenants

CREATE TABLE llm.organizations (
    id                        uuid PRIMARY KEY,
    name                      text NOT NULL,
    status                    text NOT NULL DEFAULT 'operational'
                              CHECK (status IN ('operational', 'suspended', 'closed')),
    monthly_allowance_credits bigint CHECK (monthly_allowance_credits >= 0),
    notice_thresholds         integer[] NOT NULL DEFAULT '{80,100}',
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE llm.organizations IS
    'Tenants. monthly_allowance_credits NULL means unlimited; only operational ones are admitted and swept.';
COMMENT ON COLUMN llm.organizations.id IS 'The organization id: the distribution column under Citus.';

CREATE TABLE llm.periods (
    organization_id   uuid   NOT NULL REFERENCES llm.organizations (id),
    period_start      date   NOT NULL,
    period_end        date   NOT NULL,
    allowance_credits bigint CHECK (allowance_credits >= 0),
    used_credits      bigint NOT NULL DEFAULT 0 CHECK (used_credits >= 0),
    held_credits      bigint NOT NULL DEFAULT 0 CHECK (held_credits >= 0),
    used_cents        bigint NOT NULL DEFAULT 0 CHECK (used_cents >= 0),
    PRIMARY KEY (organization_id, period_start),
    CHECK (period_end > period_start)
);
COMMENT ON TABLE llm.periods IS
    'One calendar month (UTC) of an organization: allowance, used and held credits, used cents.';

-- ---------------------------------------------------------------- tasks

CREATE TABLE llm.executions (
    organization_id uuid NOT NULL REFERENCES llm.organizations (id),
    id              uuid NOT NULL,
    task_key        text NOT NULL REFERENCES llm.task_kinds (key),
    subject_type    text,
    subject_id      text,
    replay_key      text,
    status          text NOT NULL DEFAULT 'running'
                    CHECK (status IN ('running', 'completed', 'failed', 'abandoned')),
    started_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    duration_ms     bigint CHECK (duration_ms >= 0),
    request_count   bigint NOT NULL DEFAULT 0 CHECK (request_count >= 0),
    credits         bigint NOT NULL DEFAULT 0 CHECK (credits >= 0),
    cents           bigint NOT NULL DEFAULT 0 CHECK (cents >= 0),
    error           text,
    PRIMARY KEY (organization_id, id),
    CHECK ((status = 'running') = (ended_at IS NULL)),
    CHECK (status <> 'abandoned' OR duration_ms IS NULL)
);
COMMENT ON TABLE llm.executions IS
    'Tasks grouping invocations: running -> completed | failed | abandoned; totals grow with every terminal invocation.';

CREATE UNIQUE INDEX executions_replay_key
    ON llm.executions (organization_id, replay_key) WHERE replay_key IS NOT NULL;
-- the sweep's abandonment scan
CREATE INDEX executions_running
    ON llm.executions (organization_id, started_at) WHERE status = 'running';
-- the drift check: closed executions by end time, so history outside the window is never read
CREATE INDEX executions_closed
    ON llm.executions (organization_id, ended_at) WHERE status <> 'running';

-- ---------------------------------------------------------------- requests

CREATE TABLE llm.invocations (
    organization_id        uuid   NOT NULL,
    id                     uuid   NOT NULL,
    period_start           date   NOT NULL,
    execution_id           uuid,
    model                  text   NOT NULL,
    status                 text   NOT NULL DEFAULT 'reserved'
                           CHECK (status IN ('reserved', 'dispatched', 'settled', 'failed')),
    estimate_credits       bigint NOT NULL CHECK (estimate_credits >= 0),
    hold_credits           bigint NOT NULL CHECK (hold_credits >= 0),
    charged_credits        bigint CHECK (charged_credits >= 0),
    charged_cents          bigint CHECK (charged_cents >= 0),
    input_tokens           bigint CHECK (input_tokens >= 0),
    output_tokens          bigint CHECK (output_tokens >= 0),
    settlement_kind        text CHECK (settlement_kind IN ('measured', 'recovered')),
    created_at             timestamptz NOT NULL,
    dispatched_at          timestamptz,
    settled_at             timestamptz,
    past_window_alerted_at timestamptz,
    error                  text,
    -- a measured settlement that arrived after recovery: kept for audit, never charged
    late_credits           bigint,
    late_cents             bigint,
    late_input_tokens      bigint,
    late_output_tokens     bigint,
    late_reported_at       timestamptz,
    PRIMARY KEY (organization_id, id),
    FOREIGN KEY (organization_id, period_start) REFERENCES llm.periods (organization_id, period_start),
    FOREIGN KEY (organization_id, execution_id) REFERENCES llm.executions (organization_id, id),
    CHECK ((status IN ('settled', 'failed')) = (settled_at IS NOT NULL)),
    CHECK ((status = 'settled') = (settlement_kind IS NOT NULL)),
    CHECK (status IN ('settled', 'failed') OR charged_credits IS NULL),
    CHECK (settlement_kind IS DISTINCT FROM 'recovered'
           OR (charged_credits = estimate_credits AND charged_cents IS NULL))
);
COMMENT ON TABLE llm.invocations IS
    'Model requests: reserved -> dispatched -> settled | failed; recovery settles at the estimate with no cents.';
COMMENT ON COLUMN llm.invocations.settled_at IS 'When the invocation became terminal (settled or failed).';
COMMENT ON COLUMN llm.invocations.late_credits IS
    'A measured settlement reported after recovery: recorded for audit only, never charged.';

-- the sweep: unsettled requests of an organization, oldest first
CREATE INDEX invocations_open
    ON llm.invocations (organization_id, created_at) WHERE status IN ('reserved', 'dispatched');
-- drift check and task totals
CREATE INDEX invocations_execution
    ON llm.invocations (organization_id, execution_id) WHERE execution_id IS NOT NULL;
-- daily reporting rebuilds by settlement day
CREATE INDEX invocations_settled_at
    ON llm.invocations (settled_at) WHERE settled_at IS NOT NULL;

CREATE TABLE llm.ledger (
    organization_id uuid   NOT NULL,
    invocation_id   uuid   NOT NULL,
    entry           text   NOT NULL CHECK (entry IN ('hold', 'release', 'charge')),
    period_start    date   NOT NULL,
    credits         bigint NOT NULL CHECK (credits >= 0),
    cents           bigint CHECK (cents >= 0),
    recorded_at     timestamptz NOT NULL,
    -- one hold, one release, at most one charge per invocation, by construction
    PRIMARY KEY (organization_id, invocation_id, entry),
    FOREIGN KEY (organization_id, invocation_id) REFERENCES llm.invocations (organization_id, id)
);
COMMENT ON TABLE llm.ledger IS
    'Append-only credit ledger: one hold, one release and at most one charge row per invocation.';

-- ---------------------------------------------------------------- notices

CREATE TABLE llm.threshold_notices (
    organization_id   uuid    NOT NULL,
    id                uuid    NOT NULL DEFAULT gen_random_uuid(),
    period_start      date    NOT NULL,
    threshold_pct     integer NOT NULL CHECK (threshold_pct > 0),
    crossed_at        timestamptz NOT NULL,
    used_credits      bigint  NOT NULL,
    allowance_credits bigint  NOT NULL,
    status            text    NOT NULL DEFAULT 'owed' CHECK (status IN ('owed', 'sending', 'sent')),
    attempts          integer NOT NULL DEFAULT 0,
    last_error        text,
    next_attempt_at   timestamptz NOT NULL,
    claimed_at        timestamptz,
    sent_at           timestamptz,
    PRIMARY KEY (organization_id, id),
    UNIQUE (organization_id, period_start, threshold_pct),
    FOREIGN KEY (organization_id, period_start) REFERENCES llm.periods (organization_id, period_start)
);
COMMENT ON TABLE llm.threshold_notices IS
    'One notice per (organization, period, threshold) crossed: owed -> sending -> sent, with retries and backoff.';

CREATE INDEX threshold_notices_owed
    ON llm.threshold_notices (next_attempt_at, crossed_at) WHERE status = 'owed';
CREATE INDEX threshold_notices_sending
    ON llm.threshold_notices (claimed_at) WHERE status = 'sending';

-- ---------------------------------------------------------------- reporting

CREATE TABLE llm.daily_usage (
    organization_id    uuid   NOT NULL,
    day                date   NOT NULL,
    model              text   NOT NULL,
    requests           bigint NOT NULL,
    recovered_requests bigint NOT NULL,
    credits            bigint NOT NULL,
    cents              bigint NOT NULL,
    input_tokens       bigint NOT NULL,
    output_tokens      bigint NOT NULL,
    PRIMARY KEY (organization_id, day, model)
);
COMMENT ON TABLE llm.daily_usage IS
    'Terminal invocations aggregated by UTC settlement day and model; rebuilt idempotently by rebuild_daily_usage.';
CREATE INDEX daily_usage_day ON llm.daily_usage (day);

-- ---------------------------------------------------------------- recovery

CREATE TABLE llm.reconciliation_runs (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    started_at            timestamptz NOT NULL,
    finished_at           timestamptz,
    clock                 timestamptz NOT NULL,
    status                text NOT NULL DEFAULT 'running'
                          CHECK (status IN ('running', 'succeeded', 'partial', 'failed', 'skipped')),
    orgs_visited          integer NOT NULL DEFAULT 0,
    orgs_failed           integer NOT NULL DEFAULT 0,
    requests_recovered    bigint  NOT NULL DEFAULT 0,
    released_hold_credits bigint  NOT NULL DEFAULT 0,
    past_window_alerts    bigint  NOT NULL DEFAULT 0,
    executions_abandoned  bigint  NOT NULL DEFAULT 0,
    drift_findings        bigint  NOT NULL DEFAULT 0,
    notices_rearmed       bigint  NOT NULL DEFAULT 0,
    daily_rows_rebuilt    bigint  NOT NULL DEFAULT 0,
    more_pending_orgs     integer NOT NULL DEFAULT 0,
    errors                jsonb   NOT NULL DEFAULT '[]'
);
COMMENT ON TABLE llm.reconciliation_runs IS
    'One row per reconciliation pass (coordinator-local under Citus); skipped when another pass held the lock.';
CREATE INDEX reconciliation_runs_started ON llm.reconciliation_runs (started_at DESC);

CREATE TABLE llm.drift_findings (
    organization_id         uuid   NOT NULL,
    execution_id            uuid   NOT NULL,
    recorded_request_count  bigint NOT NULL,
    recorded_credits        bigint NOT NULL,
    recorded_cents          bigint NOT NULL,
    settled_request_count   bigint NOT NULL,
    settled_credits         bigint NOT NULL,
    settled_cents           bigint NOT NULL,
    first_seen_at           timestamptz NOT NULL,
    last_seen_at            timestamptz NOT NULL,
    last_run_id             uuid,
    PRIMARY KEY (organization_id, execution_id),
    FOREIGN KEY (organization_id, execution_id) REFERENCES llm.executions (organization_id, id)
);
COMMENT ON TABLE llm.drift_findings IS
    'Executions whose recorded totals disagree with their terminal invocations; refreshed each pass, never repaired.';

-- what one organization's sweep did
CREATE TYPE llm.org_sweep AS (
    organization_id       uuid,
    recovered_requests    integer,
    released_hold_credits bigint,
    past_window_alerts    integer,
    abandoned_executions  integer,
    drift_findings        integer,
    notices_created       integer,
    more_pending          boolean
);
COMMENT ON TYPE llm.org_sweep IS 'The figures of one organization''s reconciliation sweep.';
