-- Threshold notices: created owed in the crossing transaction (_record_crossings),
-- claimed by compare-and-set per notice (works sharded), completed or failed
-- with exponential backoff, released by a worker shutting down, re-armed when a
-- claim was abandoned. Each claim has a token, and only its holder ends it: a
-- worker whose claim was re-armed and claimed again cannot end the new one
-- (issue 20 defect 6). Whenever a notice becomes owed the transaction does
-- NOTIFY llm_notices (sent at commit), which wakes `llm-db worker`.

-- The contract step of schema 0016 (issue 23): one notice per (organization, scope,
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
        UPDATE llm.threshold_notices AS n
           SET status = 'sending', claimed_at = v_now, attempts = n.attempts + 1, claim_token = v_token
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
