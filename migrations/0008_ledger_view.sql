-- depends: 0007_stripes
-- llm-db 0008: the ledger is a view of the requests, no longer a written table.
--
-- Every ledger row restated what its request already holds: the hold is the
-- request's hold_credits at created_at, the release the same amount at
-- settled_at, the charge its charged_credits (recovered_credits once trued up)
-- at settled_at, the adjustment of a true-up the difference at late_reported_at.
-- Writing them cost every admission and settlement an extra insert and index
-- entries. The view shows the same rows, derived.
--
-- Upgrading a populated database: the table is compared with the view row for
-- row first; any difference stops the migration (nothing changes), so books
-- edited by hand are never silently rewritten.

CREATE VIEW llm.ledger_derived AS
SELECT i.organization_id, i.id AS invocation_id, e.entry::llm.ledger_entry AS entry, i.period_start,
       e.credits, e.cents, e.recorded_at
  FROM llm.invocations AS i
 CROSS JOIN LATERAL (VALUES
        ('hold', i.hold_credits::bigint, NULL::bigint, i.created_at,
         true),
        ('release', i.hold_credits::bigint, NULL::bigint, i.settled_at,
         i.settled_at IS NOT NULL),
        ('charge', coalesce(i.recovered_credits, i.charged_credits)::bigint,
         CASE WHEN i.recovered_credits IS NULL THEN i.charged_cents::bigint END, i.settled_at,
         i.settled_at IS NOT NULL
           AND (coalesce(i.recovered_credits, i.charged_credits) > 0
                OR (i.recovered_credits IS NULL AND coalesce(i.charged_cents, 0) > 0))),
        ('adjustment', (i.charged_credits - i.recovered_credits)::bigint, i.charged_cents::bigint,
         i.late_reported_at, i.settlement_kind IS NOT DISTINCT FROM 'trued_up')
       ) AS e(entry, credits, cents, recorded_at, present)
 WHERE e.present;

DO $compare$
DECLARE
    v_missing bigint;
    v_extra bigint;
BEGIN
    SELECT count(*) INTO v_missing FROM (
        SELECT organization_id, invocation_id, entry::text, period_start, credits, cents, recorded_at FROM llm.ledger
        EXCEPT ALL
        SELECT organization_id, invocation_id, entry::text, period_start, credits, cents, recorded_at FROM llm.ledger_derived) AS d;
    SELECT count(*) INTO v_extra FROM (
        SELECT organization_id, invocation_id, entry::text, period_start, credits, cents, recorded_at FROM llm.ledger_derived
        EXCEPT ALL
        SELECT organization_id, invocation_id, entry::text, period_start, credits, cents, recorded_at FROM llm.ledger) AS d;
    IF v_missing > 0 OR v_extra > 0 THEN
        RAISE EXCEPTION 'llm 0008: the ledger differs from what its requests say (% rows only in the table, % only in the requests)',
                v_missing, v_extra
            USING ERRCODE = '55000',
                  HINT = 'Compare llm.ledger with llm.ledger_derived and repair the books before upgrading; nothing was changed.';
    END IF;
END
$compare$;

DROP TABLE llm.ledger;
ALTER VIEW llm.ledger_derived RENAME TO ledger;
COMMENT ON VIEW llm.ledger IS
    'The credit ledger, derived from the requests: one hold, one release, at most one charge and at most one adjustment (a true-up, signed) per request, with amounts and times.';
