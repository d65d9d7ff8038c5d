-- Repricing (docs/architecture.md "The price book"): a price corrected after the fact
-- (a provider's correction, a negotiated rate signed late) applied to the requests the
-- book priced from usage. A request is never edited: each correction is an entry of
-- llm.cost_corrections, and the cost sums (its task, its period stripe, its budget
-- counters, its day) move by the entry's difference; the credits stay as charged.
--
-- Locks in the order of docs/architecture.md "Lock order": the public routine first takes the
-- daily rebuild's lock, so that a rebuild either ran before (its rows are moved here)
-- or reads the corrections after this commits; then, per organization, its requests
-- and, when their cost changes, its sweep lock.

-- One organization's requests of p_model admitted in [p_from, p_to) and priced from
-- usage, at version p_version (an organization's own version: all of them; a book
-- version: those pinned to a book version): how many, their cost as already corrected
-- and their cost at p_version. With p_apply, a correction per request whose cost
-- changes, and every sum moved by it. One per-organization table per statement
-- (docs/architecture.md "Citus rules" 9). Long on purpose: one movement, read top to
-- bottom in lock order.
CREATE OR REPLACE FUNCTION llm._reprice_org(
    p_organization_id uuid, p_model text, p_from timestamptz, p_to timestamptz, p_version_id bigint,
    p_apply boolean, OUT requests bigint, OUT cost_before_nanos numeric, OUT cost_after_nanos numeric)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_version llm.price_versions;
    v_ids uuid[];               -- the requests covered, by id
    v_pins bigint[];
    v_cost bigint[];            -- each one's cost as first priced
    v_corrections bigint[];     -- and its corrections so far
    v_before bigint[];          -- its cost as corrected so far
    v_after bigint[];           -- and at the version
    v_seqs integer[];           -- its next correction's seq
    v_moved uuid[];             -- those whose cost changes
    v_differences bigint[];
    v_move record;
    v_counter record;
    v_at timestamptz := pg_catalog.now();
BEGIN
    SELECT * INTO STRICT v_version FROM llm.price_versions AS v WHERE v.id = p_version_id;
    -- the requests it covers (locked in id order when applying: a concurrent reprice
    -- waits, then reads the corrections this one wrote)
    IF p_apply THEN
        SELECT pg_catalog.array_agg(l.id ORDER BY l.id), pg_catalog.array_agg(l.price_version_id ORDER BY l.id)
          INTO v_ids, v_pins
          FROM (SELECT i.id, i.price_version_id FROM llm.invocations AS i
                 WHERE i.organization_id = p_organization_id AND i.model = p_model
                   AND i.created_at >= p_from AND i.created_at < p_to
                   AND i.priced_by IN ('model', 'fallback')
                 ORDER BY i.id
                   FOR UPDATE) AS l;
    ELSE
        SELECT pg_catalog.array_agg(i.id ORDER BY i.id), pg_catalog.array_agg(i.price_version_id ORDER BY i.id)
          INTO v_ids, v_pins
          FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id AND i.model = p_model
           AND i.created_at >= p_from AND i.created_at < p_to
           AND i.priced_by IN ('model', 'fallback');
    END IF;
    -- a book version reprices only the requests pinned to the book's versions
    IF v_version.organization_id IS NULL THEN
        SELECT pg_catalog.array_agg(u.id ORDER BY u.id) INTO v_ids
          FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_pins)) AS u (id, pin)
          JOIN llm.price_versions AS v ON v.id = u.pin
         WHERE v.organization_id IS NULL;
    END IF;
    requests := coalesce(pg_catalog.cardinality(v_ids), 0);
    cost_before_nanos := 0;
    cost_after_nanos := 0;
    IF requests = 0 THEN
        RETURN;
    END IF;
    -- each one's cost first priced, and its usage at the version (22023 for a class the
    -- version has no rate for: nothing written)
    SELECT pg_catalog.array_agg(i.cost_nanos ORDER BY u.n),
           pg_catalog.array_agg((llm._usage_cost(p_model, v_version.id, v_version.rates, i.usage, 1)).cost_nanos
                                ORDER BY u.n)
      INTO v_cost, v_after
      FROM pg_catalog.unnest(v_ids) WITH ORDINALITY AS u (id, n)
      JOIN llm.invocations AS i ON i.organization_id = p_organization_id AND i.id = u.id;
    -- its corrections so far, and its next correction's seq
    SELECT pg_catalog.array_agg(coalesce(c.corrections, 0) ORDER BY u.n),
           pg_catalog.array_agg(coalesce(c.last, 0) + 1 ORDER BY u.n)
      INTO v_corrections, v_seqs
      FROM pg_catalog.unnest(v_ids) WITH ORDINALITY AS u (id, n)
      LEFT JOIN (SELECT k.invocation_id, sum(k.difference_nanos)::bigint AS corrections, max(k.seq) AS last
                   FROM llm.cost_corrections AS k
                  WHERE k.organization_id = p_organization_id AND k.invocation_id = ANY (v_ids)
                  GROUP BY 1) AS c ON c.invocation_id = u.id;
    SELECT pg_catalog.array_agg(b.cost + b.corrections ORDER BY b.n) INTO v_before
      FROM ROWS FROM (pg_catalog.unnest(v_cost), pg_catalog.unnest(v_corrections)) WITH ORDINALITY
           AS b (cost, corrections, n);
    SELECT sum(b.before), sum(b.after) INTO cost_before_nanos, cost_after_nanos
      FROM ROWS FROM (pg_catalog.unnest(v_before), pg_catalog.unnest(v_after)) AS b (before, after);
    IF NOT p_apply THEN
        RETURN;
    END IF;

    -- a correction for each request whose cost changes, its next entry
    SELECT pg_catalog.array_agg(m.id ORDER BY m.id), pg_catalog.array_agg(m.after - m.before ORDER BY m.id)
      INTO v_moved, v_differences
      FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_before), pg_catalog.unnest(v_after))
           AS m (id, before, after)
     WHERE m.after <> m.before;
    IF v_moved IS NULL THEN
        RETURN;  -- repeated: nothing changes
    END IF;
    -- the organization's sweep lock, before any sum moves: a sweep moves the same tasks
    -- in another order. Taken only here, so a repricing holds the lock of no
    -- organization it leaves as it was; and taken after the requests, which is safe: a
    -- sweep never waits for a request (SKIP LOCKED) and this holds nothing else yet.
    PERFORM llm._lock_sweep_of(p_organization_id);
    INSERT INTO llm.cost_corrections
           (organization_id, invocation_id, seq, price_version_id, difference_nanos, corrected_at)
    SELECT p_organization_id, m.id, m.seq, v_version.id, m.after - m.before, v_at
      FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_seqs), pg_catalog.unnest(v_before),
                      pg_catalog.unnest(v_after)) AS m (id, seq, before, after)
     WHERE m.after <> m.before;

    -- the tasks, by id
    FOR v_move IN
        SELECT i.execution_id, sum(m.difference) AS difference
          FROM ROWS FROM (pg_catalog.unnest(v_moved), pg_catalog.unnest(v_differences)) AS m (id, difference)
          JOIN llm.invocations AS i ON i.organization_id = p_organization_id AND i.id = m.id
         WHERE i.execution_id IS NOT NULL
         GROUP BY 1 ORDER BY 1
    LOOP
        UPDATE llm.executions AS x SET priced_nanos = coalesce(x.priced_nanos, 0) + v_move.difference
         WHERE x.organization_id = p_organization_id AND x.id = v_move.execution_id;
    END LOOP;
    -- the period stripes, by period and stripe
    FOR v_move IN
        SELECT i.period_start, i.stripe, sum(m.difference) AS difference
          FROM ROWS FROM (pg_catalog.unnest(v_moved), pg_catalog.unnest(v_differences)) AS m (id, difference)
          JOIN llm.invocations AS i ON i.organization_id = p_organization_id AND i.id = m.id
         GROUP BY 1, 2 ORDER BY 1, 2
    LOOP
        UPDATE llm.period_stripes AS s SET priced_nanos = s.priced_nanos + v_move.difference
         WHERE s.organization_id = p_organization_id AND s.period_start = v_move.period_start
           AND s.stripe = v_move.stripe;
    END LOOP;
    -- the budget counters, in lock order, each one's stripes locked first (retention
    -- may have taken a counter: its requests keep their figures)
    FOR v_move IN
        SELECT k.slot, k.scope, k.scope_id, k.budget_window, k.window_start,
               pg_catalog.array_agg(i.budget_stripe) AS seeds,
               pg_catalog.array_agg(m.difference) AS differences
          FROM ROWS FROM (pg_catalog.unnest(v_moved), pg_catalog.unnest(v_differences)) AS m (id, difference)
          JOIN llm.invocations AS i ON i.organization_id = p_organization_id AND i.id = m.id
         CROSS JOIN LATERAL llm._budget_keys(i.budget_mask, i.project, i.api_key, i.end_user, i.created_at) AS k
         GROUP BY 1, 2, 3, 4, 5
         ORDER BY k.slot, k.scope_id, k.window_start
    LOOP
        SELECT * INTO v_counter
          FROM llm._lock_counter(p_organization_id, v_move.scope, v_move.scope_id, v_move.budget_window,
                                 v_move.window_start);
        CONTINUE WHEN v_counter.stripes IS NULL;
        FOR v_i IN 1 .. pg_catalog.cardinality(v_move.seeds) LOOP
            PERFORM llm._correct_counter(p_organization_id, v_move.scope, v_move.scope_id, v_move.budget_window,
                                         v_move.window_start,
                                         (coalesce(v_move.seeds[v_i], 0) % v_counter.stripes)::smallint,
                                         v_move.differences[v_i]);
        END LOOP;
    END LOOP;
    -- the daily usage rows built already (a day not built counts the corrections then)
    FOR v_move IN
        SELECT (i.settled_at AT TIME ZONE 'UTC')::date AS day, sum(m.difference) AS difference
          FROM ROWS FROM (pg_catalog.unnest(v_moved), pg_catalog.unnest(v_differences)) AS m (id, difference)
          JOIN llm.invocations AS i ON i.organization_id = p_organization_id AND i.id = m.id
         GROUP BY 1 ORDER BY 1
    LOOP
        UPDATE llm.daily_usage AS d SET corrections_nanos = coalesce(d.corrections_nanos, 0) + v_move.difference
         WHERE d.organization_id = p_organization_id AND d.day = v_move.day AND d.model = p_model;
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm._reprice_org(uuid, text, timestamptz, timestamptz, bigint, boolean) IS
    'Distributed twin of reprice for one organization: its requests of the model admitted in [p_from, p_to) priced from usage (a book version: those pinned to the book''s), their cost as corrected and at the version; with p_apply a correction per changed request and every cost sum moved by it.';

