-- Daily reporting: terminal invocations by UTC settlement day and model.

CREATE OR REPLACE FUNCTION llm.rebuild_daily_usage(p_from date, p_to date)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_count integer;
BEGIN
    IF p_from IS NULL OR p_to IS NULL OR NOT pg_catalog.isfinite(p_from) OR NOT pg_catalog.isfinite(p_to)
       OR p_to < p_from OR p_to - p_from > 3660 THEN
        RAISE EXCEPTION 'llm: invalid day range % .. %', p_from, p_to
            USING ERRCODE = '22023', HINT = 'Pass finite days p_from <= p_to, at most ten years apart.';
    END IF;
    -- one rebuild at a time (the pass's and a tool's): two would insert the same rows (23505)
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('llm.rebuild_daily_usage'));
    DELETE FROM llm.daily_usage AS d WHERE d.day BETWEEN p_from AND p_to;
    INSERT INTO llm.daily_usage
           (organization_id, day, model, requests, recovered_requests, credits, cents,
            input_tokens, output_tokens)
    SELECT i.organization_id, (i.settled_at AT TIME ZONE 'UTC')::date, i.model,
           count(*),
           count(*) FILTER (WHERE i.settlement_kind IN ('recovered', 'trued_up')),
           coalesce(sum(i.charged_credits), 0),
           coalesce(sum(i.charged_cents), 0),
           coalesce(sum(i.input_tokens), 0),
           coalesce(sum(i.output_tokens), 0)
      FROM llm.invocations AS i
     WHERE i.settled_at >= (p_from::timestamp AT TIME ZONE 'UTC')
       AND i.settled_at < ((p_to + 1)::timestamp AT TIME ZONE 'UTC')
     GROUP BY 1, 2, 3;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION llm.rebuild_daily_usage(date, date) IS
    'Recomputes daily_usage for days p_from .. p_to (UTC settlement day) from the invocations; idempotent; returns the rows written.';
