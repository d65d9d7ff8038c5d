-- The invariants (docs/contract.md "Invariants") as one query each:
-- check_invariants() returns every violation, and nothing when the books are right.

-- Long on purpose: one RETURN QUERY per invariant, numbered as in docs/contract.md and
-- read in that order; each block stands alone, so splitting would only add routines.
CREATE OR REPLACE FUNCTION llm.check_invariants()
RETURNS TABLE (invariant integer, organization_id uuid, subject text, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    -- 1. held = sum of holds of open invocations, for every stripe of a period (so for
    --    the period too)
    RETURN QUERY
    SELECT 1, s.organization_id, 'period ' || s.period_start || ' stripe ' || s.stripe,
           pg_catalog.format('held_credits=%s, open holds=%s', s.held_credits, coalesce(h.held, 0))
      FROM llm.period_stripes AS s
      LEFT JOIN (SELECT i.organization_id, i.period_start, i.stripe, sum(i.hold_credits) AS held
                   FROM llm.invocations AS i WHERE i.status IN ('reserved', 'dispatched')
                  GROUP BY 1, 2, 3) AS h
        ON h.organization_id = s.organization_id AND h.period_start = s.period_start AND h.stripe = s.stripe
     WHERE s.held_credits <> coalesce(h.held, 0);

    -- 2b. the same for used credits and cents, stripe by stripe
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

    -- 2. used = sum of charges of terminal invocations = sum of ledger charges and adjustments
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

    -- 3. each invocation: one hold, a release iff terminal, at most one charge and at most
    --    one adjustment (iff trued up, over the recovery charge) adding up to its own charge
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

    -- 4. admission never takes used + held over the allowance. What may go over it is
    --    exactly what terminal requests booked beyond what they had reserved, their
    --    overrun: a settlement or failure above its hold, a true-up above the recovery
    --    charge (recovery charges the hold or 0, never more; the true-up holds nothing).
    --    Every other movement lowers used + held - overrun or keeps it, and admission
    --    raises it only within the allowance, so it stays within allowance +
    --    allowance_excess: how far used + held stood over the allowance when it was
    --    last changed (a lowered allowance; recorded under the stripes' locks).
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

    -- 4b. the stripes' escrow never promises more than the period has left: each
    --     stripe's admit_room is set (NULL only when unlimited), and together they are at
    --     most allowance - used - held (0 when the period is already over)
    RETURN QUERY
    SELECT 4, p.organization_id, 'period ' || p.period_start,
           pg_catalog.format('allowance=%s used=%s held=%s, stripes'' admit_room: sum %s, unset %s',
                             p.allowance_credits, p.used_credits, p.held_credits, r.rooms, r.unset)
      FROM llm.periods AS p
      JOIN (SELECT s.organization_id, s.period_start, coalesce(sum(s.admit_room), 0) AS rooms,
                   count(*) FILTER (WHERE s.admit_room IS NULL) AS unset, count(*) AS stripes
              FROM llm.period_stripes AS s GROUP BY 1, 2) AS r
        ON r.organization_id = p.organization_id AND r.period_start = p.period_start
     WHERE (p.allowance_credits IS NULL AND r.unset <> r.stripes)
        OR (p.allowance_credits IS NOT NULL
            AND (r.unset > 0 OR r.rooms > GREATEST(0, p.allowance_credits - p.used_credits - p.held_credits)));

    -- 5b. no threshold crossing can be missed: while a threshold of the organization is
    --     ahead and not notified, each stripe's notice_room is set and together they are
    --     less than the usage that reaches it (so a movement within them cannot cross it).
    --     Joins on organization_id only, no correlated subquery beside the unnest: Citus
    --     plans it as one query per shard (docs/scaling.md, "The rules").
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

    -- 5. past_window_alerted_at only on recovered requests (a trued-up one was recovered
    --    first); at most one notice per threshold (the unique key guarantees the latter;
    --    checked here against a dropped constraint)
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

    -- 6. task totals = sum over its terminal invocations, except reported drift
    RETURN QUERY
    SELECT 6, x.organization_id, 'execution ' || x.id,
           pg_catalog.format('recorded %s/%s/%s, invocations %s/%s/%s', x.request_count, x.credits, x.cents,
                             coalesce(s.n, 0), coalesce(s.credits, 0), coalesce(s.cents, 0))
      FROM llm.executions AS x
      LEFT JOIN (SELECT i.organization_id, i.execution_id, count(*) AS n, sum(i.charged_credits) AS credits,
                        sum(coalesce(i.charged_cents, 0)) AS cents
                   FROM llm.invocations AS i
                  WHERE i.execution_id IS NOT NULL AND i.status IN ('settled', 'failed')
                  GROUP BY 1, 2) AS s
        ON s.organization_id = x.organization_id AND s.execution_id = x.id
     WHERE (x.request_count, x.credits, x.cents)
           IS DISTINCT FROM (coalesce(s.n, 0), coalesce(s.credits, 0), coalesce(s.cents, 0))
       AND NOT EXISTS (SELECT FROM llm.drift_findings AS f
                        WHERE f.organization_id = x.organization_id AND f.execution_id = x.id);

    -- 7. a closed execution is stamped; an abandoned one has no duration
    RETURN QUERY
    SELECT 7, x.organization_id, 'execution ' || x.id,
           pg_catalog.format('status=%s ended_at=%s duration_ms=%s', x.status, x.ended_at, x.duration_ms)
      FROM llm.executions AS x
     WHERE (x.status = 'running') <> (x.ended_at IS NULL)
        OR (x.status = 'abandoned' AND x.duration_ms IS NOT NULL)
        OR (x.status = 'completed' AND x.duration_ms IS NULL);

    -- 8. every invocation belongs to a period (and a stripe of it) and, when linked, a
    --    task of its own organization (enforced by the functions, not by foreign keys:
    --    schema 0003)
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

    -- 9. the current period carries the allowance of the last committed
    --    upsert_organization: with no clock here, "current" is every period starting
    --    in or after the month of the organization's last update
    RETURN QUERY
    SELECT 9, p.organization_id, 'period ' || p.period_start,
           pg_catalog.format('allowance_credits=%s, organization allowance=%s (updated %s)',
                             p.allowance_credits, o.monthly_allowance_credits, o.updated_at)
      FROM llm.periods AS p
      JOIN llm.organizations AS o ON o.id = p.organization_id
     WHERE p.period_start >= llm._period_start(o.updated_at)
       AND p.allowance_credits IS DISTINCT FROM o.monthly_allowance_credits;

    -- 10. sweep_totals equal the requests they count: every recovery (recovered_credits
    --     is set by recovery and kept by a true-up), those charged nothing although they
    --     had an estimate, and every past-window alert (stamped once, by recovery)
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

    -- 11. an unresolved period finding means its period still disagrees with its
    --     requests (used credits, used cents or held credits, as the audit computes them)
    RETURN QUERY
    SELECT 11, f.organization_id, 'period ' || f.period_start,
           pg_catalog.format('unresolved finding (last seen %s), but the period %s',
                             f.last_seen_at,
                             CASE WHEN p.period_start IS NULL THEN 'does not exist'
                                  ELSE pg_catalog.format('agrees with its requests: used %s/%s held %s',
                                                         p.used_credits, p.used_cents, p.held_credits) END)
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

    -- 12. notice claims: a notice being sent has its claim's token, and no other notice
    --    has one (issue 20 defect 6), so only the live claim's holder can end it
    RETURN QUERY
    SELECT 12, n.organization_id, 'notice ' || n.id,
           pg_catalog.format('status=%s claim_token=%s', n.status, coalesce(n.claim_token::text, 'NULL'))
      FROM llm.threshold_notices AS n
     WHERE (n.status = 'sending') <> (n.claim_token IS NOT NULL);

    -- 13. a drift finding means its task still differs from its terminal requests: a
    --     finding has no resolved state, the sweep deletes it once its task agrees
    --     (llm._refresh_drift), so every finding kept is an unresolved one
    RETURN QUERY
    SELECT 13, f.organization_id, 'execution ' || f.execution_id,
           pg_catalog.format('drift finding (last seen %s), but the task %s',
                             f.last_seen_at,
                             CASE WHEN x.id IS NULL THEN 'does not exist'
                                  ELSE pg_catalog.format('agrees with its requests: %s/%s/%s',
                                                         x.request_count, x.credits, x.cents) END)
      FROM llm.drift_findings AS f
      LEFT JOIN llm.executions AS x ON x.organization_id = f.organization_id AND x.id = f.execution_id
      LEFT JOIN (SELECT i.organization_id, i.execution_id, count(*) AS n, sum(i.charged_credits) AS credits,
                        sum(coalesce(i.charged_cents, 0)) AS cents
                   FROM llm.invocations AS i
                  WHERE i.execution_id IS NOT NULL AND i.status IN ('settled', 'failed')
                  GROUP BY 1, 2) AS s
        ON s.organization_id = f.organization_id AND s.execution_id = f.execution_id
     WHERE x.id IS NULL
        OR (x.request_count, x.credits, x.cents) = (coalesce(s.n, 0), coalesce(s.credits, 0), coalesce(s.cents, 0));

    -- 14. each budget counter's used, held and cents equal the requests admitted under
    --     it (their invocation_scopes.budget_mask, in the windows of their admission time); an open
    --     request's counters exist (a terminal one's may be gone: retention)
    RETURN QUERY
    SELECT 14, coalesce(c.organization_id, r.organization_id),
           pg_catalog.format('budget %s %s %s %s', coalesce(c.scope, r.scope),
                             coalesce(c.scope_id, r.scope_id, ''), coalesce(c.budget_window, r.budget_window),
                             coalesce(c.window_start, r.window_start)),
           pg_catalog.format('counter used=%s held=%s cents=%s; requests used=%s held=%s cents=%s',
                             c.used_credits, c.held_credits, c.used_cents,
                             coalesce(r.used, 0), coalesce(r.held, 0), coalesce(r.cents, 0))
      FROM llm.budget_counters AS c
      FULL JOIN (SELECT i.organization_id, k.scope, k.scope_id, k.budget_window, k.window_start,
                        sum(i.charged_credits) FILTER (WHERE i.status IN ('settled', 'failed')) AS used,
                        sum(i.hold_credits) FILTER (WHERE i.status IN ('reserved', 'dispatched')) AS held,
                        sum(coalesce(i.charged_cents, 0)) FILTER (WHERE i.status IN ('settled', 'failed')) AS cents
                   FROM llm.invocations AS i
                   JOIN llm.invocation_scopes AS s
                     ON s.organization_id = i.organization_id AND s.invocation_id = i.id
                  CROSS JOIN LATERAL llm._budget_keys(s.budget_mask, s.project, s.api_key,
                                                      s.end_user, i.created_at) AS k
                  WHERE s.budget_mask <> 0
                  GROUP BY 1, 2, 3, 4, 5) AS r
        ON r.organization_id = c.organization_id AND r.scope = c.scope
       AND r.scope_id IS NOT DISTINCT FROM c.scope_id AND r.budget_window = c.budget_window
       AND r.window_start = c.window_start
     WHERE (c.organization_id IS NULL AND r.held IS NOT NULL)
        OR (c.organization_id IS NOT NULL
            AND (c.used_credits, c.held_credits, c.used_cents)
                IS DISTINCT FROM (coalesce(r.used, 0), coalesce(r.held, 0), coalesce(r.cents, 0)));

    -- 15. a budget is a ceiling: used + held - overrun (as in 4) never exceeds the limit
    --     the counter's last admission was decided against; and that is the budget's
    --     limit now unless the budget was changed, replaced (own <-> '*') or removed
    --     since (another revision applies now)
    RETURN QUERY
    SELECT 15, c.organization_id,
           pg_catalog.format('budget %s %s %s %s', c.scope, coalesce(c.scope_id, ''), c.budget_window, c.window_start),
           pg_catalog.format('used=%s held=%s overrun=%s admitted_limit=%s limit now=%s (%s)',
                             c.used_credits, c.held_credits, coalesce(o.overrun, 0), c.admitted_limit,
                             coalesce(b.limit_credits::text, 'none'),
                             CASE WHEN b.revision = c.admitted_revision THEN 'unchanged since' ELSE 'changed since' END)
      FROM llm.budget_counters AS c
      LEFT JOIN (SELECT i.organization_id, k.scope, k.scope_id, k.budget_window, k.window_start,
                        sum(GREATEST(0, i.charged_credits - coalesce(i.recovered_credits, i.hold_credits))) AS overrun
                   FROM llm.invocations AS i
                   JOIN llm.invocation_scopes AS s
                     ON s.organization_id = i.organization_id AND s.invocation_id = i.id
                  CROSS JOIN LATERAL llm._budget_keys(s.budget_mask, s.project, s.api_key,
                                                      s.end_user, i.created_at) AS k
                  WHERE s.budget_mask <> 0 AND i.status IN ('settled', 'failed')
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
        OR (b.revision = c.admitted_revision AND b.limit_credits <> c.admitted_limit);
END
$$;
COMMENT ON FUNCTION llm.check_invariants() IS
    'Returns one row per violated invariant (docs/contract.md: held, used, ledger, admission, notices and alerts, task totals, task states, the period and task of every invocation, the current allowance, the sweeps'' totals, period findings, notice claims, drift findings, budget counters and budget ceilings); empty when the books are right.';
