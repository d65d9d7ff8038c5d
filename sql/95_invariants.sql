-- The invariants (docs/contract.md "Invariants"), one private function each:
-- llm._invariant_<N>() returns the rows of its violations, nothing when the books keep
-- it. 2b, 4b and 5b are checks of their own, reported under 2, 4 and 5. A new invariant
-- takes the next number (16, then 17...), with its function here, its call in
-- check_invariants() and its case in tests/test_invariants.py.
--
-- Each is PL/pgSQL, not SQL: no SQL-language routine reads distributed tables (docs/architecture.md
-- "Citus rules"). None is granted: check_invariants() runs them with its owner's rights.

-- The detail of a finding kept although its subject no longer differs from its requests
-- (invariants 11 and 13): the subject is gone, or agrees, with these figures.
CREATE OR REPLACE FUNCTION llm._kept_finding(p_finding text, p_last_seen_at timestamptz, p_subject text,
                                             p_subject_exists boolean, p_figures text)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN pg_catalog.format('%s (last seen %s), but the %s %s', p_finding, p_last_seen_at, p_subject,
                             CASE WHEN p_subject_exists THEN 'agrees with its requests: ' || p_figures
                                  ELSE 'does not exist' END);
END
$$;
COMMENT ON FUNCTION llm._kept_finding(text, timestamptz, text, boolean, text) IS
    'The detail invariants 11 and 13 report for a finding whose subject is gone or agrees with its requests.';

-- 1. held = sum of holds of open invocations, for every stripe of a period (so for
--    the period too)
CREATE OR REPLACE FUNCTION llm._invariant_1()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 1, s.organization_id, 'period ' || s.period_start || ' stripe ' || s.stripe,
           pg_catalog.format('held_credits=%s, open holds=%s', s.held_credits, coalesce(h.held, 0))
      FROM llm.period_stripes AS s
      LEFT JOIN (SELECT i.organization_id, i.period_start, i.stripe, sum(i.hold_credits) AS held
                   FROM llm.invocations AS i WHERE i.status IN ('reserved', 'dispatched')
                  GROUP BY 1, 2, 3) AS h
        ON h.organization_id = s.organization_id AND h.period_start = s.period_start AND h.stripe = s.stripe
     WHERE s.held_credits <> coalesce(h.held, 0);
END
$$;
COMMENT ON FUNCTION llm._invariant_1() IS
    'Invariant 1: every period stripe''s held_credits equals the holds of its reserved and dispatched requests.';

-- 2b. used credits and cents, stripe by stripe: invariant 2's first half for each
--     stripe (its rows are reported under 2)
CREATE OR REPLACE FUNCTION llm._invariant_2b()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 2, s.organization_id, 'period ' || s.period_start || ' stripe ' || s.stripe,
           pg_catalog.format('used_credits=%s used_cents=%s; invocations %s/%s',
                             s.used_credits, s.used_cents, coalesce(c.credits, 0), coalesce(c.cents, 0))
      FROM llm.period_stripes AS s
      LEFT JOIN (SELECT i.organization_id, i.period_start, i.stripe, sum(i.charged_credits) AS credits,
                        sum(coalesce(i.charged_cents, 0)) AS cents
                   FROM llm.invocations AS i WHERE i.status IN ('settled', 'failed')
                  GROUP BY 1, 2, 3) AS c
        ON c.organization_id = s.organization_id AND c.period_start = s.period_start AND c.stripe = s.stripe
     WHERE (s.used_credits, s.used_cents) IS DISTINCT FROM (coalesce(c.credits, 0), coalesce(c.cents, 0));
END
$$;
COMMENT ON FUNCTION llm._invariant_2b() IS
    'Invariant 2b, reported as 2: every period stripe''s used_credits and used_cents equal the charges of its terminal requests.';

-- 2. used = sum of charges of terminal invocations = sum of ledger charges and adjustments.
--    Since the period became the sum of its stripes (schema 0007) and the ledger a view
--    of the requests (0008), a breach of 2 is also one of 2b or 3: kept as the period's
--    own statement of the rule, the figure a reader compares first.
CREATE OR REPLACE FUNCTION llm._invariant_2()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 2, p.organization_id, 'period ' || p.period_start,
           pg_catalog.format('used_credits=%s used_cents=%s; invocations %s/%s; ledger %s/%s',
                             p.used_credits, p.used_cents, coalesce(c.credits, 0), coalesce(c.cents, 0),
                             coalesce(l.credits, 0), coalesce(l.cents, 0))
      FROM llm.periods AS p
      LEFT JOIN (SELECT i.organization_id, i.period_start, sum(i.charged_credits) AS credits,
                        sum(coalesce(i.charged_cents, 0)) AS cents
                   FROM llm.invocations AS i WHERE i.status IN ('settled', 'failed')
                  GROUP BY 1, 2) AS c
        ON c.organization_id = p.organization_id AND c.period_start = p.period_start
      LEFT JOIN (SELECT g.organization_id, g.period_start, sum(g.credits) AS credits,
                        sum(coalesce(g.cents, 0)) AS cents
                   FROM llm.ledger AS g WHERE g.entry IN ('charge', 'adjustment')
                  GROUP BY 1, 2) AS l
        ON l.organization_id = p.organization_id AND l.period_start = p.period_start
     WHERE (p.used_credits, p.used_cents) IS DISTINCT FROM (coalesce(c.credits, 0), coalesce(c.cents, 0))
        OR (p.used_credits, p.used_cents) IS DISTINCT FROM (coalesce(l.credits, 0), coalesce(l.cents, 0));
END
$$;
COMMENT ON FUNCTION llm._invariant_2() IS
    'Invariant 2: every period''s used_credits and used_cents equal the charges of its terminal requests and the sum of its ledger charges and adjustments.';

-- 3. each invocation: one hold, a release iff terminal, at most one charge and at most
--    one adjustment (iff trued up, over the recovery charge) adding up to its own charge.
--    With the ledger a view (schema 0008), the requests' CHECK constraints keep it; this
--    catches a row written while one of them was dropped.
CREATE OR REPLACE FUNCTION llm._invariant_3()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 3, i.organization_id, 'invocation ' || i.id,
           pg_catalog.format('status=%s kind=%s holds=%s releases=%s charge=%s/%s adjustments=%s (%s/%s) recorded=%s/%s recovered=%s',
                             i.status, i.settlement_kind, coalesce(g.holds, 0), coalesce(g.releases, 0),
                             g.charge_credits, g.charge_cents, coalesce(g.adjustments, 0),
                             g.adjustment_credits, g.adjustment_cents, i.charged_credits, i.charged_cents,
                             i.recovered_credits)
      FROM llm.invocations AS i
      LEFT JOIN (SELECT g.organization_id, g.invocation_id,
                        count(*) FILTER (WHERE g.entry = 'hold') AS holds,
                        count(*) FILTER (WHERE g.entry = 'release') AS releases,
                        count(*) FILTER (WHERE g.entry = 'adjustment') AS adjustments,
                        sum(g.credits) FILTER (WHERE g.entry = 'hold') AS hold_credits,
                        sum(g.credits) FILTER (WHERE g.entry = 'release') AS release_credits,
                        sum(g.credits) FILTER (WHERE g.entry = 'charge') AS charge_credits,
                        sum(g.cents) FILTER (WHERE g.entry = 'charge') AS charge_cents,
                        sum(g.credits) FILTER (WHERE g.entry = 'adjustment') AS adjustment_credits,
                        sum(g.cents) FILTER (WHERE g.entry = 'adjustment') AS adjustment_cents
                   FROM llm.ledger AS g GROUP BY 1, 2) AS g
        ON g.organization_id = i.organization_id AND g.invocation_id = i.id
     WHERE coalesce(g.holds, 0) <> 1
        OR g.hold_credits IS DISTINCT FROM i.hold_credits
        OR coalesce(g.releases, 0) <> (i.status IN ('settled', 'failed'))::integer
        OR (i.status IN ('settled', 'failed') AND g.release_credits IS DISTINCT FROM i.hold_credits)
        OR coalesce(g.adjustments, 0) <> (i.settlement_kind IS NOT DISTINCT FROM 'trued_up')::integer
        OR (i.settlement_kind = 'trued_up' AND coalesce(g.charge_credits, 0) <> i.recovered_credits)
        OR coalesce(g.charge_credits, 0) + coalesce(g.adjustment_credits, 0)
           IS DISTINCT FROM coalesce(i.charged_credits, 0)
        OR coalesce(g.charge_cents, 0) + coalesce(g.adjustment_cents, 0)
           IS DISTINCT FROM coalesce(i.charged_cents, 0);
