-- The books at a glance: what `llm-db metrics` exposes, what the demo
-- and `llm-db reconcile --progress` read, as rows the client only renders.
--
-- Only reads; p_organization_ids filters the organizations (NULL: every one), so none
-- is a per-organization operation (docs/architecture.md "Citus rules"). SECURITY DEFINER so
-- llm_reader and llm_operator need only EXECUTE (sql/99_grants.sql).

-- Cheap on a large database, so a scrape can run it: the open requests are counted on
-- the period stripes that are not quiet (index period_stripes_open; docs/architecture.md
-- "The write path"), their stale share read by admission time from each organization's
-- open floor to the recovery window (and those of a stripe whose count is not known
-- yet, from its period's first day); the running tasks and owed / sending notices are
-- read over partial indexes, the drift findings are a small table.
CREATE OR REPLACE FUNCTION llm.books_snapshot(p_organization_ids uuid[] DEFAULT NULL, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (open_requests bigint, held_credits numeric, stale_open_requests bigint,
               stale_held_credits numeric, running_tasks bigint, stale_running_tasks bigint,
               drift_findings bigint, notices_owed bigint, notices_sending bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
DECLARE
    v_stale_before timestamptz;
BEGIN
    PERFORM llm._check_clock(p_now);
    v_stale_before := coalesce(p_now, pg_catalog.now()) - (llm._settings()).recovery_window;
    RETURN QUERY
    SELECT i.open_requests, i.held_credits, i.stale_open_requests, i.stale_held_credits,
           x.running_tasks, x.stale_running_tasks,
           (SELECT count(*) FROM llm.drift_findings AS f
             WHERE p_organization_ids IS NULL OR f.organization_id = ANY (p_organization_ids)),
           n.owed, n.sending
      FROM (SELECT coalesce(sum(k.n), 0)::bigint AS open_requests, coalesce(sum(k.held), 0) AS held_credits,
                   coalesce(sum(k.stale_n), 0)::bigint AS stale_open_requests,
                   coalesce(sum(k.stale_held), 0) AS stale_held_credits
              FROM (-- the stripes whose open requests are counted
                    SELECT sum(s.open_requests) AS n, sum(s.held_credits) AS held, 0 AS stale_n, 0 AS stale_held
                      FROM llm.period_stripes AS s
                     WHERE s.quiet IS NOT TRUE AND s.open_requests > 0
                       AND (p_organization_ids IS NULL OR s.organization_id = ANY (p_organization_ids))
                    UNION ALL
                    -- the open requests of stripes not counted yet (a period of the previous
                    -- release until the contract step of 0.4.0)
                    SELECT count(*), sum(r.hold_credits), 0, 0
                      FROM llm.period_stripes AS u
                      JOIN llm.invocations AS r
                        ON r.organization_id = u.organization_id AND r.period_start = u.period_start
                       AND r.stripe = u.stripe
                       AND r.created_at >= (u.period_start::timestamp AT TIME ZONE 'UTC')
                       AND r.created_at < ((u.period_start + interval '1 month') AT TIME ZONE 'UTC')
                     WHERE u.quiet IS NOT TRUE AND u.open_requests IS NULL
                       AND r.status IN ('reserved', 'dispatched')
                       AND (p_organization_ids IS NULL OR u.organization_id = ANY (p_organization_ids))
                    UNION ALL
                    -- the stale ones, from each organization's open floor
                    SELECT 0, 0, count(*), sum(r.hold_credits)
                      FROM llm._open_floors AS o
                      JOIN llm.invocations AS r
                        ON r.organization_id = o.organization_id
                       AND r.created_at >= o.floor AND r.created_at <= v_stale_before
                     WHERE r.status IN ('reserved', 'dispatched')
                       AND (p_organization_ids IS NULL OR o.organization_id = ANY (p_organization_ids))) AS k) AS i
     CROSS JOIN
           (SELECT count(*) AS running_tasks,
                   count(*) FILTER (WHERE t.started_at <= v_stale_before) AS stale_running_tasks
              FROM llm.executions AS t
             WHERE t.status = 'running'
               AND (p_organization_ids IS NULL OR t.organization_id = ANY (p_organization_ids))) AS x
     CROSS JOIN
           (SELECT count(*) FILTER (WHERE m.status = 'owed') AS owed,
                   count(*) FILTER (WHERE m.status = 'sending') AS sending
              FROM llm.threshold_notices AS m
             WHERE m.status IN ('owed', 'sending')
               AND (p_organization_ids IS NULL OR m.organization_id = ANY (p_organization_ids))) AS n;
END
$$;
COMMENT ON FUNCTION llm.books_snapshot(uuid[], timestamptz) IS
    'One row: what the next pass would act on at p_now: open requests and holds (all, and older than the recovery window), running tasks (all, and stale), drift findings, owed and sending notices.';

CREATE OR REPLACE FUNCTION llm.stale_by_organization_status(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (organization_status text, stale_open_requests bigint, stale_held_credits numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
DECLARE
    v_stale_before timestamptz;
BEGIN
    PERFORM llm._check_clock(p_now);
    -- read before the query: under Citus a function reading a table inside a
    -- multi-shard query runs on the shards, where it cannot (docs/scaling.md)
    v_stale_before := coalesce(p_now, pg_catalog.now()) - (llm._settings()).recovery_window;
    -- operational organizations' the next pass recovers; the others' no pass visits
    RETURN QUERY
    SELECT s.status, coalesce(i.requests, 0), coalesce(i.credits, 0::numeric)
      FROM pg_catalog.unnest(ARRAY['operational', 'suspended', 'closed']) WITH ORDINALITY AS s(status, n)
      LEFT JOIN (SELECT o.status, count(*) AS requests, sum(r.hold_credits) AS credits
                   FROM llm._open_floors AS fl  -- read from each organization's open floor
                   JOIN llm.invocations AS r
                     ON r.organization_id = fl.organization_id
                    AND r.created_at >= fl.floor AND r.created_at <= v_stale_before
                   JOIN llm.organizations AS o ON o.id = r.organization_id
                  WHERE r.status IN ('reserved', 'dispatched')
                  GROUP BY o.status) AS i ON i.status = s.status
     ORDER BY s.n;
END
$$;
COMMENT ON FUNCTION llm.stale_by_organization_status(timestamptz) IS
    'Per organization status (operational, suspended, closed: every one, 0 when none), the open requests older than the recovery window at p_now and their holds.';

-- What every sweep ever did (llm.sweep_totals keeps it per organization) and the
-- period findings still open: the monotonic counters of the exposition.
-- Two aggregates joined, not a scalar subquery beside the aggregates, which Citus
-- cannot push down (docs/scaling.md).
CREATE OR REPLACE VIEW llm.sweep_summary AS
SELECT t.recovered_requests, t.recovered_uncharged, t.past_window_alerts, f.period_findings
  FROM (SELECT coalesce(sum(s.recovered_requests), 0)::bigint AS recovered_requests,
               coalesce(sum(s.recovered_uncharged), 0)::bigint AS recovered_uncharged,
               coalesce(sum(s.past_window_alerts), 0)::bigint AS past_window_alerts
          FROM llm.sweep_totals AS s) AS t
 CROSS JOIN (SELECT count(*) AS period_findings
               FROM llm.period_findings AS p WHERE p.resolved_at IS NULL) AS f;
COMMENT ON VIEW llm.sweep_summary IS
    'One row: requests recovered (and of them, charged nothing) and past-window alerts by every sweep, ever, and the period findings not yet resolved.';

-- These scan the organizations' rows: for a handful of organizations (the demo).
CREATE OR REPLACE FUNCTION llm.books_history(p_organization_ids uuid[])
RETURNS TABLE (recovered_requests bigint, past_window_alerts bigint, abandoned_tasks bigint,
               notices_sent bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN QUERY
    SELECT (SELECT count(*) FROM llm.invocations AS i
             WHERE i.organization_id = ANY (p_organization_ids) AND i.settlement_kind = 'recovered'),
           (SELECT count(*) FROM llm.invocations AS i
             WHERE i.organization_id = ANY (p_organization_ids) AND i.past_window_alerted_at IS NOT NULL),
           (SELECT count(*) FROM llm.executions AS x
             WHERE x.organization_id = ANY (p_organization_ids) AND x.status = 'abandoned'),
           (SELECT count(*) FROM llm.threshold_notices AS n
             WHERE n.organization_id = ANY (p_organization_ids) AND n.status = 'sent');
END
$$;
COMMENT ON FUNCTION llm.books_history(uuid[]) IS
    'One row: requests recovered, past-window alerts, tasks abandoned and notices sent, ever, for these organizations (a scan of their rows).';

CREATE OR REPLACE FUNCTION llm.organization_totals(p_organization_ids uuid[])
RETURNS TABLE (organization_id uuid, name text, status text, allowance_credits bigint,
               used_credits numeric, held_credits numeric, used_cents numeric, notices bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN QUERY
    SELECT o.id, o.name, o.status, o.monthly_allowance_credits,
           coalesce(p.used_credits, 0::numeric), coalesce(p.held_credits, 0::numeric),
           coalesce(p.used_cents, 0::numeric),
           (SELECT count(*) FROM llm.threshold_notices AS n WHERE n.organization_id = o.id)
      FROM llm.organizations AS o
      LEFT JOIN (SELECT q.organization_id, sum(q.used_credits) AS used_credits,
                        sum(q.held_credits) AS held_credits, sum(q.used_cents) AS used_cents
                   FROM llm.periods AS q
                  WHERE q.organization_id = ANY (p_organization_ids)
                  GROUP BY q.organization_id) AS p ON p.organization_id = o.id
     WHERE o.id = ANY (p_organization_ids)
     ORDER BY o.name, o.id;
END
$$;
COMMENT ON FUNCTION llm.organization_totals(uuid[]) IS
    'Per organization of p_organization_ids: its allowance, the sums over its periods (used, held, cents) and its threshold notices.';

-- The newest finished pass that was not skipped (the one health judges), with its age
-- on the pass's own clock, as llm.reconciliation_health computes it; no row before
-- the first pass.
CREATE OR REPLACE FUNCTION llm.last_run(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (id uuid, started_at timestamptz, finished_at timestamptz, clock timestamptz, status text,
               orgs_visited integer, orgs_failed integer, requests_recovered bigint,
               released_hold_credits numeric, past_window_alerts bigint, executions_abandoned bigint,
               drift_findings bigint, notices_rearmed bigint, daily_rows_rebuilt bigint,
               more_pending_orgs integer, errors jsonb, recovered_uncharged bigint, period_findings bigint,
               daily_rebuilt_through date, duration_seconds double precision, age_seconds double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_clock(p_now);
    RETURN QUERY
    SELECT r.id, r.started_at, r.finished_at, r.clock, r.status, r.orgs_visited, r.orgs_failed,
           r.requests_recovered, r.released_hold_credits::numeric, r.past_window_alerts, r.executions_abandoned,
           r.drift_findings, r.notices_rearmed, r.daily_rows_rebuilt, r.more_pending_orgs, r.errors,
           r.recovered_uncharged, r.period_findings, r.daily_rebuilt_through,
           pg_catalog.date_part('epoch', r.finished_at - r.started_at),
           pg_catalog.date_part('epoch', coalesce(p_now, pg_catalog.now()) - (r.clock + (r.finished_at - r.started_at)))
      FROM llm.reconciliation_runs AS r
     WHERE r.finished_at IS NOT NULL AND r.status <> 'skipped'
     ORDER BY r.clock DESC, r.started_at DESC
     LIMIT 1;
END
$$;
COMMENT ON FUNCTION llm.last_run(timestamptz) IS
    'The newest finished pass that was not skipped (its llm.reconciliation_runs figures), how long it took and its age at p_now on the pass''s clock, in seconds; no row before the first pass.';

-- How far a pass has got: it commits after each organization.
CREATE OR REPLACE FUNCTION llm.pass_progress(p_since timestamptz)
RETURNS TABLE (organizations bigint, orgs_visited integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN QUERY
    SELECT (SELECT count(*) FROM llm.organizations AS o WHERE o.status = 'operational'),
           (SELECT r.orgs_visited FROM llm.reconciliation_runs AS r
             WHERE r.started_at >= p_since AND r.status = 'running'
             ORDER BY r.started_at DESC LIMIT 1);
END
$$;
COMMENT ON FUNCTION llm.pass_progress(timestamptz) IS
    'One row: the operational organizations (what a pass visits) and the organizations visited so far by the pass running since p_since (NULL: none running).';

-- The pass's series of the exposition: the health alarm and the last run. Before the
-- first pass every last-run series is present and 0 (docs/monitoring.md).
CREATE OR REPLACE FUNCTION llm._pass_metrics(p_now timestamptz)
RETURNS TABLE (metric text, labels jsonb, value double precision)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_health record;
    v_run jsonb;
BEGIN
    SELECT h.status, h.last_success_at INTO v_health FROM llm.reconciliation_health(p_now) AS h;
    SELECT pg_catalog.to_jsonb(r) INTO v_run FROM llm.last_run(p_now) AS r;
    RETURN QUERY
    SELECT 'llm_reconciliation_health', pg_catalog.jsonb_build_object('status', s.status),
           (v_health.status = s.status)::integer::double precision
      FROM pg_catalog.unnest(ARRAY['ok', 'late', 'never', 'failing']) AS s(status);
    RETURN QUERY
    SELECT 'llm_reconciliation_last_success_timestamp_seconds', '{}'::jsonb,
           coalesce(pg_catalog.date_part('epoch', v_health.last_success_at), 0);
    RETURN QUERY
    SELECT 'llm_reconciliation_last_run_status', pg_catalog.jsonb_build_object('status', s.status),
           (v_run ->> 'status' IS NOT DISTINCT FROM s.status)::integer::double precision
      FROM pg_catalog.unnest(ARRAY['succeeded', 'partial', 'failed']) AS s(status);
    RETURN QUERY
    SELECT 'llm_reconciliation_last_run_errors', '{}'::jsonb,
           coalesce(pg_catalog.jsonb_array_length(v_run -> 'errors'), 0)::double precision;
    -- the run's figures, and when it finished, how long ago and for how long
    RETURN QUERY
    SELECT 'llm_reconciliation_last_run_' || f.figure, '{}'::jsonb,
           coalesce(CASE WHEN f.figure = 'timestamp_seconds'
                        THEN pg_catalog.date_part('epoch', (v_run ->> 'finished_at')::timestamptz)
                        ELSE (v_run ->> f.figure)::double precision END, 0)
      FROM pg_catalog.unnest(ARRAY['timestamp_seconds', 'age_seconds', 'duration_seconds',
               'orgs_visited', 'orgs_failed', 'requests_recovered', 'released_hold_credits',
               'past_window_alerts', 'executions_abandoned', 'drift_findings', 'notices_rearmed',
               'daily_rows_rebuilt', 'more_pending_orgs', 'recovered_uncharged', 'period_findings']) AS f(figure);
END
$$;
COMMENT ON FUNCTION llm._pass_metrics(timestamptz) IS
    'The series of llm.metrics about the pass at p_now: the health alarm by status, the last success, and the last run''s status, errors, figures, finish, age and duration (0 before the first pass).';

-- Every series of the Prometheus exposition (`llm-db metrics`, the worker's /metrics)
-- at p_now: one row per series, named as exposed, its labels a jsonb object; every
-- series present, 0 when there is nothing to count. The client adds HELP and TYPE and
-- its own llm_up and scrape duration.
-- The operational organizations whose period containing p_now has used + held at or
-- above the first threshold of their allowance (none without an allowance or a list).
CREATE OR REPLACE FUNCTION llm._allowances_near_limit(p_now timestamptz)
RETURNS TABLE (organization_id uuid, allowance bigint, committed numeric)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT p.organization_id, p.allowance_credits::bigint, p.used_credits::numeric + p.held_credits
      FROM llm.periods AS p
      JOIN llm.organizations AS o ON o.id = p.organization_id
     WHERE p.period_start = pg_catalog.date_trunc('month', p_now AT TIME ZONE 'UTC')::date
       AND p.allowance_credits > 0 AND pg_catalog.cardinality(o.notice_thresholds) > 0
       AND (p.used_credits::numeric + p.held_credits) * 100
           >= p.allowance_credits::numeric * o.notice_thresholds[1];
END
$$;
COMMENT ON FUNCTION llm._allowances_near_limit(timestamptz) IS
    'The organizations whose period containing p_now stands (used + held) at or above the first of their notice thresholds: the allowance near its limit.';

-- What the month containing p_now cost, by model, as llm.daily_usage holds it (the
-- pass rebuilds it): cents * 10^7 plus the book's nanos, as corrected; and the requests
-- the book priced at the fallback price. A sample is a float64, exact to 2^53 nanos
-- (about 9 million currency units); `llm-db report` has the exact figure.
CREATE OR REPLACE FUNCTION llm._cost_metrics(p_now timestamptz)
RETURNS TABLE (metric text, labels jsonb, value double precision)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT f.metric, pg_catalog.jsonb_build_object('model', c.model), f.value
      FROM (SELECT d.model,
                   sum(d.cents)::numeric * 10000000 + coalesce(sum(d.priced_nanos), 0)
                       + coalesce(sum(d.corrections_nanos), 0) AS cost,
                   coalesce(sum(d.fallback_requests), 0) AS fallback
              FROM llm.daily_usage AS d
             WHERE d.day >= pg_catalog.date_trunc('month', p_now AT TIME ZONE 'UTC')::date
               AND d.day <= (p_now AT TIME ZONE 'UTC')::date
             GROUP BY d.model) AS c
     CROSS JOIN LATERAL (VALUES ('llm_month_cost_nanos', c.cost::double precision),
                                ('llm_month_fallback_priced_requests', c.fallback::double precision))
                        AS f(metric, value)
     ORDER BY f.metric, c.model;
END
$$;
COMMENT ON FUNCTION llm._cost_metrics(timestamptz) IS
    'The series of llm.metrics about cost at p_now: the cost of the month''s settled requests by model (nanos, as repriced) and the requests priced at the fallback, from llm.daily_usage.';

CREATE OR REPLACE FUNCTION llm.metrics(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (metric text, labels jsonb, value double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
DECLARE
    v_books jsonb;  -- the figures of llm.books_snapshot and llm.sweep_summary, by name
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
    v_allowances bigint;
BEGIN
    PERFORM llm._check_clock(p_now);
    SELECT pg_catalog.to_jsonb(b) || pg_catalog.to_jsonb(t) INTO v_books
      FROM llm.books_snapshot(NULL, p_now) AS b CROSS JOIN llm.sweep_summary AS t;
    RETURN QUERY SELECT m.metric, m.labels, m.value FROM llm._pass_metrics(p_now) AS m;
    -- what the next pass would act on, and what every sweep did (counters)
    RETURN QUERY
    SELECT f.metric, f.labels, (v_books ->> f.figure)::double precision
      FROM (VALUES ('llm_open_requests', '{}'::jsonb, 'open_requests'),
                   ('llm_open_hold_credits', '{}', 'held_credits'),
                   ('llm_running_tasks', '{}', 'running_tasks'),
                   ('llm_stale_running_tasks', '{}', 'stale_running_tasks'),
                   ('llm_drift_findings', '{}', 'drift_findings'),
                   ('llm_notices', '{"status": "owed"}', 'notices_owed'),
                   ('llm_notices', '{"status": "sending"}', 'notices_sending'),
                   ('llm_period_findings', '{}', 'period_findings'),
                   ('llm_recovered_requests_total', '{}', 'recovered_requests'),
                   ('llm_recovered_uncharged_requests_total', '{}', 'recovered_uncharged'),
                   ('llm_past_window_alerts_total', '{}', 'past_window_alerts')) AS f(metric, labels, figure);
    RETURN QUERY
    SELECT f.metric, pg_catalog.jsonb_build_object('organization_status', s.organization_status), f.value
      FROM llm.stale_by_organization_status(p_now) AS s
     CROSS JOIN LATERAL (VALUES ('llm_stale_open_requests', s.stale_open_requests::double precision),
                                ('llm_stale_open_hold_credits', s.stale_held_credits::double precision))
                        AS f(metric, value);
    -- Near their limit, by scope and window (every pair present): the budgets' counters
    -- of the windows containing p_now, and under organization/month the allowances of the
    -- periods containing it, each at or above its first threshold (used + held).
    SELECT count(*) INTO v_allowances FROM llm._allowances_near_limit(v_now) AS a;
    RETURN QUERY
    SELECT 'llm_budgets_near_limit', pg_catalog.jsonb_build_object('scope', sc.scope, 'window', w.budget_window),
           (count(n.scope) + CASE WHEN sc.scope = 'organization' AND w.budget_window = 'month'
                                  THEN v_allowances ELSE 0 END)::double precision
      FROM pg_catalog.unnest(ARRAY['organization', 'project', 'api_key', 'end_user'])
           WITH ORDINALITY AS sc(scope, n)
     CROSS JOIN pg_catalog.unnest(ARRAY['day', 'week', 'month']) WITH ORDINALITY AS w(budget_window, n)
      LEFT JOIN llm.report_budgets_near_limit(NULL, NULL, p_now) AS n
        ON n.scope = sc.scope AND n.budget_window = w.budget_window
     GROUP BY sc.n, sc.scope, w.n, w.budget_window
     ORDER BY sc.n, w.n;
    -- Limit windows that refused, by scope and window (every pair present): one
    -- limit_reached notice (threshold 0) per limit and window, owed by note_refusal
    RETURN QUERY
    SELECT 'llm_admission_refusals_total', pg_catalog.jsonb_build_object('scope', sc.scope, 'window', w.budget_window),
           count(n.organization_id)::double precision
      FROM pg_catalog.unnest(ARRAY['organization', 'project', 'api_key', 'end_user'])
           WITH ORDINALITY AS sc(scope, n)
     CROSS JOIN pg_catalog.unnest(ARRAY['day', 'week', 'month']) WITH ORDINALITY AS w(budget_window, n)
      LEFT JOIN llm.threshold_notices AS n
        ON n.scope = sc.scope AND n.budget_window = w.budget_window AND n.threshold_pct = 0
     GROUP BY sc.n, sc.scope, w.n, w.budget_window
     ORDER BY sc.n, w.n;
    RETURN QUERY SELECT m.metric, m.labels, m.value FROM llm._cost_metrics(v_now) AS m;
    -- How much of its allowance each organization near its limit has committed
    RETURN QUERY
    SELECT 'llm_allowance_used_ratio', pg_catalog.jsonb_build_object('organization_id', a.organization_id::text),
           (a.committed::numeric / a.allowance)::double precision
      FROM llm._allowances_near_limit(v_now) AS a
     ORDER BY a.organization_id;
END
$$;
COMMENT ON FUNCTION llm.metrics(timestamptz) IS
    'Every series of the Prometheus exposition at p_now (metric, labels, value): the health alarm, the last pass, what the next pass would act on, the stale requests by organization status, budgets near their limit, the limit windows that refused, the month''s cost and fallback-priced requests by model, and the sweeps'' totals; every series present, 0 when none.';
