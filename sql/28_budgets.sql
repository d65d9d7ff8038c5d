-- Budgets (issue 23, docs/architecture.md "Budgets"): a limit per organization, project,
-- API key or end user, per calendar day, week (from Monday) or month in UTC, on
-- top of the organization's monthly allowance. A request names its scope ids at
-- admission; the budgets that apply to it then are fixed beside it as bits of
-- invocation_scopes.budget_mask, one counter row each (llm.budget_counters), and every
-- movement of the request moves those counters in the windows of its admission
-- time. Admission checks every one of them, all or nothing (30_admission.sql).
--
-- A bit is 3 * scope + window: scopes organization 0, project 1, api_key 2,
-- end_user 3; windows day 0, week 1, month 2. Bit order is the order a refusal
-- names the first budget that does not fit, and the lock order of the counters:
-- by bit, then scope id, then window start (a request has one counter per bit,
-- so any two requests take the counters they share in the same order).
--
-- Lock order, after the period's stripes (the allowance): counters, then their
-- notices. set_budget takes the organization's row, its budget's row, then the
-- counters of that budget, in scope id order.

-- ---------------------------------------------------------------- calendar and keys

-- Inlinable (no SET clause, everything qualified).
CREATE OR REPLACE FUNCTION llm._window_start(p_window text, p_at timestamptz)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.date_trunc(p_window, pg_catalog.timezone('UTC'::text, p_at))::date
$$;
COMMENT ON FUNCTION llm._window_start(text, timestamptz) IS
    'The first day of the calendar window (day, week from Monday, month) containing p_at, in UTC.';

-- The counters a request with budget_mask p_mask moves: one row per bit set, in
-- bit order (the lock order). Reads no table (Citus rule 7).
CREATE OR REPLACE FUNCTION llm._budget_keys(
    p_mask integer, p_project text, p_api_key text, p_end_user text, p_at timestamptz)
RETURNS TABLE (slot integer, scope text, scope_id text, budget_window text, window_start date)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT k.slot, k.scope,
           -- a searched CASE: Citus rewrites a simple one wrongly (docs/scaling.md)
           CASE WHEN k.scope OPERATOR(pg_catalog.=) 'project' THEN p_project
                WHEN k.scope OPERATOR(pg_catalog.=) 'api_key' THEN p_api_key
                WHEN k.scope OPERATOR(pg_catalog.=) 'end_user' THEN p_end_user END,
           k.budget_window, llm._window_start(k.budget_window, p_at)
      FROM (VALUES (0, 'organization', 'day'), (1, 'organization', 'week'),
                   (3, 'project', 'day'), (4, 'project', 'week'), (5, 'project', 'month'),
                   (6, 'api_key', 'day'), (7, 'api_key', 'week'), (8, 'api_key', 'month'),
                   (9, 'end_user', 'day'), (10, 'end_user', 'week'), (11, 'end_user', 'month'))
           AS k(slot, scope, budget_window)
     WHERE (coalesce(p_mask, 0) OPERATOR(pg_catalog.&) (1 OPERATOR(pg_catalog.<<) k.slot)) OPERATOR(pg_catalog.<>) 0
     ORDER BY k.slot
$$;
COMMENT ON FUNCTION llm._budget_keys(integer, text, text, text, timestamptz) IS
    'The budget counters (scope, real id, window, window start) a request admitted at p_at with budget_mask p_mask moves, in bit order.';

-- Inlinable. The day after the window starting p_start (its end, exclusive). A
-- searched CASE: Citus rewrites a simple CASE in a distributed statement wrongly.
CREATE OR REPLACE FUNCTION llm._window_end(p_window text, p_start date)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_window OPERATOR(pg_catalog.=) 'day' THEN p_start OPERATOR(pg_catalog.+) 1
                WHEN p_window OPERATOR(pg_catalog.=) 'week' THEN p_start OPERATOR(pg_catalog.+) 7
                ELSE (p_start OPERATOR(pg_catalog.+) interval '1 month')::date END
$$;
COMMENT ON FUNCTION llm._window_end(text, date) IS
    'The first day after the calendar window (day, week, month) that starts on p_start.';