END
$$;
COMMENT ON FUNCTION llm._invariant_3() IS
    'Invariant 3: every request has one hold, a release iff it is terminal, at most one charge and at most one adjustment (iff it was trued up), adding up to its own charge.';

-- 4. admission never takes used + held over the allowance. What may go over it is
--    exactly what terminal requests booked beyond what they had reserved, their
--    overrun: a settlement or failure above its hold, a true-up above the recovery
--    charge (recovery charges the hold or 0, never more; the true-up holds nothing).
--    Every other movement lowers used + held - overrun or keeps it, and admission
--    raises it only within the allowance, so it stays within allowance +
--    allowance_excess: how far used + held stood over the allowance when it was
--    last changed (a lowered allowance; recorded under the stripes' locks).
CREATE OR REPLACE FUNCTION llm._invariant_4()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 4, p.organization_id, 'period ' || p.period_start,
           pg_catalog.format('allowance=%s used=%s held=%s overrun=%s allowance_excess=%s',
                             p.allowance_credits, p.used_credits, p.held_credits, coalesce(r.overrun, 0),
                             h.allowance_excess)
      FROM llm.periods AS p
      JOIN llm.period_heads AS h ON h.organization_id = p.organization_id AND h.period_start = p.period_start
      LEFT JOIN (SELECT i.organization_id, i.period_start,
                        sum(GREATEST(0, i.charged_credits - coalesce(i.recovered_credits, i.hold_credits))) AS overrun
                   FROM llm.invocations AS i
                  WHERE i.status IN ('settled', 'failed')
                  GROUP BY 1, 2) AS r
        ON r.organization_id = p.organization_id AND r.period_start = p.period_start
     WHERE p.allowance_credits IS NOT NULL
       AND p.used_credits + p.held_credits - coalesce(r.overrun, 0) > p.allowance_credits + h.allowance_excess;
END
$$;
COMMENT ON FUNCTION llm._invariant_4() IS
    'Invariant 4: in every period with an allowance, used + held - overrun stays within the allowance plus allowance_excess.';

-- 4b. (reported under 4) the stripes' escrow never promises more than the period has
--     left: together the admit_rooms are at most what is left to the allowance and to
--     the sum limit (0 when the period is already over), each set under an allowance,
--     and the cents_rooms at most what is left to the sum limit. Otherwise a NULL room
--     promises nothing: the stripe's next movement takes the exact path, which spreads
--     it (0.3.0 left an unlimited period's admit_rooms NULL, and no cents_room; none is
--     spread until the contract step of 0.4.0, 20_stripes.sql _spread_rooms)
CREATE OR REPLACE FUNCTION llm._invariant_4b()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 4, p.organization_id, 'period ' || p.period_start,
           pg_catalog.format('allowance=%s used=%s held=%s cents=%s, stripes'' admit_room: sum %s, unset %s; cents_room: sum %s',
                             p.allowance_credits, p.used_credits, p.held_credits, p.used_cents,
                             r.rooms, r.unset, r.cents_rooms)
      FROM llm.periods AS p
      JOIN (SELECT s.organization_id, s.period_start, coalesce(sum(s.admit_room), 0) AS rooms,
                   coalesce(sum(s.cents_room), 0) AS cents_rooms,
                   count(*) FILTER (WHERE s.admit_room IS NULL) AS unset
              FROM llm.period_stripes AS s GROUP BY 1, 2) AS r
        ON r.organization_id = p.organization_id AND r.period_start = p.period_start
     WHERE (p.allowance_credits IS NOT NULL AND r.unset > 0)
        OR r.rooms > GREATEST(0, LEAST(coalesce(p.allowance_credits, llm._max_sum()), llm._max_sum())
                                 - p.used_credits - p.held_credits)
        OR r.cents_rooms > GREATEST(0, llm._max_sum() - p.used_cents);
END
$$;
COMMENT ON FUNCTION llm._invariant_4b() IS
    'Invariant 4b, reported as 4: the stripes'' admit_rooms (each set under an allowance) and cents_rooms together never promise more than the period has left to its allowance and to the sum limit.';

-- 5b. (reported under 5) no threshold crossing can be missed: while a threshold of the
--     organization is ahead and not notified, each stripe's notice_room is set and
--     together they are less than the usage that reaches it (so a movement within them
--     cannot cross it).
--     Joins on organization_id only, no correlated subquery beside the unnest: Citus
--     plans it as one query per shard (docs/scaling.md, "The rules").
CREATE OR REPLACE FUNCTION llm._invariant_5b()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 5, n.organization_id, 'period ' || n.period_start,
           pg_catalog.format('used=%s, next threshold %s%% of %s needs %s more; stripes'' notice_room: sum %s, unset %s',
                             n.used_credits, n.next_pct, n.allowance_credits, n.need, r.rooms, r.unset)
      FROM (SELECT a.organization_id, a.period_start, a.used_credits, a.allowance_credits,
                   min(a.pct) AS next_pct,
                   pg_catalog.ceil(min(a.pct)::numeric * a.allowance_credits / 100)::bigint - a.used_credits AS need
              FROM (SELECT p.organization_id, p.period_start, p.used_credits, p.allowance_credits, t.pct
                      FROM llm.periods AS p
                      JOIN llm.organizations AS o ON o.id = p.organization_id
                     CROSS JOIN LATERAL pg_catalog.unnest(o.notice_thresholds) AS t(pct)
                      LEFT JOIN llm.threshold_notices AS tn
                        ON tn.organization_id = p.organization_id AND tn.period_start = p.period_start
                       AND tn.threshold_pct = t.pct
                       AND tn.scope = 'organization' AND tn.budget_window = 'month'  -- the allowance's
                     WHERE tn.organization_id IS NULL  -- not notified
                       AND p.used_credits::numeric * 100 < t.pct::numeric * p.allowance_credits) AS a
             GROUP BY a.organization_id, a.period_start, a.used_credits, a.allowance_credits) AS n
      JOIN (SELECT s.organization_id, s.period_start, coalesce(sum(s.notice_room), 0) AS rooms,
                   count(*) FILTER (WHERE s.notice_room IS NULL) AS unset
              FROM llm.period_stripes AS s GROUP BY 1, 2) AS r
        ON r.organization_id = n.organization_id AND r.period_start = n.period_start
     WHERE r.unset > 0 OR r.rooms > n.need;
END
$$;
COMMENT ON FUNCTION llm._invariant_5b() IS
    'Invariant 5b, reported as 5: while a threshold is ahead and not notified, every stripe''s notice_room is set and together they stay below the usage that reaches it.';

-- 5. past_window_alerted_at only on recovered requests (a trued-up one was recovered
--    first); at most one notice per threshold (the unique key guarantees the latter;
--    checked here against a dropped constraint)
CREATE OR REPLACE FUNCTION llm._invariant_5()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 5, i.organization_id, 'invocation ' || i.id, 'past-window alert on a request that was not recovered'
      FROM llm.invocations AS i
     WHERE i.past_window_alerted_at IS NOT NULL
       AND i.settlement_kind IS DISTINCT FROM 'recovered' AND i.settlement_kind IS DISTINCT FROM 'trued_up';
    RETURN QUERY
    SELECT 5, n.organization_id,
           CASE WHEN n.scope = 'organization' AND n.budget_window = 'month' THEN 'period ' || n.period_start
                ELSE pg_catalog.format('budget %s %s %s %s', n.scope, coalesce(n.scope_id, ''), n.budget_window,
                                       n.period_start) END,
           pg_catalog.format('%s notices for threshold %s', count(*), n.threshold_pct)
      FROM llm.threshold_notices AS n
     GROUP BY n.organization_id, n.scope, n.scope_id, n.budget_window, n.period_start, n.threshold_pct
    HAVING count(*) > 1;
END
$$;
COMMENT ON FUNCTION llm._invariant_5() IS
    'Invariant 5: only recovered (or later trued-up) requests carry a past-window alert, and each threshold of a budget window has at most one notice.';

-- What each task's terminal requests charged, the figures its totals must equal
-- (invariants 6 and 13). Inlined into each reader's query; on Citus, grouped by the
-- distribution column, one query per shard.
CREATE OR REPLACE VIEW llm._execution_charges AS
SELECT i.organization_id, i.execution_id, count(*) AS n, sum(i.charged_credits) AS credits,
       sum(coalesce(i.charged_cents, 0)) AS cents
  FROM llm.invocations AS i
 WHERE i.execution_id IS NOT NULL AND i.status IN ('settled', 'failed')
 GROUP BY i.organization_id, i.execution_id;
COMMENT ON VIEW llm._execution_charges IS
    'Internal: each task''s terminal requests, counted, with their charged credits and cents.';

-- 6. task totals = sum over its terminal invocations, except reported drift
CREATE OR REPLACE FUNCTION llm._invariant_6()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 6, x.organization_id, 'execution ' || x.id,
           pg_catalog.format('recorded %s/%s/%s, invocations %s/%s/%s', x.request_count, x.credits, x.cents,
                             coalesce(s.n, 0), coalesce(s.credits, 0), coalesce(s.cents, 0))
      FROM llm.executions AS x
      LEFT JOIN llm._execution_charges AS s
        ON s.organization_id = x.organization_id AND s.execution_id = x.id
     WHERE (x.request_count, x.credits, x.cents)
           IS DISTINCT FROM (coalesce(s.n, 0), coalesce(s.credits, 0), coalesce(s.cents, 0))
       AND NOT EXISTS (SELECT FROM llm.drift_findings AS f
                        WHERE f.organization_id = x.organization_id AND f.execution_id = x.id);
END
$$;
COMMENT ON FUNCTION llm._invariant_6() IS
    'Invariant 6: every task''s request_count, credits and cents equal the sums over its terminal requests, unless it has a drift finding.';

-- 7. a closed execution is stamped; an abandoned one has no duration
CREATE OR REPLACE FUNCTION llm._invariant_7()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 7, x.organization_id, 'execution ' || x.id,
           pg_catalog.format('status=%s ended_at=%s duration_ms=%s', x.status, x.ended_at, x.duration_ms)
      FROM llm.executions AS x
     WHERE (x.status = 'running') <> (x.ended_at IS NULL)
        OR (x.status = 'abandoned' AND x.duration_ms IS NOT NULL)
        OR (x.status = 'completed' AND x.duration_ms IS NULL);
END
$$;
COMMENT ON FUNCTION llm._invariant_7() IS
    'Invariant 7: a task has ended_at iff it is closed, an abandoned task has no duration and a completed one has one.';

-- 8. every invocation belongs to a period (and a stripe of it) and, when linked, a
--    task of its own organization (enforced by the functions, not by foreign keys:
--    schema 0003)
CREATE OR REPLACE FUNCTION llm._invariant_8()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 8, i.organization_id, 'invocation ' || i.id,
           pg_catalog.format('period %s stripe %s %s, execution %s %s', i.period_start, i.stripe,
                             CASE WHEN s.period_start IS NULL THEN 'missing' ELSE 'found' END,
                             i.execution_id,
                             CASE WHEN i.execution_id IS NULL THEN 'not linked'
                                  WHEN x.id IS NULL THEN 'missing' ELSE 'found' END)
      FROM llm.invocations AS i
      LEFT JOIN llm.period_stripes AS s
        ON s.organization_id = i.organization_id AND s.period_start = i.period_start AND s.stripe = i.stripe
      LEFT JOIN llm.executions AS x
        ON x.organization_id = i.organization_id AND x.id = i.execution_id
     WHERE s.period_start IS NULL OR (i.execution_id IS NOT NULL AND x.id IS NULL);
END
$$;
COMMENT ON FUNCTION llm._invariant_8() IS
    'Invariant 8: every request belongs to a stripe of a period and, when linked, to a task of its own organization.';

-- 9. the current period carries the allowance of the last committed
--    upsert_organization: with no clock here, "current" is every period starting
--    in or after the month of the organization's last update
CREATE OR REPLACE FUNCTION llm._invariant_9()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 9, p.organization_id, 'period ' || p.period_start,
           pg_catalog.format('allowance_credits=%s, organization allowance=%s (updated %s)',
                             p.allowance_credits, o.monthly_allowance_credits, o.updated_at)
      FROM llm.periods AS p
      JOIN llm.organizations AS o ON o.id = p.organization_id
     WHERE p.period_start >= llm._period_start(o.updated_at)
       AND p.allowance_credits IS DISTINCT FROM o.monthly_allowance_credits;
END
$$;
COMMENT ON FUNCTION llm._invariant_9() IS
    'Invariant 9: every period from the month of its organization''s last update on carries the organization''s allowance.';

-- 10. sweep_totals equal the requests they count: every recovery (recovered_credits
--     is set by recovery and kept by a true-up), those charged nothing although they
--     had an estimate, and every past-window alert (stamped once, by recovery)
CREATE OR REPLACE FUNCTION llm._invariant_10()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 10, o.id, 'sweep_totals',
           pg_catalog.format('recovered_requests=%s recovered_uncharged=%s past_window_alerts=%s; requests %s/%s/%s',
                             t.recovered_requests, t.recovered_uncharged, t.past_window_alerts,
                             coalesce(c.recovered, 0), coalesce(c.uncharged, 0), coalesce(c.alerts, 0))
      FROM llm.organizations AS o
      LEFT JOIN llm.sweep_totals AS t ON t.organization_id = o.id
      LEFT JOIN (SELECT i.organization_id,
                        count(*) FILTER (WHERE i.recovered_credits IS NOT NULL) AS recovered,
                        count(*) FILTER (WHERE i.recovered_credits = 0 AND i.estimate_credits > 0) AS uncharged,
                        count(*) FILTER (WHERE i.past_window_alerted_at IS NOT NULL) AS alerts
                   FROM llm.invocations AS i
                  WHERE i.recovered_credits IS NOT NULL OR i.past_window_alerted_at IS NOT NULL
                  GROUP BY 1) AS c
        ON c.organization_id = o.id
     WHERE (coalesce(t.recovered_requests, 0), coalesce(t.recovered_uncharged, 0), coalesce(t.past_window_alerts, 0))
           IS DISTINCT FROM (coalesce(c.recovered, 0), coalesce(c.uncharged, 0), coalesce(c.alerts, 0));
END
$$;
COMMENT ON FUNCTION llm._invariant_10() IS
    'Invariant 10: every organization''s sweep_totals equal the counts of its recovered, recovered-uncharged and past-window-alerted requests.';

-- 11. an unresolved period finding means its period still disagrees with its
--     requests (used credits, used cents or held credits, as the audit computes them)
CREATE OR REPLACE FUNCTION llm._invariant_11()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 11, f.organization_id, 'period ' || f.period_start,
           llm._kept_finding('unresolved finding', f.last_seen_at, 'period', p.period_start IS NOT NULL,
                             pg_catalog.format('used %s/%s held %s', p.used_credits, p.used_cents, p.held_credits))
      FROM llm.period_findings AS f
      LEFT JOIN llm.periods AS p
        ON p.organization_id = f.organization_id AND p.period_start = f.period_start
      LEFT JOIN (SELECT i.organization_id, i.period_start,
                        sum(i.charged_credits) FILTER (WHERE i.status IN ('settled', 'failed')) AS used,
                        sum(coalesce(i.charged_cents, 0)) FILTER (WHERE i.status IN ('settled', 'failed')) AS cents,
                        sum(i.hold_credits) FILTER (WHERE i.status IN ('reserved', 'dispatched')) AS held
                   FROM llm.invocations AS i
                  GROUP BY 1, 2) AS c
        ON c.organization_id = f.organization_id AND c.period_start = f.period_start
     WHERE f.resolved_at IS NULL
       AND (p.period_start IS NULL
            OR (p.used_credits, p.used_cents, p.held_credits)
               = (coalesce(c.used, 0), coalesce(c.cents, 0), coalesce(c.held, 0)));
END
$$;
COMMENT ON FUNCTION llm._invariant_11() IS
    'Invariant 11: an unresolved period finding means its period''s counters still differ from its requests.';

-- 12. notice claims: a notice being sent has its claim's token, and no other notice
--    has one, so only the live claim's holder can end it
CREATE OR REPLACE FUNCTION llm._invariant_12()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 12, n.organization_id, 'notice ' || n.id,
           pg_catalog.format('status=%s claim_token=%s', n.status, coalesce(n.claim_token::text, 'NULL'))
      FROM llm.threshold_notices AS n
     WHERE (n.status = 'sending') <> (n.claim_token IS NOT NULL);
END
$$;
COMMENT ON FUNCTION llm._invariant_12() IS
    'Invariant 12: a notice carries a claim token iff it is being sent.';

-- 13. a drift finding means its task still differs from its terminal requests: a
--     finding has no resolved state, the sweep deletes it once its task agrees
--     (llm._refresh_drift), so every finding kept is an unresolved one
CREATE OR REPLACE FUNCTION llm._invariant_13()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 13, f.organization_id, 'execution ' || f.execution_id,
           llm._kept_finding('drift finding', f.last_seen_at, 'task', x.id IS NOT NULL,
                             pg_catalog.format('%s/%s/%s', x.request_count, x.credits, x.cents))
      FROM llm.drift_findings AS f
      LEFT JOIN llm.executions AS x ON x.organization_id = f.organization_id AND x.id = f.execution_id
      LEFT JOIN llm._execution_charges AS s
        ON s.organization_id = f.organization_id AND s.execution_id = f.execution_id
     WHERE x.id IS NULL
        OR (x.request_count, x.credits, x.cents) = (coalesce(s.n, 0), coalesce(s.credits, 0), coalesce(s.cents, 0));
END
$$;
COMMENT ON FUNCTION llm._invariant_13() IS
    'Invariant 13: a drift finding means its task still differs from its terminal requests.';

-- 14. each budget counter's used, held and cents (the sums of its stripes) equal the
--     requests admitted under it (their budget_mask, in the windows of their admission
--     time; a request of the previous release keeps it in invocation_scopes); every
--     counter a request was admitted under exists, unless retention may have deleted
--     it: its window ended on or before the organization's horizon and no open request
--     is admitted under it
CREATE OR REPLACE FUNCTION llm._invariant_14()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 14, coalesce(c.organization_id, r.organization_id),
           pg_catalog.format('budget %s %s %s %s', coalesce(c.scope, r.scope),
                             coalesce(c.scope_id, r.scope_id, ''), coalesce(c.budget_window, r.budget_window),
                             coalesce(c.window_start, r.window_start)),
           pg_catalog.format('counter used=%s held=%s cents=%s; requests used=%s held=%s cents=%s',
                             c.used_credits, c.held_credits, c.used_cents,
                             coalesce(r.used, 0), coalesce(r.held, 0), coalesce(r.cents, 0))
      FROM (SELECT b.organization_id, b.scope, b.scope_id, b.budget_window, b.window_start,
                   sum(b.used_credits) AS used_credits, sum(b.held_credits) AS held_credits,
                   sum(b.used_cents) AS used_cents
              FROM llm.budget_counters AS b
             GROUP BY 1, 2, 3, 4, 5) AS c
      FULL JOIN (SELECT k.organization_id, k.scope, k.scope_id, k.budget_window, k.window_start,
                        sum(k.charged_credits) FILTER (WHERE k.status IN ('settled', 'failed')) AS used,
                        sum(k.hold_credits) FILTER (WHERE k.status IN ('reserved', 'dispatched')) AS held,
                        sum(coalesce(k.charged_cents, 0)) FILTER (WHERE k.status IN ('settled', 'failed')) AS cents
                   FROM llm._invocation_budget_keys AS k
                  GROUP BY 1, 2, 3, 4, 5) AS r
        ON r.organization_id = c.organization_id AND r.scope = c.scope
       AND r.scope_id IS NOT DISTINCT FROM c.scope_id AND r.budget_window = c.budget_window
       AND r.window_start = c.window_start
      LEFT JOIN llm.budget_horizons AS h ON h.organization_id = r.organization_id
     WHERE (c.organization_id IS NULL
            AND (r.held IS NOT NULL OR h.horizon IS NULL
                 OR llm._window_end(r.budget_window, r.window_start) > h.horizon))
        OR (c.organization_id IS NOT NULL
            AND (c.used_credits, c.held_credits, c.used_cents)
                IS DISTINCT FROM (coalesce(r.used, 0), coalesce(r.held, 0), coalesce(r.cents, 0)));
END
$$;
COMMENT ON FUNCTION llm._invariant_14() IS
    'Invariant 14: every budget counter''s used, held and cents (summed over its stripes) equal the requests admitted under it, and every counter a request was admitted under exists unless retention may have deleted it (window ended on or before the organization''s horizon, no open request under it).';

-- 15. a budget is a ceiling: used + held - overrun (as in 4) of a counter (its stripes
--     summed) never exceeds the limit it admits against (admitted_limit: its last
--     exact admission's, or the budget in force its rooms were last spread under); and
--     that is the budget's limit now unless the budget was changed, replaced (own <->
--     '*') or removed since (another revision applies now)
CREATE OR REPLACE FUNCTION llm._invariant_15()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 15, c.organization_id,
           pg_catalog.format('budget %s %s %s %s', c.scope, coalesce(c.scope_id, ''), c.budget_window, c.window_start),
           pg_catalog.format('used=%s held=%s overrun=%s admitted_limit=%s limit now=%s (%s)',
                             c.used_credits, c.held_credits, coalesce(o.overrun, 0), c.admitted_limit,
                             coalesce(b.limit_credits::text, 'none'),
                             CASE WHEN b.revision = c.admitted_revision THEN 'unchanged since' ELSE 'changed since' END)
      FROM (SELECT x.organization_id, x.scope, x.scope_id, x.budget_window, x.window_start,
                   sum(x.used_credits) AS used_credits, sum(x.held_credits) AS held_credits,
                   max(x.admitted_limit) AS admitted_limit, min(x.admitted_limit) AS least_limit,
                   (pg_catalog.array_agg(x.admitted_revision))[1] AS admitted_revision,
                   count(DISTINCT x.admitted_revision) AS revisions
              FROM llm.budget_counters AS x
             GROUP BY 1, 2, 3, 4, 5) AS c
      LEFT JOIN (SELECT k.organization_id, k.scope, k.scope_id, k.budget_window, k.window_start,
                        sum(GREATEST(0, k.charged_credits - coalesce(k.recovered_credits, k.hold_credits))) AS overrun
                   FROM llm._invocation_budget_keys AS k
                  WHERE k.status IN ('settled', 'failed')
                  GROUP BY 1, 2, 3, 4, 5) AS o
        ON o.organization_id = c.organization_id AND o.scope = c.scope
       AND o.scope_id IS NOT DISTINCT FROM c.scope_id AND o.budget_window = c.budget_window
       AND o.window_start = c.window_start
      LEFT JOIN LATERAL (SELECT l.limit_credits, l.revision FROM llm.budget_limits AS l
                          WHERE l.organization_id = c.organization_id AND l.scope = c.scope
                            AND l.budget_window = c.budget_window
                            AND (l.scope_id IS NOT DISTINCT FROM c.scope_id OR l.scope_id = '*')
                          ORDER BY l.scope_id = '*' LIMIT 1) AS b ON true
     WHERE c.used_credits + c.held_credits - coalesce(o.overrun, 0) > c.admitted_limit
        OR c.least_limit <> c.admitted_limit OR c.revisions > 1  -- its stripes disagree
        OR (b.revision = c.admitted_revision AND b.limit_credits <> c.admitted_limit);
END
$$;
COMMENT ON FUNCTION llm._invariant_15() IS
    'Invariant 15: a budget counter''s used + held - overrun (its stripes summed) never exceeds the limit it admits against (the same on all its stripes), the budget''s limit while its revision is unchanged.';

-- 16. every request's row agrees with its status (what 0.3.0 kept as CHECK constraints,
--     which 0.4.0's contract step dropped so a settlement rewrites its row for less):
--     terminal iff settled_at; settled iff a settlement kind; a charge only when
--     terminal; recovery's charge its recovered_credits, no cents, 0 or the estimate; a
--     true-up's recovered charge kept and its cents set; and its period is the UTC
--     month it was admitted in (the audit and the sweep read a period by admission time)
CREATE OR REPLACE FUNCTION llm._invariant_16()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 16, i.organization_id, 'invocation ' || i.id,
           pg_catalog.format('status=%s settled_at=%s kind=%s charged=%s/%s recovered=%s estimate=%s period=%s created_at=%s',
                             i.status, i.settled_at, i.settlement_kind, i.charged_credits, i.charged_cents,
                             i.recovered_credits, i.estimate_credits, i.period_start, i.created_at)
      FROM llm.invocations AS i
     WHERE (i.status IN ('settled', 'failed')) <> (i.settled_at IS NOT NULL)
        OR (i.status = 'settled') <> (i.settlement_kind IS NOT NULL)
        OR (i.status NOT IN ('settled', 'failed') AND i.charged_credits IS NOT NULL)
        OR (i.settlement_kind = 'recovered'
            AND NOT (i.charged_cents IS NULL AND i.charged_credits = i.recovered_credits
                     AND (i.recovered_credits = 0 OR i.recovered_credits = i.estimate_credits)))
        OR (i.settlement_kind = 'trued_up'
            AND (i.recovered_credits IS NULL OR (i.charged_cents IS NULL AND i.cost_nanos IS NULL)))
        OR (i.settlement_kind IS DISTINCT FROM 'recovered' AND i.settlement_kind IS DISTINCT FROM 'trued_up'
            AND i.recovered_credits IS NOT NULL)
        OR i.period_start <> llm._period_start(i.created_at);
END
$$;
COMMENT ON FUNCTION llm._invariant_16() IS
    'Invariant 16: every request''s row agrees with its status (terminal iff settled_at, a kind iff settled, a charge only when terminal, recovery''s and a true-up''s figures) and its period is the UTC month of its admission.';

-- 17. what the period stripes keep for the readers of open requests and of settlement
--     days: a stripe's open_requests (where known) counts its open requests, none of
--     them admitted before its open_since (NULL when none), a quiet stripe has
--     none; and no terminal request of a stripe settled further (hours, rounded up)
--     after or before its admission than the stripe's settle bounds say
CREATE OR REPLACE FUNCTION llm._invariant_17()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_bounds_known boolean := EXISTS (SELECT FROM llm.upgrade_steps AS u WHERE u.step = 'settle_bounds');
BEGIN
    RETURN QUERY
    SELECT 17, s.organization_id, 'period ' || s.period_start || ' stripe ' || s.stripe,
           pg_catalog.format('open_requests=%s open_since=%s quiet=%s settle_lag_hours=%s settle_lead_hours=%s; requests open=%s earliest=%s lag=%s lead=%s',
                             s.open_requests, s.open_since, s.quiet, s.settle_lag_hours, s.settle_lead_hours,
                             coalesce(r.open, 0), r.earliest, r.lag, r.lead)
      FROM llm.period_stripes AS s
      LEFT JOIN (SELECT i.organization_id, i.period_start, i.stripe,
                        count(*) FILTER (WHERE i.status IN ('reserved', 'dispatched')) AS open,
                        min(i.created_at) FILTER (WHERE i.status IN ('reserved', 'dispatched')) AS earliest,
                        max(llm._hours_up(i.settled_at - i.created_at)) AS lag,
                        max(llm._hours_up(i.created_at - i.settled_at)) AS lead
                   FROM llm.invocations AS i
                  GROUP BY 1, 2, 3) AS r
        ON r.organization_id = s.organization_id AND r.period_start = s.period_start AND r.stripe = s.stripe
     WHERE (s.open_requests IS NOT NULL
            AND (s.open_requests <> coalesce(r.open, 0)
                 OR (coalesce(r.open, 0) = 0) <> (s.open_since IS NULL)
                 OR s.open_since > r.earliest))
        OR (s.quiet AND coalesce(r.open, 0) > 0)
        OR (v_bounds_known AND (coalesce(s.settle_lag_hours, 0) < r.lag OR coalesce(s.settle_lead_hours, 0) < r.lead));
END
$$;
COMMENT ON FUNCTION llm._invariant_17() IS
    'Invariant 17: every period stripe''s open_requests (where known) counts its open requests, none admitted before its open_since (NULL when none), a quiet stripe has none, and its settle bounds hold for each of its terminal requests.';

-- 18. a budget counter's stripes: there are as many as each says (0 .. stripes - 1), each
--     holds exactly the holds of the open requests on it (budget_stripe % stripes; a
--     request of the previous release on stripe 0), and rooms spread under the
--     organization's budgets revision in force never promise more than the counter has
--     left to the limit it admits against and to the sum limit, nor more usage than
--     reaches the next threshold of the budget in force not notified yet
CREATE OR REPLACE FUNCTION llm._invariant_18()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- Long on purpose: the invariant's two halves (each stripe's holds, the counter's
    -- rooms), each one query Citus can plan. Joins on organization_id only, no
    -- correlated subquery beside a set-returning function (_budget_keys, unnest):
    -- Citus plans it as one query per shard
    -- (docs/scaling.md, "The rules"). The budget in force is its own, else the scope's
    -- '*': two joins (own, star), the own one winning.
    RETURN QUERY
    SELECT 18, c.organization_id,
           pg_catalog.format('budget %s %s %s %s stripe %s', c.scope, coalesce(c.scope_id, ''), c.budget_window,
                             c.window_start, c.stripe),
           pg_catalog.format('stripes=%s of %s, held=%s (open requests hold %s)', c.stripes, c.rows, c.held_credits,
                             coalesce(sum(q.held), 0))
      FROM (SELECT x.organization_id, x.scope, x.scope_id, x.budget_window, x.window_start, x.stripe, x.stripes,
                   x.held_credits,
                   count(*) OVER (PARTITION BY x.organization_id, x.scope, x.scope_id, x.budget_window,
                                               x.window_start) AS rows
              FROM llm.budget_counters AS x) AS c
      LEFT JOIN (SELECT k.organization_id, k.scope, k.scope_id, k.budget_window, k.window_start,
                        coalesce(k.budget_stripe, 0) AS seed, sum(k.hold_credits) AS held
                   FROM llm._invocation_budget_keys AS k
                  WHERE k.status IN ('reserved', 'dispatched')
                  GROUP BY 1, 2, 3, 4, 5, 6) AS q
        ON q.organization_id = c.organization_id AND q.scope = c.scope
       AND q.scope_id IS NOT DISTINCT FROM c.scope_id AND q.budget_window = c.budget_window
       AND q.window_start = c.window_start AND q.seed % c.stripes = c.stripe
     GROUP BY c.organization_id, c.scope, c.scope_id, c.budget_window, c.window_start, c.stripe, c.stripes, c.rows,
              c.held_credits
    HAVING c.stripe >= c.stripes OR c.rows <> c.stripes OR c.held_credits <> coalesce(sum(q.held), 0);
    RETURN QUERY
    SELECT 18, r.organization_id,
           pg_catalog.format('budget %s %s %s %s', r.scope, coalesce(r.scope_id, ''), r.budget_window, r.window_start),
           pg_catalog.format('used=%s held=%s cents=%s admitted_limit=%s; rooms: admit %s, cents %s, notice %s (next threshold %s%% of %s needs %s)',
                             r.used, r.held, r.cents, r.admitted_limit, r.admit_rooms, r.cents_rooms, r.notice_rooms,
                             t.next_pct, t.limit_credits, t.need)
      FROM (SELECT x.organization_id, x.scope, x.scope_id, x.budget_window, x.window_start,
                   sum(x.used_credits) AS used, sum(x.held_credits) AS held, sum(x.used_cents) AS cents,
                   max(x.admitted_limit) AS admitted_limit, sum(x.admit_room) AS admit_rooms,
                   sum(x.cents_room) AS cents_rooms, sum(x.notice_room) AS notice_rooms,
                   count(*) FILTER (WHERE x.notice_room IS NULL) AS notice_unset
              FROM llm.budget_counters AS x
              JOIN llm.organizations AS o ON o.id = x.organization_id
             WHERE x.rooms_revision = o.budgets_revision
             GROUP BY 1, 2, 3, 4, 5) AS r
      -- the next threshold of the budget in force not notified yet, and the usage that reaches it
      LEFT JOIN (SELECT a.organization_id, a.scope, a.scope_id, a.budget_window, a.window_start, a.limit_credits,
                        min(a.pct) AS next_pct,
                        pg_catalog.ceil(min(a.pct)::numeric * a.limit_credits / 100)::bigint - a.used AS need
                   FROM (SELECT u.organization_id, u.scope, u.scope_id, u.budget_window, u.window_start, u.used,
                                CASE WHEN own.organization_id IS NOT NULL THEN own.limit_credits
                                     ELSE star.limit_credits END AS limit_credits, p.pct
                           FROM (SELECT x.organization_id, x.scope, x.scope_id, x.budget_window, x.window_start,
                                        sum(x.used_credits) AS used
                                   FROM llm.budget_counters AS x
                                   JOIN llm.organizations AS o ON o.id = x.organization_id
                                  WHERE x.rooms_revision = o.budgets_revision
                                  GROUP BY 1, 2, 3, 4, 5) AS u
                           LEFT JOIN llm.budget_limits AS own
                             ON own.organization_id = u.organization_id AND own.scope = u.scope
                            AND own.budget_window = u.budget_window AND own.scope_id IS NOT DISTINCT FROM u.scope_id
                           LEFT JOIN llm.budget_limits AS star
                             ON star.organization_id = u.organization_id AND star.scope = u.scope
                            AND star.budget_window = u.budget_window AND star.scope_id = '*'
                          CROSS JOIN LATERAL pg_catalog.unnest(CASE WHEN own.organization_id IS NOT NULL
                                                                    THEN own.thresholds ELSE star.thresholds END) AS p(pct)
                           LEFT JOIN llm.threshold_notices AS n
                             ON n.organization_id = u.organization_id AND n.scope = u.scope
                            AND n.scope_id IS NOT DISTINCT FROM u.scope_id AND n.budget_window = u.budget_window
                            AND n.period_start = u.window_start AND n.threshold_pct = p.pct
                          WHERE n.organization_id IS NULL  -- not notified
                            AND u.used::numeric * 100 < p.pct::numeric
                                * CASE WHEN own.organization_id IS NOT NULL THEN own.limit_credits
                                       ELSE star.limit_credits END) AS a
                  GROUP BY a.organization_id, a.scope, a.scope_id, a.budget_window, a.window_start, a.used,
                           a.limit_credits) AS t
        ON t.organization_id = r.organization_id AND t.scope = r.scope
       AND t.scope_id IS NOT DISTINCT FROM r.scope_id AND t.budget_window = r.budget_window
       AND t.window_start = r.window_start
     WHERE r.admit_rooms > GREATEST(0, LEAST(r.admitted_limit, llm._max_sum()) - r.used - r.held)
        OR r.cents_rooms > GREATEST(0, llm._max_sum() - r.cents)
        OR (t.need IS NOT NULL AND (r.notice_unset > 0 OR r.notice_rooms > t.need));
