-- depends: 0010_settings_ranges
-- llm-db 0011: a notice's claim has an owner (issue 20 defect 6).
--
-- A claim was known only by its notice: a worker whose claim expired, was
-- re-armed by the pass and claimed again by a second worker could still fail or
-- release the second worker's claim, and the notice went out again. Each claim
-- now carries a token that claim_notices returns; complete_notice, fail_notice
-- and release_notice act only for the live claim's token. Owed and sent notices
-- have none (invariant 12).
--
-- A notice being sent when this runs has no token to end its claim with: it is
-- owed again, due as it was, its attempt kept (its POST may be under way, and
-- delivery is at least once). The three routines change signature, so workers of
-- the previous release stop working at the upgrade: stop them first.
--
-- Live traffic: a new nullable column (no rewrite) and an UPDATE of the few rows
-- being sent (index threshold_notices_sending).

ALTER TABLE llm.threshold_notices ADD COLUMN claim_token uuid;
COMMENT ON COLUMN llm.threshold_notices.claim_token IS
    'The live claim''s token while sending (claim_notices returns it; complete_notice, fail_notice and release_notice need it); NULL when owed or sent.';

UPDATE llm.threshold_notices
   SET status = 'owed', claimed_at = NULL
 WHERE status = 'sending';
