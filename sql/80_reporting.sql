-- Daily reporting: terminal invocations by UTC settlement day and model.
--
-- daily_usage is a cache of the requests, rebuilt by the pass one day at a time;
-- only a true-up writes it between rebuilds (llm._true_up_daily_usage, 35_settlement.sql).
-- The two never lose each other's work, whatever the interleaving:
-- a true-up adds its signed difference to the row a rebuild left, inserting the row
-- when the day has none yet, and a rebuild that meets a row a true-up inserted under
-- it rebuilds the day again. docs/architecture.md "Daily usage" says why no lock is shared.
--
-- No index of llm.invocations holds settled_at (a settlement changes no indexed column,
-- so it is a HOT update): the requests settled on some days are read by admission time,
-- per organization from the first day less its period stripes' settle lag to the last
-- day's end plus their settle lead, the stripes whose bounds reach those days found
-- through the index period_stripes_settled (docs/architecture.md "The write path";
-- llm._settle_window for one organization). Until the contract step of 0.4.0 counted
-- the bounds of the previous release's requests, any admission time.

CREATE OR REPLACE FUNCTION llm._check_day_range(p_from date, p_to date)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_from IS NULL OR p_to IS NULL OR NOT pg_catalog.isfinite(p_from) OR NOT pg_catalog.isfinite(p_to)
       OR p_to < p_from OR p_to - p_from > 3660 THEN
        RAISE EXCEPTION 'llm: invalid day range % .. %', p_from, p_to
            USING ERRCODE = '22023', HINT = 'Pass finite days p_from <= p_to, at most ten years apart.';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_day_range(date, date) IS
    'Raises 22023 unless p_from .. p_to is a range of finite days, in order, at most ten years long.';

-- The terminal requests settled on days p_from .. p_to (UTC), by organization, day and
-- model: what daily_usage holds when it is right. Read by admission time through the
-- stripes' settle bounds (the header says how); any admission time until they are known.
-- 0.4.0 appended the cost's columns: its row type changed, so it is created again
-- (rebuild_daily_usage and check_daily_usage, its only callers, with it).
DROP FUNCTION IF EXISTS llm._settled_usage(date, date);
CREATE FUNCTION llm._settled_usage(p_from date, p_to date)
RETURNS TABLE (organization_id uuid, day date, model text, requests bigint, recovered_requests bigint,
               credits numeric, cents numeric, input_tokens numeric, output_tokens numeric,
               priced_nanos numeric, uncosted_requests bigint, fallback_requests bigint,
               corrections_nanos numeric)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    -- the days whose settlements the settle bounds are applied to: any, until they are known
    v_known boolean := EXISTS (SELECT FROM llm.upgrade_steps AS u WHERE u.step = 'settle_bounds');
    v_first date := CASE WHEN v_known THEN p_from ELSE '-infinity' END;
    v_last date := CASE WHEN v_known THEN p_to ELSE 'infinity' END;
BEGIN
    -- Each organization's requests read by their index range (invocations_created), in a
    -- LATERAL subquery kept whole (OFFSET 0: not pulled up into a join), so the rebuild
    -- reads what its days can hold, never the history. Joined plainly, the planner chose
    -- by the statistics: a hash join over the whole table, or, with statistics taken
    -- before a pass settled the day's requests, the whole table once per organization
    -- (6.4 s for 100,000 requests of 500 organizations, in the recovery benchmark).
    RETURN QUERY
    SELECT i.organization_id, (i.settled_at AT TIME ZONE 'UTC')::date, i.model,
           count(*),
           count(*) FILTER (WHERE i.settlement_kind IN ('recovered', 'trued_up')),
           coalesce(sum(i.charged_credits), 0),
           coalesce(sum(i.charged_cents), 0),
           coalesce(sum(i.input_tokens), 0),
           coalesce(sum(i.output_tokens), 0),
           coalesce(sum(i.cost_nanos), 0),
           count(*) FILTER (WHERE i.charged_cents IS NULL AND i.cost_nanos IS NULL),
           count(*) FILTER (WHERE i.priced_by = 'fallback'),
           coalesce(sum(k.corrections), 0)
      FROM (SELECT s.organization_id,
                   min(GREATEST(s.period_start::timestamp,
                                v_first::timestamp - pg_catalog.make_interval(hours => coalesce(s.settle_lag_hours, 0))))
                       AT TIME ZONE 'UTC' AS created_from,
                   max(LEAST(s.period_start + interval '1 month',
                             (v_last + 1)::timestamp + pg_catalog.make_interval(hours => coalesce(s.settle_lead_hours, 0))))
                       AT TIME ZONE 'UTC' AS created_to
              FROM llm.period_stripes AS s
             WHERE (s.period_start + 32 + (coalesce(s.settle_lag_hours, 0) + 23) / 24) >= v_first
               AND s.period_start - (coalesce(s.settle_lead_hours, 0) + 23) / 24 <= v_last
             GROUP BY s.organization_id) AS w
     CROSS JOIN LATERAL (
           SELECT r.organization_id, r.settled_at, r.model, r.settlement_kind, r.charged_credits,
                  r.charged_cents, r.input_tokens, r.output_tokens, r.cost_nanos,
                  r.priced_by, r.id
             FROM llm.invocations AS r
            WHERE r.organization_id = w.organization_id
              AND r.created_at >= w.created_from AND r.created_at < w.created_to
              AND r.settled_at >= (p_from::timestamp AT TIME ZONE 'UTC')
              AND r.settled_at < ((p_to + 1)::timestamp AT TIME ZONE 'UTC')
           OFFSET 0) AS i
      -- the corrections llm.reprice applied to them
      LEFT JOIN (SELECT c.organization_id, c.invocation_id, sum(c.difference_nanos) AS corrections
                   FROM llm.cost_corrections AS c
                  GROUP BY 1, 2) AS k
        ON k.organization_id = i.organization_id AND k.invocation_id = i.id
     GROUP BY 1, 2, 3;
