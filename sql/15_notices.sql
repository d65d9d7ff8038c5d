-- Threshold notices, from their creation to their delivery. This file calls only
-- 10_common.sql, and loads before the files that create notices: the stripes and
-- organizations (a period's allowance), the budgets, settlement and recovery.
--
-- Creation: a notice is owed in the transaction that crossed its threshold
-- (_record_crossings, _budget_crossings in 28_budgets.sql) or that put it behind by
-- itself (_record_reached, _budget_reached): all through _owe_notices, the one
-- INSERT of a notice.
--
-- Delivery: claimed by compare-and-set per notice (works sharded), completed or failed
-- with exponential backoff, released by a worker shutting down, re-armed when a
-- claim was abandoned. Each claim has a token, and only its holder ends it: a
-- worker whose claim was re-armed and claimed again cannot end the new one.
-- Whenever a notice becomes owed the transaction does
-- NOTIFY llm_notices (sent at commit), which wakes `llm-db worker`.
--
-- This file was 70_notices.sql until 0.3.0 (migration 0016 names it so).

-- The contract step of schema 0016: one notice per (organization, scope,
-- id, window, window start, threshold) is the key now, and the old key (organization,
-- period start, threshold), which the previous release's functions name in their ON
-- CONFLICT, goes in the transaction that puts the new functions live (docs/architecture.md
-- Conventions 14): a budget's notice for a window starting on the first of a month
-- would collide with it. Looked up first, so a later run takes no lock.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                WHERE c.conrelid = 'llm.threshold_notices'::regclass
                  AND c.conname = 'threshold_notices_organization_id_period_start_threshold_pc_key') THEN
        ALTER TABLE llm.threshold_notices
            DROP CONSTRAINT threshold_notices_organization_id_period_start_threshold_pc_key;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION llm._notify_notices_owed(p_reason text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- PostgreSQL folds identical notifications of one transaction into one, so a
    -- transaction that makes many notices owed wakes each listener once.
    PERFORM pg_catalog.pg_notify('llm_notices', p_reason);
END
$$;
COMMENT ON FUNCTION llm._notify_notices_owed(text) IS
    'NOTIFY llm_notices with the reason (created, retry, released, rearmed): sent when the calling transaction commits, never if it rolls back.';

-- ---------------------------------------------------------------- creation

-- Inlinable (no SET clause, everything qualified). A threshold t (a whole
-- percentage) is crossed when old * 100 < t * allowance <= new * 100, which needs
-- a whole number in (old * 100 / allowance, new * 100 / allowance]: so unless
-- the integer quotients differ, no threshold can have been crossed and the
-- notice query is not run. Exact (numeric integer division), so never a miss.
CREATE OR REPLACE FUNCTION llm._may_cross(p_old_used bigint, p_new_used bigint, p_allowance bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_allowance OPERATOR(pg_catalog.>) 0::bigint
       AND pg_catalog.div(p_new_used::numeric OPERATOR(pg_catalog.*) 100::numeric, p_allowance::numeric)
           OPERATOR(pg_catalog.>)
           pg_catalog.div(p_old_used::numeric OPERATOR(pg_catalog.*) 100::numeric, p_allowance::numeric)
$$;
COMMENT ON FUNCTION llm._may_cross(bigint, bigint, bigint) IS
    'False when moving used credits from p_old_used to p_new_used cannot have crossed any whole-percent threshold of p_allowance (NULL when unlimited).';

-- The one place a threshold notice is owed: one per threshold of p_thresholds that
-- p_used stands at or above under p_allowance, at most one per (organization, scope,
-- id, window, window start, threshold) by the unique key, and NOTIFY llm_notices at
-- commit. Given p_old_used, only the thresholds a movement from it crossed: a whole
-- percentage t is crossed when p_old_used * 100 < t * p_allowance <= p_used * 100.
-- The allowance's notices are (organization, NULL, month) of the period; a budget's
-- name its scope, real id and window, and p_period_start is its window's start.
-- A notice holds the window's start and the limit under their names (window_start,
-- limit_credits) and, through 0.4.x, under their old ones (period_start,
-- allowance_credits), which its readers in this file's neighbours still read: a row
-- the previous release wrote has only those until the contract step of 0028.
CREATE OR REPLACE FUNCTION llm._owe_notices(
    p_organization_id uuid, p_period_start date, p_thresholds integer[], p_used bigint,
    p_allowance bigint, p_now timestamptz, p_scope text DEFAULT 'organization',
    p_scope_id text DEFAULT NULL, p_window text DEFAULT 'month', p_old_used bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_created integer;
BEGIN
    -- counted from RETURNING, not ROW_COUNT: under Citus an INSERT ... SELECT ... ON
    -- CONFLICT may report rows its conflict skipped (docs/scaling.md)
    WITH created AS (
        INSERT INTO llm.threshold_notices
               (organization_id, scope, scope_id, budget_window, period_start, threshold_pct,
                crossed_at, used_credits, allowance_credits, next_attempt_at,
                window_start, limit_credits)
        SELECT p_organization_id, p_scope, p_scope_id, p_window, p_period_start, t.pct,
               p_now, p_used, p_allowance, p_now,
               p_period_start, p_allowance
          FROM pg_catalog.unnest(p_thresholds) AS t(pct)
         WHERE p_used::numeric * 100 >= t.pct::numeric * p_allowance
           AND (p_old_used IS NULL OR p_old_used::numeric * 100 < t.pct::numeric * p_allowance)
        ON CONFLICT (organization_id, scope, scope_id, budget_window, period_start, threshold_pct) DO NOTHING
        RETURNING threshold_notices.threshold_pct
    )
    SELECT count(*) INTO v_created FROM created;
    IF v_created > 0 THEN
        PERFORM llm._notify_notices_owed('created');  -- delivered at commit (llm-db worker)
    END IF;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._owe_notices(uuid, date, integer[], bigint, bigint, timestamptz, text, text, text, bigint) IS
    'Creates one owed notice (crossed at p_now) for every threshold of p_thresholds that p_used stands at or above under p_allowance (and, given p_old_used, p_old_used stood below) and not notified yet; NOTIFY llm_notices at commit when it created one.';

CREATE OR REPLACE FUNCTION llm._record_crossings(
    p_organization_id uuid, p_period_start date, p_old_used bigint, p_new_used bigint,
    p_allowance bigint, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_thresholds integer[];
BEGIN
    IF NOT coalesce(llm._may_cross(p_old_used, p_new_used, p_allowance), false) THEN
        RETURN 0;  -- unlimited, no movement, or no whole percentage passed
    END IF;
    SELECT o.notice_thresholds INTO v_thresholds
      FROM llm.organizations AS o
     WHERE o.id = p_organization_id;
    RETURN llm._owe_notices(p_organization_id, p_period_start, v_thresholds, p_new_used,
                            p_allowance, p_now, p_old_used => p_old_used);
END
$$;
COMMENT ON FUNCTION llm._record_crossings(uuid, date, bigint, bigint, bigint, timestamptz) IS
    'Creates one owed notice per threshold crossed when used credits moved from p_old_used to p_new_used; at most one per (organization, period, threshold); NOTIFY llm_notices at commit when it created one.';

-- A changed allowance or threshold list (upsert_organization) owes, by itself, every
-- threshold the period's used credits now stand at or above and that was not notified:
-- no movement crossed it, so _record_crossings never will. The
-- caller holds the period (_lock_period), so the used credits read here stay.
CREATE OR REPLACE FUNCTION llm._record_reached(
    p_organization_id uuid, p_period_start date, p_thresholds integer[], p_allowance bigint,
    p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_used bigint;
BEGIN
    IF p_allowance IS NULL THEN
        RETURN 0;  -- unlimited: no threshold has a level
    END IF;
    SELECT sum(s.used_credits) INTO v_used
      FROM llm.period_stripes AS s
     WHERE s.organization_id = p_organization_id AND s.period_start = p_period_start;
    RETURN llm._owe_notices(p_organization_id, p_period_start, p_thresholds, v_used,
                            p_allowance, p_now);
END
$$;
COMMENT ON FUNCTION llm._record_reached(uuid, date, integer[], bigint, timestamptz) IS
    'With the period locked: creates one owed notice (crossed at p_now) for every threshold of p_thresholds its used credits stand at or above under p_allowance and not notified yet; NOTIFY llm_notices at commit when it created one. What an allowance or threshold-list change owes by itself.';
-- ---------------------------------------------------------------- delivery

CREATE OR REPLACE FUNCTION llm.claim_notices(p_limit integer DEFAULT 50, p_now timestamptz DEFAULT now())
RETURNS SETOF llm.notice_claim
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_candidate record;
    v_notice llm.notice_claim;  -- the claimed llm.threshold_notices row, column for column
    v_token uuid;
    v_claimed integer := 0;
BEGIN
    PERFORM llm._check_clock(p_now);
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'llm: claim limit % is out of range', p_limit
            USING ERRCODE = '22023', HINT = 'Pass 1 .. 10000.';
    END IF;
    -- a total order, so concurrent claimers (and shards) never deadlock
    FOR v_candidate IN
        SELECT n.organization_id, n.id
          FROM llm.threshold_notices AS n
         WHERE n.status = 'owed' AND n.next_attempt_at <= v_now
         ORDER BY n.crossed_at, n.organization_id, n.id
         LIMIT p_limit * 2
    LOOP
        -- made before the UPDATE: Citus refuses a volatile function in an UPDATE's SET (Citus rule 6)
        v_token := pg_catalog.gen_random_uuid();
        -- the new names from the old ones: a notice the previous release owed may not
        -- have them before the contract step of 0028 fills it (migrations/contract/)
        UPDATE llm.threshold_notices AS n
           SET status = 'sending', claimed_at = v_now, attempts = n.attempts + 1, claim_token = v_token,
               window_start = n.period_start, limit_credits = n.allowance_credits
         WHERE n.organization_id = v_candidate.organization_id AND n.id = v_candidate.id
           AND n.status = 'owed' AND n.next_attempt_at <= v_now
        RETURNING n.* INTO v_notice;
        IF FOUND THEN
            v_claimed := v_claimed + 1;
            RETURN NEXT v_notice;
            EXIT WHEN v_claimed >= p_limit;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm.claim_notices(integer, timestamptz) IS
    'Claims up to p_limit due owed notices (owed -> sending), oldest crossing first, by compare-and-set per notice: two workers never claim the same notice. Each row carries its claim''s new claim_token, which ends the claim.';

CREATE OR REPLACE FUNCTION llm._require_notice(p_organization_id uuid, p_notice_id uuid)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM FROM llm.threshold_notices AS n WHERE n.organization_id = p_organization_id AND n.id = p_notice_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'llm: unknown notice % for organization %', p_notice_id, p_organization_id
            USING ERRCODE = '22023', HINT = 'Pass the organization_id and id of a claimed notice.';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._require_notice(uuid, uuid) IS 'Raises 22023 when the notice does not exist for that organization.';

CREATE OR REPLACE FUNCTION llm._check_claim(
    p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now, 'notice', p_notice_id);
    IF p_claim_token IS NULL THEN
        RAISE EXCEPTION 'llm: claim token must not be NULL'
            USING ERRCODE = '22023', HINT = 'Pass the claim_token claim_notices returned with the notice.';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_claim(uuid, uuid, uuid, timestamptz) IS
    'Raises 22023 for a NULL organization, notice or claim token, or an unusable clock: the arguments of the three ends of a claim.';

-- A claim ends here, by its holder only: compare-and-set on 'sending' with the
-- claim's token (a notice re-armed meanwhile, claimed again by another worker, or
-- already ended returns false and changes nothing), then one of three ends:
--   sent      complete_notice: delivered;
--   failed    fail_notice: owed again after an exponential backoff, with its error;
--   released  release_notice: a worker shutting down gives it back unused, owed
--             at once, and the attempt claim_notices counted is taken back.
CREATE OR REPLACE FUNCTION llm._end_claim(
    p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_end text, p_error text,
    p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_settings llm.settings;  -- read only when the claim failed (its backoff)
    v_attempts llm.threshold_notices.attempts%TYPE;
BEGIN
    -- attempts read first: Citus rejects an UPDATE whose STABLE timestamptz +
    -- interval takes a column reference (n.attempts)
    SELECT n.attempts INTO v_attempts
      FROM llm.threshold_notices AS n
     WHERE n.organization_id = p_organization_id AND n.id = p_notice_id AND n.status = 'sending'
       AND n.claim_token = p_claim_token
       FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM llm._require_notice(p_organization_id, p_notice_id);
        RETURN false;
    END IF;
    IF p_end = 'sent' THEN
        UPDATE llm.threshold_notices AS n
           SET status = 'sent', sent_at = p_now, last_error = NULL, claim_token = NULL
         WHERE n.organization_id = p_organization_id AND n.id = p_notice_id;
        RETURN true;
    ELSIF p_end = 'failed' THEN
        v_settings := llm._settings();
        UPDATE llm.threshold_notices AS n
           SET status = 'owed', last_error = p_error, claimed_at = NULL, claim_token = NULL,
               next_attempt_at = p_now + LEAST(
                   v_settings.notice_backoff_max,
                   v_settings.notice_backoff_base * pg_catalog.power(2, LEAST(v_attempts, 30) - 1))
         WHERE n.organization_id = p_organization_id AND n.id = p_notice_id;
        PERFORM llm._notify_notices_owed('retry');
    ELSIF p_end = 'released' THEN
        UPDATE llm.threshold_notices AS n
           SET status = 'owed', claimed_at = NULL, claim_token = NULL, next_attempt_at = p_now,
               attempts = GREATEST(v_attempts - 1, 0)
         WHERE n.organization_id = p_organization_id AND n.id = p_notice_id;
        PERFORM llm._notify_notices_owed('released');
    ELSE
        RAISE EXCEPTION 'llm: a claim ends sent, failed or released, not %', coalesce(p_end, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    RETURN true;  -- owed again: a listener wakes and learns when it is due
END
$$;
COMMENT ON FUNCTION llm._end_claim(uuid, uuid, uuid, text, text, timestamptz) IS
    'Distributed twin of complete_notice (p_end sent), fail_notice (failed) and release_notice (released); arguments already checked. False, changing nothing, unless the notice is being sent under p_claim_token.';

CREATE OR REPLACE FUNCTION llm.complete_notice(
    p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamptz DEFAULT now())
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_done boolean;
BEGIN
    PERFORM llm._check_claim(p_organization_id, p_notice_id, p_claim_token, p_now);
    SELECT e INTO v_done
      FROM llm._end_claim(p_organization_id, p_notice_id, p_claim_token, 'sent', NULL,
                          coalesce(p_now, pg_catalog.now())) AS e;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION llm.complete_notice(uuid, uuid, uuid, timestamptz) IS
    'Marks a claimed notice sent (sending -> sent); false, changing nothing, unless it is being sent under p_claim_token (already sent, re-armed, or claimed again since).';

CREATE OR REPLACE FUNCTION llm.fail_notice(
    p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_error text,
    p_now timestamptz DEFAULT now())
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_done boolean;
BEGIN
    PERFORM llm._check_claim(p_organization_id, p_notice_id, p_claim_token, p_now);
    PERFORM llm._check_text('p_error', p_error, 4000);
    SELECT e INTO v_done
      FROM llm._end_claim(p_organization_id, p_notice_id, p_claim_token, 'failed', p_error,
                          coalesce(p_now, pg_catalog.now())) AS e;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION llm.fail_notice(uuid, uuid, uuid, text, timestamptz) IS
    'Returns a claimed notice to owed with its error and an exponential backoff (base * 2^(attempts-1), capped by settings; NOTIFY llm_notices); false, changing nothing, unless it is being sent under p_claim_token.';

CREATE OR REPLACE FUNCTION llm.release_notice(
    p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamptz DEFAULT now())
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_done boolean;
BEGIN
    PERFORM llm._check_claim(p_organization_id, p_notice_id, p_claim_token, p_now);
    SELECT e INTO v_done
      FROM llm._end_claim(p_organization_id, p_notice_id, p_claim_token, 'released', NULL,
                          coalesce(p_now, pg_catalog.now())) AS e;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION llm.release_notice(uuid, uuid, uuid, timestamptz) IS
    'Gives a claimed notice back unsent (sending -> owed, due at p_now, no attempt counted, NOTIFY llm_notices): a worker shutting down; false, changing nothing, unless it is being sent under p_claim_token.';

CREATE OR REPLACE FUNCTION llm.rearm_notices(p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_timeout interval := (llm._settings()).notice_claim_timeout;
    v_count integer;
BEGIN
    PERFORM llm._check_clock(p_now);
    -- a worker that claimed and vanished: the notice is owed again, due now
    UPDATE llm.threshold_notices AS n
       SET status = 'owed', claimed_at = NULL, claim_token = NULL, next_attempt_at = v_now,
           last_error = coalesce(n.last_error, 'claim expired without completion')
     WHERE n.status = 'sending' AND n.claimed_at <= v_now - v_timeout;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM llm._notify_notices_owed('rearmed');
    END IF;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION llm.rearm_notices(timestamptz) IS
    'Makes notices owed again whose claim is older than settings.notice_claim_timeout without completion, due at once (NOTIFY llm_notices), voiding the claim''s token; returns how many. Failed notices are already owed with their backoff.';