-- One budget counter stripe's cost moved by a correction (a variable, not an array
-- element, in the UPDATE: Citus).
CREATE OR REPLACE FUNCTION llm._correct_counter(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_stripe smallint, p_difference bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    UPDATE llm.budget_counters AS c SET priced_nanos = c.priced_nanos + p_difference
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
       AND c.budget_window = p_window AND c.window_start = p_window_start AND c.stripe = p_stripe;
END
$$;
COMMENT ON FUNCTION llm._correct_counter(uuid, text, text, text, date, smallint, bigint) IS
    'Moves one budget counter stripe''s priced nanos by a correction''s difference.';

CREATE OR REPLACE FUNCTION llm.reprice(
    p_model text, p_from timestamptz, p_to timestamptz, p_version_id bigint, p_apply boolean DEFAULT false)
RETURNS TABLE (organization_id uuid, requests bigint, cost_before_nanos numeric, cost_after_nanos numeric,
               difference_nanos numeric)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_version llm.price_versions;
    v_org uuid;
    v_row record;
BEGIN
    PERFORM llm._check_text('p_model', p_model, 200);
    IF p_from IS NULL OR p_to IS NULL OR NOT pg_catalog.isfinite(p_from) OR NOT pg_catalog.isfinite(p_to)
       OR p_from >= p_to THEN
        RAISE EXCEPTION 'llm: p_from .. p_to must be finite times in order' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('p_from=%s p_to=%s', p_from, p_to);
    END IF;
    IF p_apply IS NULL THEN
        RAISE EXCEPTION 'llm: p_apply must be true or false' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_version FROM llm.price_versions AS v WHERE v.id = p_version_id;
    IF NOT FOUND OR v_version.model NOT IN (p_model, '*') THEN
        RAISE EXCEPTION 'llm: no price version % of model %', coalesce(p_version_id::text, 'NULL'), p_model
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('version %s prices %s', p_version_id, coalesce(v_version.model, 'nothing')),
                  HINT = 'Reprice with a version of the model (or the fallback ''*''): llm.prices lists them.';
    END IF;
    IF p_apply THEN  -- the daily rebuild's lock: a rebuild either ran before or reads the corrections
        PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('llm.rebuild_daily_usage'));
    END IF;
    FOR v_org IN
        SELECT o.id FROM llm.organizations AS o
         WHERE v_version.organization_id IS NULL OR o.id = v_version.organization_id
         ORDER BY o.id
    LOOP
        SELECT * INTO v_row
          FROM llm._reprice_org(v_org, p_model, p_from, p_to, p_version_id, p_apply) AS r;
        CONTINUE WHEN v_row.requests = 0;
        organization_id := v_org;
        requests := v_row.requests;
        cost_before_nanos := v_row.cost_before_nanos;
        cost_after_nanos := v_row.cost_after_nanos;
        difference_nanos := v_row.cost_after_nanos - v_row.cost_before_nanos;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm.reprice(text, timestamptz, timestamptz, bigint, boolean) IS
    'Reprices the requests of p_model admitted in [p_from, p_to) that were priced from usage at price version p_version_id (an organization''s own version: that organization''s; a book version: those pinned to book versions); one row per organization: requests, cost before (as already corrected), after, difference. With p_apply it writes one correction per changed request and moves every cost sum by it in this transaction; credits stay as charged; repeating it changes nothing.';
