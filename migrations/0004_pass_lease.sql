-- depends: 0003_hot_row_keys
-- llm-db 0004: a pass guard that cannot leak, and bounds on every organization's sweep.
--
-- The one-pass-at-a-time guard was a session advisory lock. Behind PgBouncer in
-- transaction pooling mode a cancelled pass left that lock on a pooled server
-- connection, and every later pass, pg_cron's included, recorded itself skipped
-- until that connection closed. The guard is now a lease: one row naming the
-- pass that holds it (its run, a per-pass token, the backend's pid and start
-- time) with an expiry on clock_timestamp(), renewed after each organization.
-- A pass that died, was cancelled or was pooled away can never block the next
-- one: the next pass takes over when the holder is gone or its lease lapsed.
-- The lease lives on the coordinator under Citus, like reconciliation_runs.
--
-- New settings bound each organization's sweep, so no client can stall a pass:
-- org_lock_timeout (a transaction-local lock_timeout inside the sweep) and
-- org_time_budget (a deadline checked between the sweep's statements, 57014).

ALTER TABLE llm.settings
    ADD COLUMN org_lock_timeout interval NOT NULL DEFAULT interval '5 seconds'
        CHECK (org_lock_timeout > interval '0'),
    ADD COLUMN org_time_budget interval NOT NULL DEFAULT interval '60 seconds'
        CHECK (org_time_budget > interval '0'),
    ADD COLUMN pass_lease interval NOT NULL DEFAULT interval '5 minutes'
        CHECK (pass_lease > interval '0');
COMMENT ON COLUMN llm.settings.org_lock_timeout IS
    'Longest wait for one lock inside an organization''s sweep (and each follow-up step): a transaction-local lock_timeout; a blocked organization is recorded with 55P03 and the pass goes on.';
COMMENT ON COLUMN llm.settings.org_time_budget IS
    'Longest run of one organization''s sweep, checked between its statements: 57014 when exceeded, recorded as that organization''s error.';
COMMENT ON COLUMN llm.settings.pass_lease IS
    'How long a pass holds the one-pass-at-a-time lease without renewing it (it renews after each organization); a lapsed lease is taken over.';

CREATE TABLE llm.pass_lease (
    singleton            boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    run_id               uuid,
    token                uuid,
    holder_pid           integer,
    holder_backend_start timestamptz,
    acquired_at          timestamptz,
    renewed_at           timestamptz,
    expires_at           timestamptz,
    CHECK ((token IS NULL) = (expires_at IS NULL))
);
INSERT INTO llm.pass_lease DEFAULT VALUES;
COMMENT ON TABLE llm.pass_lease IS
    'The one-pass-at-a-time lease (one row, coordinator-local under Citus): the holding pass''s run, token and backend, and an expiry on clock_timestamp(); free when token is NULL.';
COMMENT ON COLUMN llm.pass_lease.acquired_at IS
    'clock_timestamp() when the holder took the lease: a holder whose current statement started later is no longer running that pass.';

-- _begin_run keeps its argument but now returns the run and its lease token:
-- a changed return type cannot be replaced in place.
DROP FUNCTION IF EXISTS llm._begin_run(timestamptz);
