-- The report's sections (`llm-db report`): what the operator reads of
-- the books, for some UTC days p_from .. p_to, as rows the client only renders.
--
-- Every function here only reads. p_organization_ids filters the organizations (NULL:
-- every organization), so none is a per-organization operation (docs/architecture.md "Citus
-- rules": those take p_organization_id first and are distributed); they run on the
-- coordinator like any report. SECURITY DEFINER so llm_reader and llm_operator need
-- only EXECUTE (sql/99_grants.sql), and p_now is the clock of anything timed.

-- 0.4.0 appended the cost (nanos, exact: cents * 10^7 plus what the book priced) to
-- the rows of these reports; a row type changes only by dropping the function, in the
-- transaction that creates it again (the driver names every column it reads, so an
-- earlier driver reads the same columns as before).
DROP FUNCTION IF EXISTS llm.report_periods(date, date, uuid[]);
DROP FUNCTION IF EXISTS llm.report_daily_usage(date, date, uuid[]);
DROP FUNCTION IF EXISTS llm.report_tasks(date, uuid[]);
DROP FUNCTION IF EXISTS llm.report_scope_usage(text, date, date, uuid[]);
DROP FUNCTION IF EXISTS llm.report_budgets_near_limit(text, uuid[], timestamptz);

CREATE OR REPLACE FUNCTION llm.report_periods(p_from date, p_to date, p_organization_ids uuid[] DEFAULT NULL)
RETURNS TABLE (organization_id uuid, name text, status text, period_start date, period_end date,
               allowance_credits bigint, used_credits bigint, held_credits bigint, used_cents bigint,
               used_cost_nanos numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_day_range(p_from, p_to);
    RETURN QUERY
    SELECT o.id, o.name, o.status, p.period_start, p.period_end,
           p.allowance_credits::bigint, p.used_credits::bigint, p.held_credits::bigint, p.used_cents::bigint,
           p.used_cost_nanos
      FROM llm.periods AS p
      JOIN llm.organizations AS o ON o.id = p.organization_id
     WHERE (p_organization_ids IS NULL OR p.organization_id = ANY (p_organization_ids))
       AND p.period_end > p_from
       AND p.period_start <= p_to
     ORDER BY o.name, o.id, p.period_start;
END
$$;
COMMENT ON FUNCTION llm.report_periods(date, date, uuid[]) IS
    'The periods overlapping days p_from .. p_to, with their organization: allowance, used, held, cents and used cost (nanos); by organization name and period.';

CREATE OR REPLACE FUNCTION llm.report_daily_usage(p_from date, p_to date, p_organization_ids uuid[] DEFAULT NULL)
RETURNS TABLE (day date, organization_id uuid, name text, model text, requests bigint,
               recovered_requests bigint, credits numeric, cents numeric, input_tokens numeric,
               output_tokens numeric, cost_nanos numeric, uncosted_requests bigint, fallback_requests bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_day_range(p_from, p_to);
    RETURN QUERY
    SELECT d.day, d.organization_id, o.name, d.model, d.requests, d.recovered_requests,
           d.credits::numeric, d.cents::numeric, d.input_tokens::numeric, d.output_tokens::numeric,
           d.cents::numeric * 10000000 + coalesce(d.priced_nanos, 0) + coalesce(d.corrections_nanos, 0),
           coalesce(d.uncosted_requests, 0), coalesce(d.fallback_requests, 0)
      FROM llm.daily_usage AS d
      JOIN llm.organizations AS o ON o.id = d.organization_id
     WHERE (p_organization_ids IS NULL OR d.organization_id = ANY (p_organization_ids))
       AND d.day BETWEEN p_from AND p_to
     ORDER BY d.day DESC, o.name, d.organization_id, d.model;
END
$$;
COMMENT ON FUNCTION llm.report_daily_usage(date, date, uuid[]) IS
    'The rows of llm.daily_usage for days p_from .. p_to (UTC settlement day), newest day first, with the organization''s name and the cost (nanos; uncosted_requests: in no cost, fallback_requests: priced at the fallback).';

-- The cost of days p_from .. p_to by organization and model, from llm.daily_usage (as
-- the daily section): exact nanos of the book's currency, never rounded, as corrected
-- by llm.reprice beside the cost first booked; a request
-- recovered at its estimate has no cost and is counted apart, as is one the book
-- priced at the fallback price.
CREATE OR REPLACE FUNCTION llm.report_costs(p_from date, p_to date, p_organization_ids uuid[] DEFAULT NULL)
RETURNS TABLE (organization_id uuid, name text, model text, currency text, requests numeric,
               cost_nanos numeric, original_cost_nanos numeric, uncosted_requests numeric,
               fallback_requests numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_day_range(p_from, p_to);
    RETURN QUERY
    SELECT d.organization_id, o.name, d.model, st.currency,
           sum(d.requests),
           sum(d.cents)::numeric * 10000000 + coalesce(sum(d.priced_nanos), 0) + coalesce(sum(d.corrections_nanos), 0),
           sum(d.cents)::numeric * 10000000 + coalesce(sum(d.priced_nanos), 0),
           coalesce(sum(d.uncosted_requests), 0),
           coalesce(sum(d.fallback_requests), 0)
      FROM llm.daily_usage AS d
      JOIN llm.organizations AS o ON o.id = d.organization_id
     CROSS JOIN llm.settings AS st
     WHERE (p_organization_ids IS NULL OR d.organization_id = ANY (p_organization_ids))
       AND d.day BETWEEN p_from AND p_to
     GROUP BY d.organization_id, o.name, d.model, st.currency
     ORDER BY o.name, d.organization_id, 6 DESC, d.model;
END
$$;
COMMENT ON FUNCTION llm.report_costs(date, date, uuid[]) IS
    'The cost of days p_from .. p_to (UTC settlement day) per organization and model, in exact nanos of the book''s currency: requests, cost (as corrected by llm.reprice) and the original cost, requests with no cost (recovered at their estimate) and requests priced at the fallback; dearest first.';

CREATE OR REPLACE FUNCTION llm.report_open_holds(p_organization_ids uuid[] DEFAULT NULL, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (organization_id uuid, name text, open_requests bigint, held_credits numeric,
               oldest_created_at timestamptz, past_window bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_clock(p_now);
    -- past_window: what the next pass recovers (of operational organizations)
    -- read by admission time from each organization's open floor (docs/architecture.md
    -- "The write path"): a report reads what is open, not the history
    RETURN QUERY
    SELECT i.organization_id, o.name,
           count(*),
           sum(i.hold_credits),
           min(i.created_at),
           count(*) FILTER (WHERE i.created_at <= coalesce(p_now, pg_catalog.now()) - s.recovery_window)
      FROM (SELECT f.organization_id,
                   min(CASE WHEN f.open_requests IS NULL THEN f.period_start::timestamp AT TIME ZONE 'UTC'
                            ELSE f.open_since END) AS floor
              FROM llm.period_stripes AS f
             WHERE f.quiet IS NOT TRUE AND (f.open_requests IS NULL OR f.open_requests > 0)
               AND (p_organization_ids IS NULL OR f.organization_id = ANY (p_organization_ids))
             GROUP BY f.organization_id) AS fl
      JOIN llm.invocations AS i ON i.organization_id = fl.organization_id AND i.created_at >= fl.floor
      JOIN llm.organizations AS o ON o.id = i.organization_id
     CROSS JOIN llm.settings AS s
     WHERE i.status IN ('reserved', 'dispatched')
     GROUP BY i.organization_id, o.name, s.recovery_window
     ORDER BY o.name, i.organization_id;
END
$$;
COMMENT ON FUNCTION llm.report_open_holds(uuid[], timestamptz) IS
    'Per organization, the requests still holding credits: how many, their holds, the oldest, and how many are older than the recovery window at p_now.';

CREATE OR REPLACE FUNCTION llm.report_tasks(p_from date, p_organization_ids uuid[] DEFAULT NULL)
RETURNS TABLE (organization_id uuid, name text, status text, tasks bigint, requests bigint,
               credits numeric, cents numeric, cost_nanos numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_day_range(p_from, p_from);  -- a finite day
    RETURN QUERY
    SELECT x.organization_id, o.name, x.status::text,
           count(*),
           sum(x.request_count)::bigint,
           sum(x.credits),
           sum(x.cents),
           sum(x.cents)::numeric * 10000000 + coalesce(sum(x.priced_nanos), 0)
      FROM llm.executions AS x
      JOIN llm.organizations AS o ON o.id = x.organization_id
     WHERE (p_organization_ids IS NULL OR x.organization_id = ANY (p_organization_ids))
       AND (x.status = 'running' OR x.started_at >= (p_from::timestamp AT TIME ZONE 'UTC'))
     GROUP BY x.organization_id, o.name, x.status
     ORDER BY o.name, x.organization_id, x.status;
END
$$;
COMMENT ON FUNCTION llm.report_tasks(date, uuid[]) IS
    'Per organization and status, the tasks started since day p_from (UTC) and every task still running: how many, and their requests, credits, cents and cost (nanos).';

CREATE OR REPLACE FUNCTION llm._check_report_scope(p_scope text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_scope IS NULL OR p_scope NOT IN ('project', 'api_key', 'end_user') THEN
        RAISE EXCEPTION 'llm: cannot report by scope %', coalesce(p_scope, 'NULL')
            USING ERRCODE = '22023', HINT = 'Report by project, api_key or end_user.';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_report_scope(text) IS
    'Raises 22023 unless p_scope is a scope a request names an id of: project, api_key or end_user.';

CREATE OR REPLACE FUNCTION llm.report_scope_usage(p_scope text, p_from date, p_to date,
                                                  p_organization_ids uuid[] DEFAULT NULL)
RETURNS TABLE (organization_id uuid, name text, scope_id text, requests bigint, open_requests bigint,
               used_credits numeric, held_credits numeric, used_cents numeric, used_cost_nanos numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_report_scope(p_scope);
    PERFORM llm._check_day_range(p_from, p_to);
    -- from the requests admitted in those days, so ids without a budget show too
    RETURN QUERY
    WITH scoped AS (
        SELECT i.organization_id, o.name, i.status, i.hold_credits, i.charged_credits, i.charged_cents,
               i.cost_nanos,
               CASE WHEN p_scope = 'project' THEN coalesce(i.project, s.project)
                    WHEN p_scope = 'api_key' THEN coalesce(i.api_key, s.api_key)
                    ELSE coalesce(i.end_user, s.end_user) END AS scope_id
          FROM llm.organizations AS o
          -- each organization's requests of those days (index invocations_created); the
          -- scope ids of a request of the previous release are beside it
          JOIN llm.invocations AS i ON i.organization_id = o.id
          LEFT JOIN llm.invocation_scopes AS s
            ON s.organization_id = i.organization_id AND s.invocation_id = i.id AND i.budget_mask IS NULL
         WHERE (p_organization_ids IS NULL OR o.id = ANY (p_organization_ids))
           AND i.created_at >= (p_from::timestamp AT TIME ZONE 'UTC')
           AND i.created_at < ((p_to + 1)::timestamp AT TIME ZONE 'UTC')
    )
    SELECT c.organization_id, c.name, c.scope_id,
           count(*),
           count(*) FILTER (WHERE c.status IN ('reserved', 'dispatched')),
           coalesce(sum(c.charged_credits) FILTER (WHERE c.status IN ('settled', 'failed')), 0),
           coalesce(sum(c.hold_credits) FILTER (WHERE c.status IN ('reserved', 'dispatched')), 0),
           coalesce(sum(c.charged_cents) FILTER (WHERE c.status IN ('settled', 'failed')), 0),
           coalesce(sum(c.charged_cents) FILTER (WHERE c.status IN ('settled', 'failed')), 0)::numeric * 10000000
               + coalesce(sum(c.cost_nanos), 0)
      FROM scoped AS c
     WHERE c.scope_id IS NOT NULL
     GROUP BY c.organization_id, c.name, c.scope_id
     ORDER BY c.name, c.organization_id, 6 DESC, c.scope_id;
END
$$;
COMMENT ON FUNCTION llm.report_scope_usage(text, date, date, uuid[]) IS
    'Usage per id of scope p_scope (project, api_key or end_user) of the requests admitted in days p_from .. p_to: requests, open ones, used, held, cents and used cost (nanos); 22023 for another scope.';

-- The counters of the windows containing p_now whose used + held stand at or above the
-- first threshold of the budget that applies to them now (the id's own, else the
-- scope's '*'), read from llm.budget_usage. A scan of llm.budget_counters (the
-- current windows are not indexed): fine for a report and a scrape.
CREATE OR REPLACE FUNCTION llm.report_budgets_near_limit(p_scope text DEFAULT NULL,
                                                         p_organization_ids uuid[] DEFAULT NULL,
                                                         p_now timestamptz DEFAULT NULL)
RETURNS TABLE (organization_id uuid, name text, scope text, scope_id text, budget_window text,
               window_start date, limit_credits bigint, first_threshold integer,
               used_credits bigint, held_credits bigint, used_cents bigint, used_cost_nanos numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
BEGIN
    PERFORM llm._check_clock(p_now);
    IF p_scope NOT IN ('organization', 'project', 'api_key', 'end_user') THEN
        RAISE EXCEPTION 'llm: no budget has scope %', p_scope
            USING ERRCODE = '22023', HINT = 'A budget''s scope is organization, project, api_key or end_user (NULL: every scope).';
    END IF;
    RETURN QUERY
    SELECT u.organization_id, o.name, u.scope, u.scope_id, u.budget_window, u.window_start,
           u.limit_credits, u.thresholds[1], u.used_credits, u.held_credits, u.used_cents, u.used_cost_nanos
      FROM llm.budget_usage AS u
      JOIN llm.organizations AS o ON o.id = u.organization_id
     WHERE (p_organization_ids IS NULL OR u.organization_id = ANY (p_organization_ids))
       AND (p_scope IS NULL OR u.scope = p_scope)
       AND u.window_start = pg_catalog.date_trunc(u.budget_window, v_now AT TIME ZONE 'UTC')::date
       -- no budget in force: a NULL limit, never near it
       AND (u.used_credits + u.held_credits)::numeric * 100 >= u.limit_credits::numeric * u.thresholds[1]
     ORDER BY o.name, u.organization_id, u.scope, u.scope_id, u.budget_window;
END
$$;
COMMENT ON FUNCTION llm.report_budgets_near_limit(text, uuid[], timestamptz) IS
    'The budget counters of the windows containing p_now at or above the first threshold of the budget that applies to them (used + held), for scope p_scope (NULL: every scope).';