END
$$;
COMMENT ON FUNCTION llm._invariant_18() IS
    'Invariant 18: a budget counter has the stripes it says, each holding the holds of its open requests, and its rooms (spread under the budgets revision in force) promise no more than it has left to its limit and to the sum limit, nor usage past its next threshold not notified.';

-- 19. A request priced by the book (priced_by model or fallback: settle_usage, or a
--     failure or true-up with usage) carries its usage, its pinned version and credit
--     rate and no cents, and its cost and credits are exactly that usage priced at
--     them: the classes at the tier its prompt selects, rounded once half up, and
--     ceil(cost / nanos per credit) credits; priced_by says whether the version is the
--     fallback. One priced by its caller, or not at all (recovered), has no cost; a
--     request pins a credit rate only with a version, and only a settled or failed
--     request is priced.
CREATE OR REPLACE FUNCTION llm._invariant_19()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- the shape of every request's price figures: a scan with no pricing in it
    RETURN QUERY
    SELECT 19, i.organization_id, 'invocation ' || i.id,
           pg_catalog.format('priced_by=%s version=%s rate=%s cost=%s usage=%s tier=%s cents=%s status=%s',
                             i.priced_by, i.price_version_id, i.credit_rate_id, i.cost_nanos, i.usage,
                             i.price_tier, i.charged_cents, i.status)
      FROM llm.invocations AS i
     WHERE (i.credit_rate_id IS NOT NULL AND i.price_version_id IS NULL)
        OR (i.priced_by IS NOT NULL AND i.status NOT IN ('settled', 'failed'))
        OR (i.priced_by IS DISTINCT FROM 'model' AND i.priced_by IS DISTINCT FROM 'fallback'
            AND (i.cost_nanos IS NOT NULL OR i.usage IS NOT NULL OR i.price_tier IS NOT NULL))
        OR (i.priced_by IN ('model', 'fallback')
            AND (i.usage IS NULL OR i.charged_cents IS NOT NULL OR i.credit_rate_id IS NULL));
    -- the pins of every request that has one, and each priced request's figures
    -- recomputed from its usage at them
    RETURN QUERY
    SELECT 19, i.organization_id, 'invocation ' || i.id,
           pg_catalog.format('priced_by=%s version=%s rate=%s cost=%s computed=%s tier=%s computed=%s credits=%s',
                             i.priced_by, i.price_version_id, i.credit_rate_id, i.cost_nanos, c.cost,
                             i.price_tier, c.tier, i.charged_credits)
      FROM llm.invocations AS i
      LEFT JOIN llm.price_versions AS v ON v.id = i.price_version_id
      LEFT JOIN llm.credit_rates AS r ON r.id = i.credit_rate_id
      LEFT JOIN LATERAL (
            SELECT pg_catalog.round(
                       llm._class_cost(v.rates, t.tier, i.usage, 'input') + llm._class_cost(v.rates, t.tier, i.usage, 'cache_read')
                       + llm._class_cost(v.rates, t.tier, i.usage, 'cache_write_5m')
                       + llm._class_cost(v.rates, t.tier, i.usage, 'cache_write_1h')
                       + llm._class_cost(v.rates, t.tier, i.usage, 'output') + llm._class_cost(v.rates, t.tier, i.usage, 'reasoning')
                       + llm._class_cost(v.rates, t.tier, i.usage, 'requests')) AS cost,
                   (t.tier ->> 'above_prompt_tokens')::bigint AS tier
              -- kept whole (OFFSET 0): pulled up, the tier's expression would be an
              -- argument used many times, and _class_cost would not be inlined
              FROM (SELECT llm._price_tier(v.rates, i.usage) AS tier OFFSET 0) AS t
           ) AS c ON i.priced_by IN ('model', 'fallback')
     WHERE i.price_version_id IS NOT NULL
       AND (v.id IS NULL
            OR (i.credit_rate_id IS NOT NULL AND r.id IS NULL)
            OR (i.priced_by IN ('model', 'fallback')
                AND ((v.model = '*') <> (i.priced_by = 'fallback')
                     OR i.cost_nanos IS DISTINCT FROM c.cost
                     OR i.price_tier IS DISTINCT FROM c.tier
                     OR i.charged_credits IS DISTINCT FROM llm._credits_of(i.cost_nanos, r.nanos_per_credit))));