CREATE OR REPLACE FUNCTION llm._budget_slot(p_scope text, p_window text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 3 OPERATOR(pg_catalog.*) pg_catalog.array_position(ARRAY['organization', 'project', 'api_key', 'end_user'], p_scope)
           OPERATOR(pg_catalog.+) pg_catalog.array_position(ARRAY['day', 'week', 'month'], p_window)
           OPERATOR(pg_catalog.-) 4
$$;
COMMENT ON FUNCTION llm._budget_slot(text, text) IS
    'The budget_mask bit of a scope and window (3 * scope + window), NULL for an unknown one.';

-- ---------------------------------------------------------------- arguments

-- Inlinable. A scope id a request names: 1..200 characters, not blank, no control
-- character of either block (U+0000-U+001F, U+007F-U+009F: [[:cntrl:]] misses the
-- second under the C locale), not the reserved '*'.
CREATE OR REPLACE FUNCTION llm._scope_id_ok(p_value text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_value IS NULL
        OR (pg_catalog.length(p_value) OPERATOR(pg_catalog.<=) 200
            AND pg_catalog.btrim(p_value) OPERATOR(pg_catalog.<>) ''
            AND p_value OPERATOR(pg_catalog.<>) '*'
            AND p_value OPERATOR(pg_catalog.!~) '[\u0001-\u001f\u007f-\u009f]')
$$;
COMMENT ON FUNCTION llm._scope_id_ok(text) IS
    'True for NULL or a valid scope id (1..200 characters, not blank, no control character, not ''*'').';

CREATE OR REPLACE FUNCTION llm._check_scope_id(p_name text, p_value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF NOT llm._scope_id_ok(p_value) THEN
        RAISE EXCEPTION 'llm: invalid % %', p_name, pg_catalog.quote_nullable(pg_catalog.left(p_value, 40))
            USING ERRCODE = '22023',
                  DETAIL = 'A scope id is 1 to 200 characters, not blank, without control characters (U+0000-U+001F, U+007F-U+009F); ''*'' is reserved for default budgets.',
                  HINT = 'Pass the project''s, key''s or end user''s own identifier (never an API key''s secret), or NULL.';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_scope_id(text, text) IS
    'Raises 22023 naming p_name unless p_value is NULL or a valid scope id.';

-- ---------------------------------------------------------------- admission

-- The budgets that apply to a request, with the limit each is decided against and
-- its revision, in bit order: the organization's day and week budgets, and for each
-- scope id the request names its own budget per window, else the scope's '*'. One
-- statement, one snapshot: a concurrent set_budget applies wholly or not at all.
CREATE OR REPLACE FUNCTION llm._applicable_budgets(
    p_organization_id uuid, p_project text, p_api_key text, p_end_user text,
    OUT mask integer, OUT limits bigint[], OUT revisions uuid[])
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    SELECT coalesce(sum(1 << a.slot), 0),
           coalesce(pg_catalog.array_agg(a.limit_credits ORDER BY a.slot), '{}'),
           coalesce(pg_catalog.array_agg(a.revision ORDER BY a.slot), '{}')
      INTO mask, limits, revisions
      FROM (SELECT DISTINCT ON (b.scope, b.budget_window)
                   llm._budget_slot(b.scope, b.budget_window) AS slot, b.limit_credits, b.revision
              FROM llm.budget_limits AS b
             WHERE b.organization_id = p_organization_id
               AND (b.scope = 'organization'
                    OR (b.scope = 'project' AND b.scope_id IN (p_project, '*') AND p_project IS NOT NULL)
                    OR (b.scope = 'api_key' AND b.scope_id IN (p_api_key, '*') AND p_api_key IS NOT NULL)
                    OR (b.scope = 'end_user' AND b.scope_id IN (p_end_user, '*') AND p_end_user IS NOT NULL))
             ORDER BY b.scope, b.budget_window, b.scope_id = '*') AS a;  -- its own before '*'
END
$$;
COMMENT ON FUNCTION llm._applicable_budgets(uuid, text, text, text) IS
    'The budgets that apply to a request naming these scope ids: their budget_mask, and their limits and revisions in bit order, read in one snapshot.';

-- A request's holds on its budgets' counters, in bit order, after its hold on the
-- period (the allowance, named first when both refuse). Each counter is created by
-- the first request admitted under it, and decided on its row's latest values
-- under the row's lock: used + held + estimate <= limit, else LL001 naming it (the
-- caller's transaction rolls back every hold).
--
-- Retention (docs/architecture.md "Budgets"): only the creation of a counter looks
-- at the organization's horizon, and refuses a window that ended on or before it
-- (LL012): its counter may have been purged, and a new one would start from zero.
-- The horizon is read inside the INSERT, and again after it: the INSERT may have
-- waited on the unique key of the very counter a pass was deleting, and only a
-- snapshot taken after that wait sees the horizon the pass committed with the
-- deletion. An existing counter needs no check: it was never purged since it was
-- created, and if retention deletes it meanwhile, the UPDATE waits for the
-- deletion, finds nothing and comes here. (Refusing in this path a counter that a
-- concurrent first request has just created is the conservative side.)
--
-- Citus: the limits are read into variables (an array element in a distributed
-- statement crashes it), and the upsert's outcome is read from its RETURNING through
-- a CTE (after an INSERT ... SELECT ... ON CONFLICT DO UPDATE ... WHERE it reports a
-- row even when the WHERE refused it: FOUND lies, and RETURNING ... INTO fails with
-- XX000 "consistency check on SPI tuple count failed"). Long on purpose: the counter's update, its upsert and the two
-- refusals read its row, and belong together.
CREATE OR REPLACE FUNCTION llm._hold_budgets(
    p_inv llm.invocations, p_scopes llm.invocation_scopes, p_limits bigint[], p_revisions uuid[])
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_key record;
    v_i integer := 0;
    v_limit bigint;
    v_revision uuid;
    v_held uuid;
    v_counter llm.budget_counters;
    v_horizon date;
BEGIN
    FOR v_key IN
        SELECT k.* FROM llm._budget_keys(p_scopes.budget_mask, p_scopes.project,
                                         p_scopes.api_key, p_scopes.end_user, p_inv.created_at) AS k
    LOOP
        v_i := v_i + 1;  -- the keys and the arrays are both in bit order
        v_limit := p_limits[v_i];
        v_revision := p_revisions[v_i];
        -- A counter exists from the first request of its id and window on: held by a
        -- plain UPDATE (HOT; no tuple-lock record and no speculative insertion, as an
        -- upsert's conflict costs). The upsert below creates it on first use, and
        -- meets every refusal (its WHERE decides on the row under its lock).
        UPDATE llm.budget_counters AS c
           SET held_credits = c.held_credits + p_inv.hold_credits,
               admitted_limit = v_limit, admitted_revision = v_revision
         WHERE c.organization_id = p_inv.organization_id AND c.scope = v_key.scope
           AND (c.scope_id = v_key.scope_id OR (c.scope_id IS NULL AND v_key.scope_id IS NULL))
           AND c.budget_window = v_key.budget_window AND c.window_start = v_key.window_start
           AND c.used_credits + c.held_credits + p_inv.hold_credits <= v_limit;
        CONTINUE WHEN FOUND;
        v_held := NULL;
        WITH held AS (
            INSERT INTO llm.budget_counters AS c
                   (organization_id, scope, scope_id, budget_window, window_start, held_credits,
                    admitted_limit, admitted_revision)
            SELECT p_inv.organization_id, v_key.scope, v_key.scope_id, v_key.budget_window, v_key.window_start,
                   p_inv.hold_credits, v_limit, v_revision
             WHERE p_inv.hold_credits <= v_limit
               AND NOT EXISTS (SELECT FROM llm.budget_horizons AS h
                                WHERE h.organization_id = p_inv.organization_id
                                  AND llm._window_end(v_key.budget_window, v_key.window_start) <= h.horizon)
            ON CONFLICT (organization_id, scope, scope_id, budget_window, window_start) DO UPDATE
               SET held_credits = c.held_credits + excluded.held_credits,
                   admitted_limit = excluded.admitted_limit,
                   admitted_revision = excluded.admitted_revision
             WHERE c.used_credits + c.held_credits + excluded.held_credits <= excluded.admitted_limit
            RETURNING c.id)
        SELECT h.id INTO v_held FROM held AS h;
        IF v_held IS NULL THEN
            SELECT * INTO v_counter FROM llm.budget_counters AS c
             WHERE c.organization_id = p_inv.organization_id AND c.scope = v_key.scope
               AND (c.scope_id = v_key.scope_id OR (c.scope_id IS NULL AND v_key.scope_id IS NULL))
               AND c.budget_window = v_key.budget_window AND c.window_start = v_key.window_start;
        END IF;
        IF v_held IS NOT NULL OR v_counter.id IS NULL THEN
            -- The horizon once more, in a snapshot taken after the INSERT: its own was
            -- taken before it waited on the unique key of a counter a pass was deleting.
            SELECT h.horizon INTO v_horizon FROM llm.budget_horizons AS h
             WHERE h.organization_id = p_inv.organization_id;
            CONTINUE WHEN v_held IS NOT NULL
                AND (v_horizon IS NULL OR llm._window_end(v_key.budget_window, v_key.window_start) > v_horizon);
            IF llm._window_end(v_key.budget_window, v_key.window_start) <= v_horizon THEN
                RAISE EXCEPTION 'llm: % budget window % of organization % is past retention', v_key.budget_window,
                                v_key.window_start, p_inv.organization_id
                    USING ERRCODE = 'LL012',
                          DETAIL = coalesce(v_key.scope_id, p_inv.organization_id::text) || E'\n'
                                   || pg_catalog.format('scope=%s window=%s window_start=%s horizon=%s',
                                                        v_key.scope, v_key.budget_window, v_key.window_start, v_horizon),
                          HINT = 'The window ended on or before the retention horizon, so its counter may be gone: admit with the current clock, or raise budget_retention before such windows are purged.',
                          SCHEMA = 'llm', TABLE = 'budgets', CONSTRAINT = v_key.scope, COLUMN = v_key.budget_window;
            END IF;
        END IF;
        -- The DETAIL's first line is the id, verbatim (an id has no control character),
        -- the one part of a DETAIL code may read (docs/contract.md "Errors").
        RAISE EXCEPTION 'llm: % budget exhausted for organization %', v_key.budget_window, p_inv.organization_id
            USING ERRCODE = 'LL001',
                  DETAIL = coalesce(v_key.scope_id, p_inv.organization_id::text) || E'\n'
                           || pg_catalog.format('scope=%s window=%s window_start=%s limit=%s used=%s held=%s estimate=%s',
                                                v_key.scope, v_key.budget_window, v_key.window_start, v_limit,
                                                coalesce(v_counter.used_credits, 0), coalesce(v_counter.held_credits, 0),
                                                p_inv.hold_credits),
                  HINT = 'Wait for holds to settle or for the next window, lower the estimate, or raise the budget with llm.set_budget.',
                  SCHEMA = 'llm', TABLE = 'budgets', CONSTRAINT = v_key.scope, COLUMN = v_key.budget_window;
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm._hold_budgets(llm.invocations, llm.invocation_scopes, bigint[], uuid[]) IS
    'Holds a just-admitted request''s estimate on the counter of every budget in its budget_mask, in bit order, each iff used + held + estimate <= its limit (LL001 naming the first that does not fit, with the id as the DETAIL''s first line); a counter it would create for a window past the organization''s retention horizon is LL012.';

-- ---------------------------------------------------------------- movements

-- The budget in force now for one id of a scope and window: its own, else the scope's
-- '*' (NULL fields: none). Matched by the budget's key (an id NULL only for the
-- organization scope), so its index serves it.
CREATE OR REPLACE FUNCTION llm._budget_in_force(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text,
    OUT limit_credits bigint, OUT thresholds integer[])
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    SELECT b.limit_credits, b.thresholds INTO limit_credits, thresholds
      FROM llm.budget_limits AS b
     WHERE b.organization_id = p_organization_id AND b.scope = p_scope AND b.budget_window = p_window
       AND (b.scope_id = p_scope_id OR (b.scope_id IS NULL AND p_scope_id IS NULL) OR b.scope_id = '*')
     ORDER BY b.scope_id = '*'
     LIMIT 1;
END
$$;
COMMENT ON FUNCTION llm._budget_in_force(uuid, text, text, text) IS
    'The limit and thresholds of the budget that applies now to one id of a scope and window: its own, else the scope''s ''*''; NULL when none.';

-- What a changed counter owes: the thresholds of the budget that applies to it now
-- (its id's own, else the scope's '*'), crossed when used moved from p_olds to p_news.
-- Read after the counters are locked, so a set_budget that held them is seen.
CREATE OR REPLACE FUNCTION llm._budget_crossings(
    p_organization_id uuid, p_keys llm.budget_counters[], p_olds bigint[], p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_budget record;
    v_created integer := 0;
BEGIN
    FOR v_i IN 1 .. coalesce(pg_catalog.cardinality(p_keys), 0) LOOP
        SELECT * INTO v_budget
          FROM llm._budget_in_force(p_organization_id, p_keys[v_i].scope, p_keys[v_i].scope_id,
                                    p_keys[v_i].budget_window);
        CONTINUE WHEN v_budget.limit_credits IS NULL
            OR NOT coalesce(llm._may_cross(p_olds[v_i], p_keys[v_i].used_credits, v_budget.limit_credits), false);
        v_created := v_created
            + llm._owe_notices(p_organization_id, p_keys[v_i].window_start, v_budget.thresholds,
                               p_keys[v_i].used_credits, v_budget.limit_credits, p_now,
                               p_keys[v_i].scope, p_keys[v_i].scope_id, p_keys[v_i].budget_window,
                               p_olds[v_i]);
    END LOOP;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._budget_crossings(uuid, llm.budget_counters[], bigint[], timestamptz) IS
    'Owes one notice per threshold each moved counter crossed (used from p_olds[i] to p_keys[i].used_credits) under the budget that applies to it now.';

-- A counter (or limit) is found by its key, scope_id NULL for the organization scope:
-- spelled "= OR both NULL", which the key's index serves (two probes in a generic
-- plan), never IS NOT DISTINCT FROM, which no index serves (a scan of every
-- organization's counters, pruning each page it reads, on every settlement).

-- Every movement of terminal or trued-up requests moves the counters they were
-- admitted under, in the windows of their admission time: the charge in and the
-- hold out for requests just made terminal (settled, failed, recovered), or the
-- signed difference of a true-up (p_true_up). Their scope ids and budget_mask are
-- read beside them (invocation_scopes: none for most requests, and then nothing
-- else runs). Counters in lock order (slot, id, window start), after the period's
-- stripes; then the thresholds they crossed.
CREATE OR REPLACE FUNCTION llm._move_budgets(
    p_organization_id uuid, p_invs llm.invocations[], p_true_up boolean, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_move record;
    v_counter llm.budget_counters;
    v_rising llm.budget_counters[] := ARRAY[]::llm.budget_counters[];
    v_olds bigint[] := ARRAY[]::bigint[];
BEGIN
    FOR v_move IN
        SELECT k.slot, k.scope, k.scope_id, k.budget_window, k.window_start,
               sum(CASE WHEN p_true_up THEN i.charged_credits - i.recovered_credits
                        ELSE i.charged_credits END)::bigint AS used,
               sum(CASE WHEN p_true_up THEN 0 ELSE i.hold_credits END)::bigint AS released,
               sum(coalesce(i.charged_cents, 0))::bigint AS cents
          FROM pg_catalog.unnest(p_invs) AS i
          JOIN llm.invocation_scopes AS s
            ON s.organization_id = p_organization_id AND s.invocation_id = i.id
         CROSS JOIN LATERAL llm._budget_keys(s.budget_mask, s.project, s.api_key,
                                             s.end_user, i.created_at) AS k
         WHERE s.budget_mask <> 0
         GROUP BY k.slot, k.scope, k.scope_id, k.budget_window, k.window_start
         ORDER BY k.slot, k.scope_id, k.window_start
    LOOP
        -- the sum limit (LL013): used + held and used cents never grow past it (an
        -- overage of requests admitted with estimate 0, a week across two periods). The
        -- UPDATE skips a counter the move would carry past it, and the refusal is raised
        -- outside it: Citus refuses a VOLATILE call in a distributed UPDATE.
        UPDATE llm.budget_counters AS c
           SET used_credits = c.used_credits + v_move.used,
               held_credits = c.held_credits - v_move.released,
               used_cents = c.used_cents + v_move.cents
         WHERE c.organization_id = p_organization_id AND c.scope = v_move.scope
           AND (c.scope_id = v_move.scope_id OR (c.scope_id IS NULL AND v_move.scope_id IS NULL))
           AND c.budget_window = v_move.budget_window AND c.window_start = v_move.window_start
           AND (v_move.used - v_move.released <= 0
                OR c.used_credits::numeric + c.held_credits + v_move.used - v_move.released <= llm._max_sum())
           AND (v_move.cents <= 0 OR c.used_cents::numeric + v_move.cents <= llm._max_sum())
        RETURNING c.* INTO v_counter;
        IF NOT FOUND THEN  -- no counter (retention took its window), or one past the limit
            SELECT * INTO v_counter FROM llm.budget_counters AS c
             WHERE c.organization_id = p_organization_id AND c.scope = v_move.scope
               AND (c.scope_id = v_move.scope_id OR (c.scope_id IS NULL AND v_move.scope_id IS NULL))
               AND c.budget_window = v_move.budget_window AND c.window_start = v_move.window_start;
            IF FOUND AND v_move.used - v_move.released > 0
               AND v_counter.used_credits::numeric + v_counter.held_credits + v_move.used - v_move.released
                   > llm._max_sum() THEN
                PERFORM llm._refuse_sum('budget_counters', 'used_credits',
                                        v_counter.used_credits::numeric + v_counter.held_credits
                                        + v_move.used - v_move.released,
                                        pg_catalog.format('the %s budget counter %s of %s', v_counter.budget_window,
                                                          v_counter.window_start, v_counter.scope));
            ELSIF FOUND THEN
                PERFORM llm._refuse_sum('budget_counters', 'used_cents', v_counter.used_cents::numeric + v_move.cents,
                                        pg_catalog.format('the %s budget counter %s of %s', v_counter.budget_window,
                                                          v_counter.window_start, v_counter.scope));
            END IF;
            CONTINUE;
        END IF;
        IF v_move.used > 0 THEN
            v_rising := v_rising || v_counter;
            v_olds := v_olds || (v_counter.used_credits - v_move.used);
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(v_rising) > 0 THEN
        RETURN llm._budget_crossings(p_organization_id, v_rising, v_olds, p_now);
    END IF;
    RETURN 0;
END
$$;
COMMENT ON FUNCTION llm._move_budgets(uuid, llm.invocations[], boolean, timestamptz) IS
    'Moves the budget counters of the given requests (terminal: charge in, hold out; p_true_up: the signed difference) in lock order, refusing growth past the sum limit (LL013), and owes the thresholds they crossed; returns the notices created.';

-- ---------------------------------------------------------------- retention

-- Retention (docs/architecture.md "Budgets"): the counters of windows that ended
-- budget_retention before the pass's clock go, their requests keep their figures.
-- Three rules make it safe under every clock and interleaving:
-- 1. The clock is LEAST(p_now, now()): nothing goes on the strength of a clock
--    ahead of the server's (a pass run ahead vouches for no day it did not see).
-- 2. The horizon (llm.budget_horizons) is raised first, never lowered, and never
--    past the UTC day of the organization's oldest open request: whatever
--    budget_retention and sweep_batch are, an open request's windows end after it.
--    Admission refuses to create a counter of a window ended on or before it
--    (LL012, _hold_budgets), so a purged window is never admitted again.
-- 3. The counters are locked in the lock order (bit, scope id, window start),
--    skipping any a call holds (the next pass takes them), and deleted by a second
--    statement, a fresh snapshot, only if they still hold nothing and no open
--    request is admitted under them (one admitted with estimate 0 holds nothing).
-- Returns how many counters went.
CREATE OR REPLACE FUNCTION llm._retain_budgets(
    p_organization_id uuid, p_now timestamptz, p_retention interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_horizon date := llm._window_start('day', LEAST(p_now, pg_catalog.now()) - p_retention);
    v_oldest_open timestamptz;
    v_locked uuid[];
    v_deleted integer;
BEGIN
    SELECT min(i.created_at) INTO v_oldest_open
      FROM llm.invocations AS i
     WHERE i.organization_id = p_organization_id AND i.status IN ('reserved', 'dispatched');
    v_horizon := LEAST(v_horizon, llm._window_start('day', v_oldest_open));
    INSERT INTO llm.budget_horizons AS h (organization_id, horizon, updated_at)
    VALUES (p_organization_id, v_horizon, p_now)
    ON CONFLICT (organization_id) DO UPDATE
       SET horizon = GREATEST(h.horizon, excluded.horizon), updated_at = excluded.updated_at
    RETURNING h.horizon INTO v_horizon;

    SELECT pg_catalog.array_agg(l.id) INTO v_locked
      FROM (SELECT c.id FROM llm.budget_counters AS c
             WHERE c.organization_id = p_organization_id AND c.held_credits = 0
               AND llm._window_end(c.budget_window, c.window_start) <= v_horizon
             ORDER BY llm._budget_slot(c.scope, c.budget_window), c.scope_id, c.window_start
               FOR UPDATE SKIP LOCKED) AS l;
    IF v_locked IS NULL THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM llm.budget_counters AS c
         WHERE c.organization_id = p_organization_id AND c.id = ANY (v_locked) AND c.held_credits = 0
           AND NOT EXISTS (
                 SELECT FROM llm.invocations AS i
                   JOIN llm.invocation_scopes AS s
                     ON s.organization_id = i.organization_id AND s.invocation_id = i.id
                  CROSS JOIN LATERAL llm._budget_keys(s.budget_mask, s.project, s.api_key,
                                                      s.end_user, i.created_at) AS k
                  WHERE i.organization_id = p_organization_id
                    AND i.status IN ('reserved', 'dispatched')
                    AND i.created_at < (llm._window_end(c.budget_window, c.window_start)::timestamp AT TIME ZONE 'UTC')
                    AND s.budget_mask <> 0
                    AND k.scope = c.scope AND k.budget_window = c.budget_window
                    AND k.window_start = c.window_start
                    AND (k.scope_id = c.scope_id OR (k.scope_id IS NULL AND c.scope_id IS NULL)))
        RETURNING 1)
    SELECT count(*) INTO v_deleted FROM gone;
    RETURN v_deleted;
END
$$;
COMMENT ON FUNCTION llm._retain_budgets(uuid, timestamptz, interval) IS
    'Raises the organization''s retention horizon (LEAST(p_now, now()) - p_retention, never past its oldest open request''s day) and deletes the counters of windows ended on or before it that hold nothing and no open request is admitted under, locked in lock order, skipping locked ones; returns how many.';

-- ---------------------------------------------------------------- set_budget

-- What a set, changed or removed budget owes at once, in the window containing
-- p_now: every threshold the counters it now governs stand at or above, under the
-- budget that applies to each now (issue 20 defect 4, for budgets). The counters
-- are locked in id order, so a movement waits for this or this for it, and the
-- later one reads the other's figures.
CREATE OR REPLACE FUNCTION llm._budget_reached(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_start date := llm._window_start(p_window, p_now);
    v_own text[] := ARRAY[]::text[];
    v_counter llm.budget_counters;
    v_counters llm.budget_counters[] := ARRAY[]::llm.budget_counters[];
    v_created integer := 0;
    v_budget record;
BEGIN
    IF p_scope_id = '*' THEN
        -- the ids with a budget of their own are not governed by the default
        SELECT coalesce(pg_catalog.array_agg(b.scope_id), '{}') INTO v_own
          FROM llm.budget_limits AS b
         WHERE b.organization_id = p_organization_id AND b.scope = p_scope
           AND b.budget_window = p_window AND b.scope_id <> '*';
    END IF;
    FOR v_counter IN
        SELECT * FROM llm.budget_counters AS c
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND c.budget_window = p_window AND c.window_start = v_start
           AND (c.scope_id IS NOT DISTINCT FROM p_scope_id OR (p_scope_id = '*' AND c.scope_id <> ALL (v_own)))
         ORDER BY c.scope_id
           FOR UPDATE
    LOOP
        v_counters := v_counters || v_counter;
    END LOOP;
    FOR v_i IN 1 .. pg_catalog.cardinality(v_counters) LOOP
        SELECT * INTO v_budget
          FROM llm._budget_in_force(p_organization_id, p_scope, v_counters[v_i].scope_id, p_window);
        CONTINUE WHEN v_budget.limit_credits IS NULL;
        v_created := v_created
            + llm._owe_notices(p_organization_id, v_start, v_budget.thresholds, v_counters[v_i].used_credits,
                               v_budget.limit_credits, p_now, p_scope, v_counters[v_i].scope_id, p_window);
    END LOOP;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._budget_reached(uuid, text, text, text, timestamptz) IS
    'With the budget just changed: locks the counters it governs in the window containing p_now (one id, or every id without its own budget for ''*'') and owes every threshold they stand at or above under the budget that applies to each now.';

CREATE OR REPLACE FUNCTION llm._check_scope_and_window(p_scope text, p_window text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_scope IS NULL OR p_scope NOT IN ('organization', 'project', 'api_key', 'end_user') THEN
        RAISE EXCEPTION 'llm: invalid budget scope %', pg_catalog.quote_nullable(p_scope)
            USING ERRCODE = '22023', HINT = 'Use organization, project, api_key or end_user.';
    END IF;
    IF p_window IS NULL OR p_window NOT IN ('day', 'week', 'month') THEN
        RAISE EXCEPTION 'llm: invalid budget window %', pg_catalog.quote_nullable(p_window)
            USING ERRCODE = '22023', HINT = 'Use day, week or month (calendar windows in UTC; weeks start on Monday).';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_scope_and_window(text, text) IS
    'Raises 22023 unless p_scope is organization, project, api_key or end_user and p_window day, week or month.';

CREATE OR REPLACE FUNCTION llm._set_budget(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint,
    p_thresholds integer[], p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_revision uuid := pg_catalog.gen_random_uuid();  -- before the INSERT (Citus rule 6)
BEGIN
    -- lock order: the organization's row (kept, not locked against admissions), the
    -- budget's row, its counters
    PERFORM FROM llm.organizations AS o WHERE o.id = p_organization_id FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    -- The budget's row, created when missing, even to remove it: a concurrent change
    -- of the same budget then waits for this one (a DELETE of a missing row would lock
    -- nothing and lose to a set committing after it), so the last to commit is in force.
    INSERT INTO llm.budget_limits AS b
           (organization_id, scope, scope_id, budget_window, limit_credits, thresholds, revision, updated_at)
    VALUES (p_organization_id, p_scope, p_scope_id, p_window, coalesce(p_limit_credits, 0), p_thresholds,
            v_revision, p_now)
    ON CONFLICT (organization_id, scope, scope_id, budget_window) DO UPDATE
       SET limit_credits = excluded.limit_credits, thresholds = excluded.thresholds,
           revision = excluded.revision, updated_at = excluded.updated_at;
    IF p_limit_credits IS NULL THEN
        DELETE FROM llm.budget_limits AS b
         WHERE b.organization_id = p_organization_id AND b.scope = p_scope
           AND (b.scope_id = p_scope_id OR (b.scope_id IS NULL AND p_scope_id IS NULL))
           AND b.budget_window = p_window;
    END IF;
    RETURN llm._budget_reached(p_organization_id, p_scope, p_scope_id, p_window, p_now);
END
$$;
COMMENT ON FUNCTION llm._set_budget(uuid, text, text, text, bigint, integer[], timestamptz) IS
    'Distributed twin of set_budget (returns the notices it owed); arguments already checked.';

CREATE OR REPLACE FUNCTION llm.set_budget(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint,
    p_thresholds integer[] DEFAULT '{80,100}', p_now timestamptz DEFAULT now())
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_thresholds integer[];
    v_owed integer;
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now);
    PERFORM llm._check_scope_and_window(p_scope, p_window);
    IF p_scope = 'organization' THEN
        IF p_scope_id IS NOT NULL THEN
            RAISE EXCEPTION 'llm: an organization budget takes no scope id'
                USING ERRCODE = '22023', HINT = 'Pass NULL as p_scope_id for the organization scope.';
        END IF;
        IF p_window = 'month' THEN
            RAISE EXCEPTION 'llm: the organization''s month budget is its allowance'
                USING ERRCODE = '22023',
                      HINT = 'Set the monthly allowance with llm.upsert_organization; an organization may add day and week budgets.';
        END IF;
    ELSIF p_scope_id IS NULL THEN
        RAISE EXCEPTION 'llm: a % budget needs a scope id', p_scope
            USING ERRCODE = '22023', HINT = 'Pass the id, or ''*'' for the default budget of every id without one.';
    ELSIF p_scope_id <> '*' THEN
        PERFORM llm._check_scope_id('p_scope_id', p_scope_id);
    END IF;
    PERFORM llm._check_amount('p_limit_credits', p_limit_credits, true);
    v_thresholds := llm._check_thresholds(p_thresholds);
    SELECT * INTO v_owed
      FROM llm._set_budget(p_organization_id, p_scope, p_scope_id, p_window, p_limit_credits,
                           v_thresholds, coalesce(p_now, pg_catalog.now()));
    IF v_owed > 0 THEN
        RAISE DEBUG 'llm: set_budget owed % threshold notice(s)', v_owed;
    END IF;
END
$$;
COMMENT ON FUNCTION llm.set_budget(uuid, text, text, text, bigint, integer[], timestamptz) IS
    'Sets (or with a NULL limit removes) the budget of a scope id, or of every id of the scope without one (''*''), per day, week or month in UTC; it applies to every admission after it commits, and owes at once the thresholds the window containing p_now stands at or above.';

-- ---------------------------------------------------------------- refusals

-- A refusal (LL001) rolls back everything its transaction wrote, so it cannot record
-- itself (PostgreSQL has no autonomous transactions). The caller reports it in a second
-- transaction, with the limit the refusal named (the driver does so on catching LL001;
-- a plain-SQL caller calls llm.note_refusal). The first report of each limit's window
-- owes one notice, threshold 0 ("limit reached": the commitments, used + held +
-- estimate, would have passed it); every later one reads that notice and writes
-- nothing, so a refusal storm writes once per limit and window. The figures come from
-- the books, not from the caller: the limit in force and the used credits now.
CREATE OR REPLACE FUNCTION llm._note_refusal(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_limit bigint;
    v_used bigint;
BEGIN
    PERFORM FROM llm.threshold_notices AS n
     WHERE n.organization_id = p_organization_id AND n.scope = p_scope
       AND n.scope_id IS NOT DISTINCT FROM p_scope_id AND n.budget_window = p_window
       AND n.period_start = p_window_start AND n.threshold_pct = 0;
    IF FOUND THEN
        RETURN false;  -- noted before: a read, no write
    END IF;
    IF p_scope = 'organization' AND p_window = 'month' THEN  -- the allowance
        SELECT o.monthly_allowance_credits INTO v_limit FROM llm.organizations AS o
         WHERE o.id = p_organization_id;
        IF NOT FOUND THEN
            PERFORM llm._raise_unknown_org(p_organization_id);
        END IF;
        SELECT coalesce(sum(s.used_credits), 0) INTO v_used FROM llm.period_stripes AS s
         WHERE s.organization_id = p_organization_id AND s.period_start = p_window_start;
    ELSE
        PERFORM FROM llm.organizations AS o WHERE o.id = p_organization_id;
        IF NOT FOUND THEN
            PERFORM llm._raise_unknown_org(p_organization_id);
        END IF;
        SELECT f.limit_credits INTO v_limit
          FROM llm._budget_in_force(p_organization_id, p_scope, p_scope_id, p_window) AS f;
        SELECT coalesce(sum(c.used_credits), 0) INTO v_used FROM llm.budget_counters AS c
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND c.scope_id IS NOT DISTINCT FROM p_scope_id AND c.budget_window = p_window
           AND c.window_start = p_window_start;
    END IF;
    IF v_limit IS NULL THEN
        RETURN false;  -- no such limit (now): nothing it refused is owed
    END IF;
    RETURN llm._owe_notices(p_organization_id, p_window_start, ARRAY[0], v_used, v_limit, p_now,
                            p_scope, p_scope_id, p_window) > 0;
END
$$;
COMMENT ON FUNCTION llm._note_refusal(uuid, text, text, text, date, timestamptz) IS
    'Distributed twin of note_refusal; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.note_refusal(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_now timestamptz DEFAULT now())
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_created boolean;
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now);
    PERFORM llm._check_scope_and_window(p_scope, p_window);
    IF (p_scope = 'organization') <> (p_scope_id IS NULL) OR p_scope_id = '*' THEN
        RAISE EXCEPTION 'llm: a refusal names the id it refused (NULL for the organization scope)'
            USING ERRCODE = '22023',
                  HINT = 'Pass the scope, scope_id and window of the AllowanceExhausted (LL001) refusal.';
    ELSIF p_scope_id IS NOT NULL THEN
        PERFORM llm._check_scope_id('p_scope_id', p_scope_id);
    END IF;
    IF NOT coalesce(pg_catalog.isfinite(p_window_start), false)
       OR llm._window_start(p_window, pg_catalog.timezone('UTC'::text, p_window_start::timestamp)) <> p_window_start THEN
        RAISE EXCEPTION 'llm: % is not the start of a % window', pg_catalog.quote_nullable(p_window_start), p_window
            USING ERRCODE = '22023',
                  HINT = 'Pass the refusal''s window_start: a day, a Monday or the first of a month (UTC).';
    END IF;
    SELECT n INTO v_created
      FROM llm._note_refusal(p_organization_id, p_scope, p_scope_id, p_window, p_window_start,
                             coalesce(p_now, pg_catalog.now())) AS n;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm.note_refusal(uuid, text, text, text, date, timestamptz) IS
    'Reports an admission''s refusal in a transaction of its own: the first report of each limit (the allowance, or a budget for one id) and window owes one limit_reached notice (threshold 0) and returns true; a later one, or one for a limit not in force, writes nothing and returns false.';

-- ---------------------------------------------------------------- views

-- Both views run with the reader's rights (security_invoker), as Citus runs a view's shard
-- queries anyway: a role reads a view only where it may read the tables under it, so
-- llm_app holds SELECT on budget_limits and budget_counters too (sql/99_grants.sql), and a
-- missing grant fails on one node as it would on a cluster (docs/scaling.md).
CREATE OR REPLACE VIEW llm.budgets WITH (security_invoker = true) AS
SELECT b.organization_id, b.scope, b.scope_id, b.budget_window, b.limit_credits, b.thresholds
  FROM llm.budget_limits AS b;
COMMENT ON VIEW llm.budgets IS
    'Every budget set with llm.set_budget (not the monthly allowance, which is in llm.organizations): ''*'' is the default of its scope.';

-- The one read of "the budget in force for a counter: its id's own, else the scope's
-- '*'" (the writers decide by llm._budget_in_force): the report, the metric and the
-- demo read it here. Columns are only ever appended (CREATE OR REPLACE VIEW).
CREATE OR REPLACE VIEW llm.budget_usage WITH (security_invoker = true) AS
SELECT c.organization_id, c.scope, c.scope_id, c.budget_window, c.window_start,
       coalesce(own.limit_credits, dflt.limit_credits) AS limit_credits,
       c.used_credits, c.held_credits, c.used_cents,
       coalesce(own.thresholds, dflt.thresholds) AS thresholds,
       -- the budget's key in llm.budgets (an organization budget's id is NULL)
       CASE WHEN own.organization_id IS NOT NULL THEN own.scope_id ELSE dflt.scope_id END AS budget_scope_id
  FROM llm.budget_counters AS c
  -- An id is NULL for the organization scope only and never '' (_scope_id_ok), so
  -- coalesce(id, '') is the same match as IS NOT DISTINCT FROM, one a hash join can
  -- take: the view stays linear in counters and budgets, not their product.
  LEFT JOIN llm.budget_limits AS own
    ON own.organization_id = c.organization_id AND own.scope = c.scope
   AND own.budget_window = c.budget_window
   AND coalesce(own.scope_id, '') = coalesce(c.scope_id, '')
  LEFT JOIN llm.budget_limits AS dflt
    ON dflt.organization_id = c.organization_id AND dflt.scope = c.scope
   AND dflt.scope_id = '*' AND dflt.budget_window = c.budget_window;
COMMENT ON VIEW llm.budget_usage IS
    'One row per scope id and window that counted a request, under the real id (a default budget''s rows too), with the budget that applies to it now (the id''s own, else the scope''s ''*''): its limit, thresholds and scope_id in llm.budgets (budget_scope_id; NULL columns: none).';
