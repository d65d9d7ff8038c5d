-- depends: 0019_admission_replayed
-- llm-db 0020: a notice for the first refusal of each limit and window.
--
-- A budget refuses on its commitments (used + held + estimate), while a threshold
-- counts used credits only, so with honest estimates usage stops short of the limit
-- and the 100 % notice never comes: limits were reached in silence. llm.note_refusal
-- (sql/28_budgets.sql) owes one notice per limit and window on the first refusal
-- reported, delivered as "llm.limit_reached", under the notices' unique key with
-- threshold 0, which no threshold list holds (thresholds are 1 .. 1000). So the
-- threshold's CHECK admits 0.
--
-- Under live traffic: the old CHECK is dropped and the new one added NOT VALID under
-- a brief ACCESS EXCLUSIVE lock of llm.threshold_notices (a settlement crossing a
-- threshold waits for it), then validated under SHARE UPDATE EXCLUSIVE, which blocks
-- no reader or writer.

ALTER TABLE llm.threshold_notices
    DROP CONSTRAINT threshold_notices_threshold_pct_check,
    ADD CONSTRAINT threshold_notices_threshold_pct_check CHECK (threshold_pct >= 0) NOT VALID;
ALTER TABLE llm.threshold_notices VALIDATE CONSTRAINT threshold_notices_threshold_pct_check;
COMMENT ON COLUMN llm.threshold_notices.threshold_pct IS
    'The whole percentage of the limit crossed by used credits; 0: the limit reached, a notice of the first refusal of its window (llm.note_refusal).';