END
$$;
COMMENT ON FUNCTION llm._invariant_19() IS
    'Invariant 19: a request priced by the book carries its usage and pinned version and credit rate, no cents, and its cost, tier and credits are that usage priced at them; no other request has a cost.';

-- 20. Every cost sum is exact: the nanos the book priced (priced_nanos) of each period
--     stripe, each task and each budget counter (its stripes summed) equal the cost
--     of its terminal requests priced from usage, as corrected by llm.reprice (the
--     rest of a sum's cost is its cents * 10^7); a task with a drift finding is
--     reported under 6 instead. Only a request priced from usage has corrections, their
--     seqs run 1, 2, ..., and its corrected cost is its usage priced at the version its
--     last correction names.
CREATE OR REPLACE FUNCTION llm._invariant_20()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    WITH costs AS (  -- each priced request's cost as corrected
        SELECT i.organization_id, i.id, i.period_start, i.stripe, i.execution_id, i.budget_mask, i.project,
               i.api_key, i.end_user, i.created_at, i.cost_nanos + coalesce(c.corrections, 0) AS cost
          FROM llm.invocations AS i
          LEFT JOIN (SELECT k.organization_id, k.invocation_id, sum(k.difference_nanos) AS corrections
                       FROM llm.cost_corrections AS k GROUP BY 1, 2) AS c
            ON c.organization_id = i.organization_id AND c.invocation_id = i.id
         WHERE i.cost_nanos IS NOT NULL
    )
    SELECT 20, s.organization_id, 'period ' || s.period_start || ' stripe ' || s.stripe,
           pg_catalog.format('priced_nanos=%s; requests %s', s.priced_nanos, coalesce(c.priced, 0))
      FROM llm.period_stripes AS s
      LEFT JOIN (SELECT r.organization_id, r.period_start, r.stripe, sum(r.cost) AS priced
                   FROM costs AS r GROUP BY 1, 2, 3) AS c
        ON c.organization_id = s.organization_id AND c.period_start = s.period_start AND c.stripe = s.stripe
     WHERE s.priced_nanos IS DISTINCT FROM coalesce(c.priced, 0)
    UNION ALL
    SELECT 20, x.organization_id, 'execution ' || x.id,
           pg_catalog.format('priced_nanos=%s; requests %s', x.priced_nanos, coalesce(c.priced, 0))
      FROM llm.executions AS x
      LEFT JOIN (SELECT r.organization_id, r.execution_id, sum(r.cost) AS priced
                   FROM costs AS r WHERE r.execution_id IS NOT NULL GROUP BY 1, 2) AS c
        ON c.organization_id = x.organization_id AND c.execution_id = x.id
     WHERE coalesce(x.priced_nanos, 0) <> coalesce(c.priced, 0)
       AND NOT EXISTS (SELECT FROM llm.drift_findings AS f
                        WHERE f.organization_id = x.organization_id AND f.execution_id = x.id)
    UNION ALL
    SELECT 20, c.organization_id,
           pg_catalog.format('budget %s %s %s %s', c.scope, coalesce(c.scope_id, ''), c.budget_window, c.window_start),
           pg_catalog.format('priced_nanos=%s; requests %s', c.priced_nanos, coalesce(r.priced, 0))
      FROM (SELECT b.organization_id, b.scope, b.scope_id, b.budget_window, b.window_start,
                   sum(b.priced_nanos) AS priced_nanos
              FROM llm.budget_counters AS b
             GROUP BY 1, 2, 3, 4, 5) AS c
      LEFT JOIN (SELECT q.organization_id, k.scope, k.scope_id, k.budget_window, k.window_start,
                        sum(q.cost) AS priced
                   FROM costs AS q
                  CROSS JOIN LATERAL llm._budget_keys(q.budget_mask, q.project, q.api_key, q.end_user,
                                                      q.created_at) AS k
                  GROUP BY 1, 2, 3, 4, 5) AS r
        ON r.organization_id = c.organization_id AND r.scope = c.scope
       AND r.scope_id IS NOT DISTINCT FROM c.scope_id AND r.budget_window = c.budget_window
       AND r.window_start = c.window_start
     WHERE c.priced_nanos IS DISTINCT FROM coalesce(r.priced, 0);
    -- the corrections: of priced requests, numbered 1.., the last one's version pricing it
    RETURN QUERY
    SELECT 20, k.organization_id, 'invocation ' || k.invocation_id,
           pg_catalog.format('corrections=%s seqs=%s last version=%s corrected cost=%s priced_by=%s',
                             k.n, k.seqs, l.price_version_id, i.cost_nanos + k.corrections, i.priced_by)
      FROM (SELECT c.organization_id, c.invocation_id, count(*) AS n, max(c.seq) AS last,
                   pg_catalog.array_agg(c.seq ORDER BY c.seq) AS seqs, sum(c.difference_nanos) AS corrections
              FROM llm.cost_corrections AS c GROUP BY 1, 2) AS k
      LEFT JOIN llm.cost_corrections AS l
        ON l.organization_id = k.organization_id AND l.invocation_id = k.invocation_id AND l.seq = k.last
      LEFT JOIN llm.invocations AS i ON i.organization_id = k.organization_id AND i.id = k.invocation_id
      LEFT JOIN llm.price_versions AS v ON v.id = l.price_version_id
     WHERE i.cost_nanos IS NULL OR i.priced_by NOT IN ('model', 'fallback')
        OR k.seqs <> (SELECT pg_catalog.array_agg(g ORDER BY g) FROM pg_catalog.generate_series(1, k.n::integer) AS g)
        OR v.id IS NULL
        OR i.cost_nanos + k.corrections
           IS DISTINCT FROM (llm._usage_cost(i.model, v.id, v.rates, i.usage, 1)).cost_nanos;  -- class by class
END
$$;
COMMENT ON FUNCTION llm._invariant_20() IS
    'Invariant 20: the priced nanos of every period stripe, task and budget counter equal the cost of its terminal requests priced from usage as corrected (a sum''s cost is its cents * 10^7 plus these); corrections are of priced requests, numbered from 1, and the last one''s version prices the request at its corrected cost.';

-- 21. An organization's row says what its budgets are: has_budgets (once known)
--     whether it has one, and its uniform budgets (once known) the bits, limits and
--     revisions of all of them when none names an id (admission reads no budget then).
CREATE OR REPLACE FUNCTION llm._invariant_21()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT 21, o.id, 'organization ' || o.id,
           pg_catalog.format('has_budgets=%s uniform_budget_mask=%s limits=%s revisions=%s; budgets: %s, naming an id %s, mask %s, limits %s, revisions %s',
                             o.has_budgets, o.uniform_budget_mask, o.uniform_budget_limits, o.uniform_budget_revisions,
                             coalesce(b.n, 0), coalesce(b.named, 0), coalesce(b.mask, 0), b.limits, b.revisions)
      FROM llm.organizations AS o
      LEFT JOIN (SELECT l.organization_id, count(*) AS n, count(*) FILTER (WHERE l.scope_id <> '*') AS named,
                        sum(1 << llm._budget_slot(l.scope, l.budget_window)) AS mask,
                        pg_catalog.array_agg(l.limit_credits ORDER BY llm._budget_slot(l.scope, l.budget_window)) AS limits,
                        pg_catalog.array_agg(l.revision ORDER BY llm._budget_slot(l.scope, l.budget_window)) AS revisions
                   FROM llm.budget_limits AS l
                  GROUP BY l.organization_id) AS b
        ON b.organization_id = o.id
     WHERE o.has_budgets IS DISTINCT FROM (coalesce(b.n, 0) > 0) AND o.has_budgets IS NOT NULL
        OR (o.uniform_budget_mask IS NOT NULL
            AND (coalesce(b.named, 0) > 0
                 OR o.uniform_budget_mask <> coalesce(b.mask, 0)
                 OR o.uniform_budget_limits IS DISTINCT FROM coalesce(b.limits, '{}')
                 OR o.uniform_budget_revisions IS DISTINCT FROM coalesce(b.revisions, '{}')));
END
$$;
COMMENT ON FUNCTION llm._invariant_21() IS
    'Invariant 21: an organization''s has_budgets (where known) says whether it has a budget, and its uniform budgets (where known) are all of its budgets, none naming an id, their bits, limits and revisions in bit order.';

-- Every violation, invariant by invariant. The calls keep the order of 0.2.0's single
-- query list (2b before 2, 5b before 5), so the rows come out as they always have.
CREATE OR REPLACE FUNCTION llm.check_invariants()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN QUERY SELECT * FROM llm._invariant_1();
    RETURN QUERY SELECT * FROM llm._invariant_2b();
    RETURN QUERY SELECT * FROM llm._invariant_2();
    RETURN QUERY SELECT * FROM llm._invariant_3();
    RETURN QUERY SELECT * FROM llm._invariant_4();
    RETURN QUERY SELECT * FROM llm._invariant_4b();
    RETURN QUERY SELECT * FROM llm._invariant_5b();
    RETURN QUERY SELECT * FROM llm._invariant_5();
    RETURN QUERY SELECT * FROM llm._invariant_6();
    RETURN QUERY SELECT * FROM llm._invariant_7();
    RETURN QUERY SELECT * FROM llm._invariant_8();
    RETURN QUERY SELECT * FROM llm._invariant_9();
    RETURN QUERY SELECT * FROM llm._invariant_10();
    RETURN QUERY SELECT * FROM llm._invariant_11();
    RETURN QUERY SELECT * FROM llm._invariant_12();
    RETURN QUERY SELECT * FROM llm._invariant_13();
    RETURN QUERY SELECT * FROM llm._invariant_14();
    RETURN QUERY SELECT * FROM llm._invariant_15();
    RETURN QUERY SELECT * FROM llm._invariant_16();
    RETURN QUERY SELECT * FROM llm._invariant_17();
    RETURN QUERY SELECT * FROM llm._invariant_18();
    RETURN QUERY SELECT * FROM llm._invariant_19();
    RETURN QUERY SELECT * FROM llm._invariant_20();
    RETURN QUERY SELECT * FROM llm._invariant_21();
END
$$;
COMMENT ON FUNCTION llm.check_invariants() IS
    'Returns one row per violated invariant (docs/contract.md: held, used, ledger, admission, notices and alerts, task totals, task states, the period and task of every invocation, the current allowance, the sweeps'' totals, period findings, notice claims, drift findings, budget counters, budget ceilings, priced requests, cost sums and what an organization''s row says of its budgets); empty when the books are right.';