END
$$;
COMMENT ON FUNCTION llm._settled_usage(date, date) IS
    'The terminal requests settled on UTC days p_from .. p_to by organization, day and model (requests, recovered_requests, credits, cents, tokens, the cost the book priced, the requests with no cost, those priced by the fallback and the corrections of repricing): what daily_usage holds when it is right.';

CREATE OR REPLACE FUNCTION llm.rebuild_daily_usage(p_from date, p_to date)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_rows bigint;
    v_count integer;
BEGIN
    PERFORM llm._check_day_range(p_from, p_to);
    -- one rebuild at a time (the pass's and a tool's): two would insert the same rows
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('llm.rebuild_daily_usage'));
    FOR v_attempt IN 1 .. 3 LOOP
        -- A true-up committing under this DELETE is seen by the INSERT (a later
        -- statement, so a later snapshot); one that waits on a row deleted here
        -- adds to the row inserted here (llm._true_up_daily_usage).
        DELETE FROM llm.daily_usage AS d WHERE d.day BETWEEN p_from AND p_to;
        -- A row the INSERT meets was inserted by a true-up of a day not built yet after
        -- the DELETE looked. It is skipped, not raised: Citus reports a shard's 23505 as
        -- XX000, which no handler can tell from any other fault (docs/scaling.md). The
        -- rows inserted and the rows computed, through RETURNING (FOUND and ROW_COUNT
        -- count skipped rows on Citus), tell whether one was.
        WITH u AS MATERIALIZED (
            SELECT * FROM llm._settled_usage(p_from, p_to)
        ), inserted AS (
            INSERT INTO llm.daily_usage
                   (organization_id, day, model, requests, recovered_requests, credits, cents,
                    input_tokens, output_tokens, priced_nanos, uncosted_requests, fallback_requests,
                    corrections_nanos)
            SELECT u.* FROM u
            ON CONFLICT (organization_id, day, model) DO NOTHING
            RETURNING 1)
        SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM inserted) INTO v_rows, v_count;
        EXIT WHEN v_count = v_rows;
        -- the true-up's request is committed now, so the next attempt deletes its row
        -- and counts it
        IF v_attempt = 3 THEN
            RAISE EXCEPTION 'llm: daily usage of % .. % met a row inserted by a true-up in each of three attempts', p_from, p_to
                USING ERRCODE = '40001',
                      HINT = 'Rebuild the days again (the next pass does).';
        END IF;
    END LOOP;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION llm.rebuild_daily_usage(date, date) IS
    'Recomputes daily_usage for days p_from .. p_to (UTC settlement day) from the invocations; idempotent; a concurrent true-up is never lost; returns the rows written.';

-- Both sides of each day as one jsonb object per model, compared whole: a missing,
-- extra or wrong row of any model shows on the day.
CREATE OR REPLACE FUNCTION llm.check_daily_usage(p_from date, p_to date)
RETURNS TABLE (organization_id uuid, day date, recorded jsonb, computed jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_day_range(p_from, p_to);
    -- Not an invariant: a settlement after the pass rebuilt its day is legal until the
    -- next rebuild. With no traffic after a pass, every day it rebuilt must agree.
    RETURN QUERY
    WITH recorded AS (
        SELECT d.organization_id, d.day,
               pg_catalog.jsonb_object_agg(d.model, pg_catalog.jsonb_build_object(
                   'requests', d.requests, 'recovered_requests', d.recovered_requests,
                   'credits', d.credits, 'cents', d.cents,
                   'input_tokens', d.input_tokens, 'output_tokens', d.output_tokens,
                   'priced_nanos', coalesce(d.priced_nanos, 0), 'uncosted_requests', coalesce(d.uncosted_requests, 0),
                   'fallback_requests', coalesce(d.fallback_requests, 0),
                   'corrections_nanos', coalesce(d.corrections_nanos, 0))) AS usage
          FROM llm.daily_usage AS d
         WHERE d.day BETWEEN p_from AND p_to
         GROUP BY d.organization_id, d.day
    ), by_model AS (
        SELECT u.* FROM llm._settled_usage(p_from, p_to) AS u
    ), computed AS (
        SELECT m.organization_id, m.day,
               pg_catalog.jsonb_object_agg(m.model, pg_catalog.jsonb_build_object(
                   'requests', m.requests, 'recovered_requests', m.recovered_requests,
                   'credits', m.credits, 'cents', m.cents,
                   'input_tokens', m.input_tokens, 'output_tokens', m.output_tokens,
                   'priced_nanos', m.priced_nanos, 'uncosted_requests', m.uncosted_requests,
                   'fallback_requests', m.fallback_requests,
                   'corrections_nanos', m.corrections_nanos)) AS usage
          FROM by_model AS m
         GROUP BY m.organization_id, m.day
    )
    SELECT coalesce(r.organization_id, c.organization_id), coalesce(r.day, c.day),
           coalesce(r.usage, '{}'::jsonb), coalesce(c.usage, '{}'::jsonb)
      FROM recorded AS r
      FULL JOIN computed AS c ON c.organization_id = r.organization_id AND c.day = r.day
     WHERE r.usage IS DISTINCT FROM c.usage
     ORDER BY 2, 1;
END
$$;
COMMENT ON FUNCTION llm.check_daily_usage(date, date) IS
    'One row per organization and UTC day of p_from .. p_to whose daily_usage rows differ from its terminal requests: recorded (the rows) and computed (from the requests), each a jsonb object by model; empty when they agree.';
