-- Budgets (docs/architecture.md "Budgets"): a limit per organization, project,
-- API key or end user, per calendar day, week (from Monday) or month in UTC, on
-- top of the organization's monthly allowance. A request names its scope ids at
-- admission; the budgets that apply to it then are fixed on it as bits of its
-- budget_mask (llm.invocations; before 0.4.0, llm.invocation_scopes), one counter each
-- (llm.budget_counters), and every movement of the request moves those counters in
-- the windows of its admission time. Admission checks every one of them, all or
-- nothing (30_admission.sql).
--
-- A bit is 3 * scope + window: scopes organization 0, project 1, api_key 2,
-- end_user 3; windows day 0, week 1, month 2. Bit order is the order a refusal
-- names the first budget that does not fit, and the first key of the counters' lock
-- order (docs/architecture.md "Lock order", row 11): a request has one counter per
-- bit, so any two requests take the counters they share in the same order.
--
-- Striped counters (0.4.0, docs/architecture.md "Striped budget counters"): a
-- counter is 1 to 64 rows, its stripes (llm.set_budget_stripes), and each carries
-- escrow rooms as a period's stripes do (20_stripes.sql): admit_room (credits it may
-- hold on its own), notice_room (usage it may add before the counter could reach a
-- threshold not notified yet) and cents_room (the sum limit), spread under one
-- revision of the organization's budgets (rooms_revision). A request moves the stripe
-- budget_stripe % stripes of each of its counters. Its counters move on their
-- stripes, one by one in bit order, when each fits its stripe's rooms (the fast
-- path); else every one of them takes the exact path in lock order: its stripes
-- locked, the decision made on its totals, the rooms spread again.
--
-- Locks: docs/architecture.md "Lock order", rows 4, 5, 11, 12 and 14.

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

-- The scopes and the windows in bit order: bit 3 * scope + window (_budget_slot), and
-- back (_budget_keys, _move_request_counters). Inlinable constants.
CREATE OR REPLACE FUNCTION llm._budget_scopes()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY['organization', 'project', 'api_key', 'end_user']
$$;
COMMENT ON FUNCTION llm._budget_scopes() IS
    'The budget scopes in bit order (bit 3 * scope + window, scope from 0).';

CREATE OR REPLACE FUNCTION llm._budget_windows()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY['day', 'week', 'month']
$$;
COMMENT ON FUNCTION llm._budget_windows() IS
    'The budget windows in bit order (bit 3 * scope + window, window from 0).';

-- The counters a request with budget_mask p_mask moves: one row per bit set, in
-- bit order (the lock order); every bit but 2 (the organization's month is its
-- allowance, no budget). Reads no table (Citus rule 7).
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
      FROM (SELECT g.slot, (llm._budget_scopes())[g.slot OPERATOR(pg_catalog./) 3 OPERATOR(pg_catalog.+) 1],
                   (llm._budget_windows())[g.slot OPERATOR(pg_catalog.%) 3 OPERATOR(pg_catalog.+) 1]
              FROM (VALUES (0), (1), (3), (4), (5), (6), (7), (8), (9), (10), (11)) AS g(slot))
           AS k(slot, scope, budget_window)
     WHERE (coalesce(p_mask, 0) OPERATOR(pg_catalog.&) (1 OPERATOR(pg_catalog.<<) k.slot)) OPERATOR(pg_catalog.<>) 0
     ORDER BY k.slot
$$;
COMMENT ON FUNCTION llm._budget_keys(integer, text, text, text, timestamptz) IS
    'The budget counters (scope, real id, window, window start) a request admitted at p_at with budget_mask p_mask moves, in bit order.';

-- Every request with each budget counter it moves, one row a counter: the one join of
-- a request to its keys that the readers of many requests share (the audit,
-- invariants 14, 15 and 18, retention's and restriping's open holds). A request of the
-- previous release keeps its bits and scope ids in llm.invocation_scopes. Inlined
-- into each reader's query, whose predicates reach llm.invocations: on Citus, one
-- query per shard as before. No grant: only the owner's routines read it.
CREATE OR REPLACE VIEW llm._invocation_budget_keys AS
SELECT i.organization_id, i.id AS invocation_id, i.status, i.created_at, i.budget_stripe,
       i.hold_credits, i.charged_credits, i.charged_cents, i.recovered_credits,
       k.slot, k.scope, k.scope_id, k.budget_window, k.window_start
  FROM llm.invocations AS i
  LEFT JOIN llm.invocation_scopes AS s
    ON s.organization_id = i.organization_id AND s.invocation_id = i.id AND i.budget_mask IS NULL
 CROSS JOIN LATERAL llm._budget_keys(coalesce(i.budget_mask, s.budget_mask), coalesce(i.project, s.project),
                                     coalesce(i.api_key, s.api_key), coalesce(i.end_user, s.end_user),
                                     i.created_at) AS k;
COMMENT ON VIEW llm._invocation_budget_keys IS
    'Internal: each request (of this release or the previous one) with each budget counter it moves (scope, id, window, window start).';

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
    SELECT 3 OPERATOR(pg_catalog.*) pg_catalog.array_position(llm._budget_scopes(), p_scope)
           OPERATOR(pg_catalog.+) pg_catalog.array_position(llm._budget_windows(), p_window)
           OPERATOR(pg_catalog.-) 4
$$;
COMMENT ON FUNCTION llm._budget_slot(text, text) IS
    'The budget_mask bit of a scope and window (3 * scope + window), NULL for an unknown one.';

-- Inlinable. The bits of the scopes a request names, every window of each: the
-- organization's always (bits 0-2), a project's (3-5), an API key's (6-8) and an end
-- user's (9-11) when it names one.
CREATE OR REPLACE FUNCTION llm._named_scopes_mask(p_project text, p_api_key text, p_end_user text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 7 OPERATOR(pg_catalog.|) CASE WHEN p_project IS NULL THEN 0 ELSE 56 END
             OPERATOR(pg_catalog.|) CASE WHEN p_api_key IS NULL THEN 0 ELSE 448 END
             OPERATOR(pg_catalog.|) CASE WHEN p_end_user IS NULL THEN 0 ELSE 3584 END
$$;
COMMENT ON FUNCTION llm._named_scopes_mask(text, text, text) IS
    'The budget_mask bits of the scopes a request naming these ids falls under: the organization''s, and each scope it names an id of.';

-- The elements of p_values (one a bit of p_of, in bit order) of the bits of p_mask
-- (a subset of p_of), in bit order: the limits or revisions of the budgets that apply
-- to a request among the organization's (30_admission.sql).
CREATE OR REPLACE FUNCTION llm._mask_elements(p_of integer, p_mask integer, p_values anyarray)
RETURNS anyarray
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_out p_values%TYPE := p_values[1:0];  -- empty, of p_values' type
    v_i integer := 0;
BEGIN
    FOR v_slot IN 0 .. 11 LOOP
        CONTINUE WHEN p_of & (1 << v_slot) = 0;
        v_i := v_i + 1;
        IF p_mask & (1 << v_slot) <> 0 THEN
            v_out := v_out || p_values[v_i];
        END IF;
    END LOOP;
    RETURN v_out;
END
$$;
COMMENT ON FUNCTION llm._mask_elements(integer, integer, anyarray) IS
    'Of p_values, one per bit of p_of in bit order, those of the bits of p_mask, in bit order.';

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

-- ---------------------------------------------------------------- the exact path

-- The terms of the budget in force now for one id of a scope and window: its own, else
-- the scope's '*' (NULL fields: none). Matched by the budget's key (an id NULL only for
-- the organization scope), so its index serves it. 0.3.0's _budget_in_force returned
-- two of these columns: a new name rather than a new row under the old one, so that a
-- call of 0.3.0 running as the functions go live keeps the routine it calls (migrate
-- drops the old one after the barrier).
CREATE OR REPLACE FUNCTION llm._budget_terms(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text,
    OUT limit_credits bigint, OUT thresholds integer[], OUT revision uuid, OUT stripes integer)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    SELECT b.limit_credits, b.thresholds, b.revision, coalesce(b.stripes, 1)
      INTO limit_credits, thresholds, revision, stripes
      FROM llm.budget_limits AS b
     WHERE b.organization_id = p_organization_id AND b.scope = p_scope AND b.budget_window = p_window
       AND (b.scope_id = p_scope_id OR (b.scope_id IS NULL AND p_scope_id IS NULL) OR b.scope_id = '*')
     ORDER BY b.scope_id = '*'
     LIMIT 1;
END
$$;
COMMENT ON FUNCTION llm._budget_terms(uuid, text, text, text) IS
    'The limit, thresholds, revision and stripe count of the budget that applies now to one id of a scope and window: its own, else the scope''s ''*''; NULL when none.';

-- A counter (or limit) is found by its key, scope_id NULL for the organization scope:
-- spelled "= OR both NULL", which the key's index serves (two probes in a generic
-- plan), never IS NOT DISTINCT FROM, which no index serves (a scan of every
-- organization's counters, pruning each page it reads, on every settlement).

-- A counter locked for an exact decision, as a period is (_lock_period): stripe 0
-- first, on its own (every stripe is created or removed under its lock), then every
-- stripe in stripe order in a fresh statement, which sees every stripe there is; then
-- its totals. NULL fields: the counter does not exist (never created, or retention
-- took it; a retention that was deleting it is waited for).
CREATE OR REPLACE FUNCTION llm._lock_counter(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    OUT stripes integer, OUT used bigint, OUT held bigint, OUT cents bigint)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM FROM llm.budget_counters AS c
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
       AND c.budget_window = p_window AND c.window_start = p_window_start AND c.stripe = 0
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM FROM llm.budget_counters AS c
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
       AND c.budget_window = p_window AND c.window_start = p_window_start
     ORDER BY c.stripe
       FOR UPDATE;
    SELECT max(c.stripes), sum(c.used_credits), sum(c.held_credits), sum(c.used_cents)
      INTO stripes, used, held, cents
      FROM llm.budget_counters AS c
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
       AND c.budget_window = p_window AND c.window_start = p_window_start;
END
$$;
COMMENT ON FUNCTION llm._lock_counter(uuid, text, text, text, date) IS
    'Locks a budget counter''s stripes in stripe order (stripe 0 first) and returns its stripe count and totals; NULL when it does not exist.';

-- A counter created by the first request admitted under it, with all its stripes.
-- Retention (docs/architecture.md "Budgets"): only the creation of a counter looks at
-- the organization's horizon, and refuses a window that ended on or before it (LL012):
-- its counter may have been purged, and a new one would start from zero. The horizon
-- is read inside the INSERT, and again after it: the INSERT may have waited on the
-- unique key of the very counter a pass was deleting, and only a snapshot taken after
-- that wait sees the horizon the pass committed with the deletion. An existing
-- counter needs no check: it was never purged since it was created, and if retention
-- deletes it meanwhile, the caller's lock waits for the deletion, finds nothing and
-- comes here. (Refusing a counter that a concurrent first request has just created is
-- the conservative side.) Citus: the INSERT's outcome is not read (FOUND and ROW_COUNT
-- lie after a conditional INSERT ... SELECT ... ON CONFLICT there).
CREATE OR REPLACE FUNCTION llm._create_counter(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_stripes integer, p_limit bigint, p_revision uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_end date := llm._window_end(p_window, p_window_start);
    v_horizon date;
BEGIN
    INSERT INTO llm.budget_counters AS c
           (organization_id, scope, scope_id, budget_window, window_start, stripe, stripes,
            admitted_limit, admitted_revision)
    SELECT p_organization_id, p_scope, p_scope_id, p_window, p_window_start, g, p_stripes, p_limit, p_revision
      FROM pg_catalog.generate_series(0, p_stripes - 1) AS g
     WHERE NOT EXISTS (SELECT FROM llm.budget_horizons AS h
                        WHERE h.organization_id = p_organization_id AND v_end <= h.horizon)
    ON CONFLICT (organization_id, scope, scope_id, budget_window, window_start, stripe) DO NOTHING;
    -- the horizon once more, in a snapshot taken after the INSERT
    SELECT h.horizon INTO v_horizon FROM llm.budget_horizons AS h WHERE h.organization_id = p_organization_id;
    IF v_end <= v_horizon THEN
        RAISE EXCEPTION 'llm: % budget window % of organization % is past retention', p_window,
                        p_window_start, p_organization_id
            USING ERRCODE = 'LL012',
                  DETAIL = coalesce(p_scope_id, p_organization_id::text) || E'\n'
                           || pg_catalog.format('scope=%s window=%s window_start=%s horizon=%s',
                                                p_scope, p_window, p_window_start, v_horizon),
                  HINT = 'The window ended on or before the retention horizon, so its counter may be gone: admit with the current clock, or raise budget_retention before such windows are purged.',
                  SCHEMA = 'llm', TABLE = 'budgets', CONSTRAINT = p_scope, COLUMN = p_window;
    END IF;
END
$$;
COMMENT ON FUNCTION llm._create_counter(uuid, text, text, text, date, integer, bigint, uuid) IS
    'Creates a budget counter with its stripes, unless its window ended on or before the organization''s retention horizon (LL012, read again after the INSERT).';

-- A counter's rooms spread again, with its stripes locked: each stripe an even share
-- (the remainder to the first ones) of what the limit it admits against leaves
-- (admit_room, from p_room_limit; the sum limit caps it), of the usage before the next
-- threshold of the budget in force (p_limit, p_thresholds) not notified yet
-- (notice_room; NULL when none is ahead) and of the cents under the sum limit; stamped
-- with the organization's budgets revision they are valid under. No rooms (NULL)
-- without a limit, or before the contract step of 0.4.0 ran (a call of the previous
-- release may still move the counter without them).
CREATE OR REPLACE FUNCTION llm._spread_counter(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_stripes integer, p_used bigint, p_held bigint, p_cents bigint,
    p_room_limit bigint, p_limit bigint, p_thresholds integer[], p_epoch uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_spread boolean := p_room_limit IS NOT NULL AND p_epoch IS NOT NULL AND llm._functions_only();
    v_free bigint;
    v_cents_free bigint;
    v_next integer;
    v_need bigint;
BEGIN
    IF v_spread THEN
        v_free := GREATEST(0, LEAST(p_room_limit, llm._max_sum()) - p_used - p_held);
        v_cents_free := GREATEST(0, llm._max_sum() - p_cents);
        SELECT min(t.pct) INTO v_next
          FROM pg_catalog.unnest(p_thresholds) AS t(pct)
         WHERE p_used::numeric * 100 < t.pct::numeric * p_limit
           AND NOT EXISTS (SELECT FROM llm.threshold_notices AS n
                            WHERE n.organization_id = p_organization_id AND n.scope = p_scope
                              AND (n.scope_id = p_scope_id OR (n.scope_id IS NULL AND p_scope_id IS NULL))
                              AND n.budget_window = p_window AND n.period_start = p_window_start
                              AND n.threshold_pct = t.pct);
        IF v_next IS NOT NULL THEN  -- (none without a budget in force: every threshold crossed owes)
            v_need := pg_catalog.ceil(v_next::numeric * p_limit / 100)::bigint - p_used;
        END IF;
    END IF;
    UPDATE llm.budget_counters AS c
       SET admit_room = CASE WHEN v_spread THEN v_free / p_stripes + (c.stripe < v_free % p_stripes)::integer END,
           cents_room = CASE WHEN v_spread THEN v_cents_free / p_stripes + (c.stripe < v_cents_free % p_stripes)::integer END,
           notice_room = CASE WHEN v_need IS NOT NULL THEN v_need / p_stripes + (c.stripe < v_need % p_stripes)::integer END,
           rooms_revision = CASE WHEN v_spread THEN p_epoch END
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
       AND c.budget_window = p_window AND c.window_start = p_window_start;
END
$$;
COMMENT ON FUNCTION llm._spread_counter(uuid, text, text, text, date, integer, bigint, bigint, bigint, bigint, bigint, integer[], uuid) IS
    'With a budget counter locked: gives each stripe an even share of what p_room_limit leaves (admit_room), of the usage before the next threshold of p_limit not notified (notice_room) and of the cents under the sum limit (cents_room), valid under the organization''s budgets revision p_epoch; none without a limit.';

-- The exact path of one counter: its stripes locked in order, the decision on its
-- totals, the movement of each request on its stripe (p_seeds: their budget_stripe),
-- the thresholds crossed, the rooms spread again. An admission (p_admit_limit, the
-- limit read with its budget mask, and that budget's revision) creates a missing
-- counter and is refused unless used + held + estimate fits (LL001, the id the
-- DETAIL's first line, the one part of a DETAIL code may read: docs/contract.md
-- "Errors"); another movement of a counter retention took moves nothing. Growth past
-- the sum limit is LL013. Crossings and rooms follow the budget in force now, read
-- with the counter locked, so a set_budget that held it is seen; the limit a counter
-- admits against (admitted_limit) is the one its rooms are spread under.
-- Long on purpose: the one exact decision of a counter, read top to bottom.
CREATE OR REPLACE FUNCTION llm._move_counter(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_seeds smallint[], p_used bigint[], p_held bigint[], p_cents bigint[], p_priced bigint[],
    p_admit_limit bigint, p_admit_revision uuid, p_epoch uuid, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_counter record;
    v_budget record;
    v_used bigint := 0;
    v_held bigint := 0;
    v_cents bigint := 0;
    v_stripe integer;
    v_one_used bigint;
    v_one_held bigint;
    v_one_cents bigint;
    v_one_priced bigint;
    v_limit bigint;
    v_created integer := 0;
BEGIN
    FOR v_i IN 1 .. pg_catalog.cardinality(p_seeds) LOOP
        v_used := v_used + p_used[v_i];
        v_held := v_held + p_held[v_i];
        v_cents := v_cents + p_cents[v_i];
    END LOOP;
    SELECT * INTO v_counter FROM llm._lock_counter(p_organization_id, p_scope, p_scope_id, p_window, p_window_start);
    IF v_counter.stripes IS NULL THEN
        IF p_admit_limit IS NULL THEN
            RETURN 0;  -- retention took its window: its requests keep their figures
        END IF;
        SELECT * INTO v_budget FROM llm._budget_terms(p_organization_id, p_scope, p_scope_id, p_window);
        PERFORM llm._create_counter(p_organization_id, p_scope, p_scope_id, p_window, p_window_start,
                                    coalesce(v_budget.stripes, 1), p_admit_limit, p_admit_revision);
        SELECT * INTO v_counter FROM llm._lock_counter(p_organization_id, p_scope, p_scope_id, p_window, p_window_start);
    END IF;

    IF p_admit_limit IS NOT NULL AND v_counter.used + v_counter.held + v_held > p_admit_limit THEN
        RAISE EXCEPTION 'llm: % budget exhausted for organization %', p_window, p_organization_id
            USING ERRCODE = 'LL001',
                  DETAIL = coalesce(p_scope_id, p_organization_id::text) || E'\n'
                           || pg_catalog.format('scope=%s window=%s window_start=%s limit=%s used=%s held=%s estimate=%s',
                                                p_scope, p_window, p_window_start, p_admit_limit,
                                                v_counter.used, v_counter.held, v_held),
                  HINT = 'Wait for holds to settle or for the next window, lower the estimate, or raise the budget with llm.set_budget.',
                  SCHEMA = 'llm', TABLE = 'budgets', CONSTRAINT = p_scope, COLUMN = p_window;
    END IF;
    -- the sum limit (LL013): used + held and used cents never grow past it (an overage
    -- of requests admitted with estimate 0, a week across two periods)
    IF v_used + v_held > 0 AND v_counter.used::numeric + v_counter.held + v_used + v_held > llm._max_sum() THEN
        PERFORM llm._refuse_sum('budget_counters', CASE WHEN v_held > 0 THEN 'held_credits' ELSE 'used_credits' END,
                                v_counter.used::numeric + v_counter.held + v_used + v_held,
                                pg_catalog.format('the %s budget counter %s of %s', p_window, p_window_start, p_scope));
    END IF;
    IF v_cents > 0 AND v_counter.cents::numeric + v_cents > llm._max_sum() THEN
        PERFORM llm._refuse_sum('budget_counters', 'used_cents', v_counter.cents::numeric + v_cents,
                                pg_catalog.format('the %s budget counter %s of %s', p_window, p_window_start, p_scope));
    END IF;

    -- each request on its stripe (a request of the previous release: stripe 0); each
    -- figure read into a variable first (Citus: no array element in an UPDATE)
    FOR v_i IN 1 .. pg_catalog.cardinality(p_seeds) LOOP
        v_stripe := coalesce(p_seeds[v_i], 0) % v_counter.stripes;
        v_one_used := p_used[v_i];
        v_one_held := p_held[v_i];
        v_one_cents := p_cents[v_i];
        v_one_priced := p_priced[v_i];
        UPDATE llm.budget_counters AS c
           SET used_credits = c.used_credits + v_one_used,
               held_credits = c.held_credits + v_one_held,
               used_cents = c.used_cents + v_one_cents,
               priced_nanos = c.priced_nanos + v_one_priced
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
           AND c.budget_window = p_window AND c.window_start = p_window_start AND c.stripe = v_stripe;
    END LOOP;

    SELECT * INTO v_budget FROM llm._budget_terms(p_organization_id, p_scope, p_scope_id, p_window);
    IF v_used > 0 AND coalesce(llm._may_cross(v_counter.used, v_counter.used + v_used, v_budget.limit_credits), false) THEN
        v_created := llm._owe_notices(p_organization_id, p_window_start, v_budget.thresholds,
                                      v_counter.used + v_used, v_budget.limit_credits, p_now,
                                      p_scope, p_scope_id, p_window, v_counter.used);
    END IF;

    -- The limit the rooms are spread under, and recorded as the one the counter admits
    -- against: an admission's own; else the budget in force, once the counter stands
    -- within it (a lowered limit leaves no room and the last admission's limit stays).
    IF p_admit_limit IS NOT NULL THEN
        v_limit := p_admit_limit;
        UPDATE llm.budget_counters AS c
           SET admitted_limit = p_admit_limit, admitted_revision = p_admit_revision
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
           AND c.budget_window = p_window AND c.window_start = p_window_start;
    ELSIF v_budget.limit_credits >= v_counter.used + v_counter.held + v_used + v_held THEN
        v_limit := v_budget.limit_credits;
        UPDATE llm.budget_counters AS c
           SET admitted_limit = v_budget.limit_credits, admitted_revision = v_budget.revision
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
           AND c.budget_window = p_window AND c.window_start = p_window_start;
    ELSIF v_budget.limit_credits IS NOT NULL THEN
        v_limit := v_counter.used + v_counter.held + v_used + v_held;  -- over it: no room
    END IF;
    PERFORM llm._spread_counter(p_organization_id, p_scope, p_scope_id, p_window, p_window_start,
                                v_counter.stripes, v_counter.used + v_used, v_counter.held + v_held,
                                v_counter.cents + v_cents, v_limit, v_budget.limit_credits,
                                v_budget.thresholds, p_epoch);
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._move_counter(uuid, text, text, text, date, smallint[], bigint[], bigint[], bigint[], bigint[], bigint, uuid, uuid, timestamptz) IS
    'The exact path of one budget counter: locks its stripes in order (creating it for an admission, LL012 past retention), refuses an admission that does not fit p_admit_limit (LL001) and growth past the sum limit (LL013), moves each request on its stripe, owes the thresholds its total crossed under the budget in force and spreads its rooms again; returns the notices created.';

-- ---------------------------------------------------------------- the fast path

-- One counter moved on the request's stripe of it (p_stripe modulo its stripes), iff
-- that is stripe 0 (p_off_zero false) or not (true), and the movement fits the
-- stripe's rooms under the organization's budgets revision p_epoch (p_used: charge in,
-- p_held: hold in or out, p_cents): its share of what the counter has left must fit
-- admit_room, its usage notice_room, its cents cents_room. False: nothing moved.
-- One UPDATE by the counter's full key, scope_id included in the index probe in its
-- generic plan too, at any statistics and any number of ids and windows retained
-- (tests/test_budget_write_shape.py). Hence two statements: spelled "= OR both
-- NULL", the generic plan probed only (organization, scope) and filtered every id and
-- window of the scope (no statistics yet), or made two probes under a BitmapOr (with
-- them). The organization scope's counters are the ones whose id is NULL.
-- Not one statement for all of a request's counters: joined to the keys, the planner
-- costed each call's custom plan below the generic one, so PL/pgSQL planned it again
-- on every call (233 us of 290 us, pg_stat_statements.track_planning), and a generic
-- plan of the join scans the table when one organization holds most counters. A SET
-- plan_cache_mode clause is no way out: Citus cannot plan a delegated routine's shard
-- queries under it (tests/test_citus_readiness.py).
CREATE OR REPLACE FUNCTION llm._move_within_counter_room(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_stripe integer, p_off_zero boolean, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint,
    p_epoch uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_scope_id IS NOT NULL THEN
        UPDATE llm.budget_counters AS c
           SET used_credits = c.used_credits + p_used,
               held_credits = c.held_credits + p_held,
               used_cents = c.used_cents + p_cents,
               priced_nanos = c.priced_nanos + p_priced,
               admit_room = c.admit_room - GREATEST(0, p_used + p_held),
               cents_room = c.cents_room - p_cents,
               notice_room = c.notice_room - p_used
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope AND c.scope_id = p_scope_id
           AND c.budget_window = p_window AND c.window_start = p_window_start
           AND c.stripe = p_stripe % c.stripes AND (c.stripe <> 0) = p_off_zero
           AND c.rooms_revision = p_epoch
           AND p_used >= 0
           AND c.admit_room >= p_used + p_held
           AND c.cents_room >= p_cents
           -- a movement of nothing fits only a positive room (as a period's stripe)
           AND (c.admit_room > 0 OR p_used <> 0 OR p_held <> 0)
           AND (c.notice_room IS NULL OR p_used = 0 OR c.notice_room > p_used);
        RETURN FOUND;
    END IF;
    UPDATE llm.budget_counters AS c
       SET used_credits = c.used_credits + p_used,
           held_credits = c.held_credits + p_held,
           used_cents = c.used_cents + p_cents,
           priced_nanos = c.priced_nanos + p_priced,
           admit_room = c.admit_room - GREATEST(0, p_used + p_held),
           cents_room = c.cents_room - p_cents,
           notice_room = c.notice_room - p_used
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope AND c.scope_id IS NULL
       AND c.budget_window = p_window AND c.window_start = p_window_start
       AND c.stripe = p_stripe % c.stripes AND (c.stripe <> 0) = p_off_zero
       AND c.rooms_revision = p_epoch
       AND p_used >= 0
       AND c.admit_room >= p_used + p_held
       AND c.cents_room >= p_cents
       -- a movement of nothing fits only a positive room (as a period's stripe)
       AND (c.admit_room > 0 OR p_used <> 0 OR p_held <> 0)
       AND (c.notice_room IS NULL OR p_used = 0 OR c.notice_room > p_used);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION llm._move_within_counter_room(uuid, text, text, text, date, integer, boolean, bigint, bigint, bigint, bigint, uuid) IS
    'Moves one budget counter on the request''s stripe of it (when that is stripe 0, or when it is not: p_off_zero) iff the movement fits that stripe''s rooms under revision p_epoch; false (nothing moved) otherwise.';

-- One request's movement of all its counters (p_admit_limits and p_admit_revisions:
-- an admission's, in bit order; NULL otherwise), counter by counter in bit order (the
-- lock order): within its stripe's rooms when it fits, else by its exact path. As for
-- a period's stripes (20_stripes.sql says why), a try on stripe 0 needs no
-- subtransaction: an UPDATE that waited and lost can keep only that row, which the
-- exact path locks first; a try on another stripe (a striped counter) runs in one, so
-- the exact path never waits for a stripe below one it holds. A counter of one stripe
-- (the default) thus costs one UPDATE. The request comes as the fields its counters'
-- keys are made of (its budget_mask, scope ids, admission time and budget_stripe), so
-- that settlement reads no more of its row than it updates; one of the previous
-- release keeps them in llm.invocation_scopes (_move_budgets).
CREATE OR REPLACE FUNCTION llm._move_request_counters(
    p_organization_id uuid, p_mask integer, p_project text, p_api_key text, p_end_user text,
    p_created_at timestamptz, p_budget_stripe smallint,
    p_used bigint, p_held bigint, p_cents bigint, p_priced bigint,
    p_admit_limits bigint[], p_admit_revisions uuid[], p_epoch uuid, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_i integer := 0;
    v_scope text;
    v_id text;
    v_window text;
    v_start date;
    v_stripe integer := coalesce(p_budget_stripe, 0);
    v_moved boolean;
    v_created integer := 0;
BEGIN
    -- its keys as _budget_keys gives them, bit by bit in plain PL/pgSQL (a query a
    -- call cost 13 us more, measured)
    FOR v_slot IN 0 .. 11 LOOP
        CONTINUE WHEN p_mask & (1 << v_slot) = 0;
        v_i := v_i + 1;  -- the keys and the arrays are both in bit order
        v_scope := (llm._budget_scopes())[v_slot / 3 + 1];
        v_window := (llm._budget_windows())[v_slot % 3 + 1];
        v_id := CASE WHEN v_slot / 3 = 1 THEN p_project WHEN v_slot / 3 = 2 THEN p_api_key
                     WHEN v_slot / 3 = 3 THEN p_end_user END;
        v_start := llm._window_start(v_window, p_created_at);
        v_moved := llm._move_within_counter_room(p_organization_id, v_scope, v_id, v_window, v_start, v_stripe, false,
                                                 p_used, p_held, p_cents, p_priced, p_epoch);
        IF NOT v_moved THEN
            BEGIN
                IF NOT llm._move_within_counter_room(p_organization_id, v_scope, v_id, v_window, v_start, v_stripe, true,
                                                     p_used, p_held, p_cents, p_priced, p_epoch) THEN
                    -- internal: only rolls this subtransaction back, never leaves the function
                    RAISE EXCEPTION 'llm: not within the counter''s rooms' USING ERRCODE = 'LL099';
                END IF;
                v_moved := true;
            EXCEPTION WHEN SQLSTATE 'LL099' THEN
                NULL;
            END;
        END IF;
        IF NOT v_moved THEN
            v_created := v_created
                + llm._move_counter(p_organization_id, v_scope, v_id, v_window, v_start, ARRAY[p_budget_stripe],
                                    ARRAY[p_used], ARRAY[p_held], ARRAY[p_cents], ARRAY[p_priced],
                                    p_admit_limits[v_i], p_admit_revisions[v_i], p_epoch, p_now);
        END IF;
    END LOOP;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._move_request_counters(uuid, integer, text, text, text, timestamptz, smallint, bigint, bigint, bigint, bigint, bigint[], uuid[], uuid, timestamptz) IS
    'Moves every budget counter of one request (its budget_mask, scope ids, admission time and budget_stripe) in bit order: each on its stripe when it fits that stripe''s rooms, else by its exact path; returns the notices created.';

-- ---------------------------------------------------------------- movements

-- The organization's budgets revision (what a counter's rooms are valid under), read
-- before any counter is locked.
CREATE OR REPLACE FUNCTION llm._budgets_revision(p_organization_id uuid)
RETURNS uuid
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_revision uuid;
BEGIN
    SELECT o.budgets_revision INTO v_revision FROM llm.organizations AS o WHERE o.id = p_organization_id;
    RETURN v_revision;
END
$$;
COMMENT ON FUNCTION llm._budgets_revision(uuid) IS
    'The organization''s budgets revision: the one a budget counter''s rooms must be spread under to serve a movement.';

-- The movements of many requests (a recovery batch; or a true-up, p_true_up: the signed
-- difference), each counter by its exact path in lock order (bit, id, window start),
-- each request on its stripe. Their scope ids and budget_mask are read from them (or,
-- for requests of the previous release, from llm.invocation_scopes).
CREATE OR REPLACE FUNCTION llm._move_budgets(
    p_organization_id uuid, p_invs llm.invocations[], p_true_up boolean, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_move record;
    v_epoch uuid := llm._budgets_revision(p_organization_id);
    v_created integer := 0;
BEGIN
    FOR v_move IN
        SELECT k.slot, k.scope, k.scope_id, k.budget_window, k.window_start,
               pg_catalog.array_agg(i.budget_stripe) AS seeds,
               pg_catalog.array_agg(CASE WHEN p_true_up THEN i.charged_credits - i.recovered_credits
                                         ELSE i.charged_credits END::bigint) AS used,
               pg_catalog.array_agg(CASE WHEN p_true_up THEN 0 ELSE -i.hold_credits END::bigint) AS held,
               pg_catalog.array_agg(coalesce(i.charged_cents, 0)::bigint) AS cents,
               pg_catalog.array_agg(coalesce(i.cost_nanos, 0)::bigint) AS priced
          FROM pg_catalog.unnest(p_invs) AS i
          LEFT JOIN llm.invocation_scopes AS s
            ON s.organization_id = p_organization_id AND s.invocation_id = i.id AND i.budget_mask IS NULL
         CROSS JOIN LATERAL llm._budget_keys(coalesce(i.budget_mask, s.budget_mask), coalesce(i.project, s.project),
                                             coalesce(i.api_key, s.api_key), coalesce(i.end_user, s.end_user),
                                             i.created_at) AS k
         GROUP BY k.slot, k.scope, k.scope_id, k.budget_window, k.window_start
         ORDER BY k.slot, k.scope_id, k.window_start
    LOOP
        v_created := v_created
            + llm._move_counter(p_organization_id, v_move.scope, v_move.scope_id, v_move.budget_window,
                                v_move.window_start, v_move.seeds, v_move.used, v_move.held, v_move.cents,
                                v_move.priced, NULL, NULL, v_epoch, p_now);
    END LOOP;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._move_budgets(uuid, llm.invocations[], boolean, timestamptz) IS
    'Moves the budget counters of the given requests (terminal: charge in, hold out; p_true_up: the signed difference), each counter by its exact path in lock order, refusing growth past the sum limit (LL013), and owes the thresholds they crossed; returns the notices created.';

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
--    (LL012, _create_counter), so a purged window is never admitted again. The
--    oldest open request is looked for only before the horizon, from the open floor
--    of the period stripes (20_stripes.sql): no open request is admitted earlier.
-- 3. A counter's stripes are locked in the lock order (bit, scope id, window start,
--    stripe), skipping any a call holds (the next pass takes them), and a counter
--    goes whole, by a second statement (a fresh snapshot), only if every stripe of it
--    was locked, none holds anything and no open request is admitted under it (one
--    admitted with estimate 0 holds nothing).
-- Returns how many counters went.
CREATE OR REPLACE FUNCTION llm._retain_budgets(
    p_organization_id uuid, p_now timestamptz, p_retention interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_horizon date := llm._window_start('day', LEAST(p_now, pg_catalog.now()) - p_retention);
    v_floor timestamptz := llm._open_floor(p_organization_id);
    v_oldest_open timestamptz;
    v_locked uuid[];
    v_deleted integer;
BEGIN
    IF v_floor < (v_horizon::timestamp AT TIME ZONE 'UTC') THEN
        SELECT min(i.created_at) INTO v_oldest_open
          FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id
           AND i.created_at >= v_floor AND i.created_at < (v_horizon::timestamp AT TIME ZONE 'UTC')
           AND i.status IN ('reserved', 'dispatched');
        v_horizon := LEAST(v_horizon, llm._window_start('day', v_oldest_open));
    END IF;
    INSERT INTO llm.budget_horizons AS h (organization_id, horizon, updated_at)
    VALUES (p_organization_id, v_horizon, p_now)
    ON CONFLICT (organization_id) DO UPDATE
       SET horizon = GREATEST(h.horizon, excluded.horizon), updated_at = excluded.updated_at
    RETURNING h.horizon INTO v_horizon;

    SELECT pg_catalog.array_agg(l.id) INTO v_locked
      FROM (SELECT c.id FROM llm.budget_counters AS c
             WHERE c.organization_id = p_organization_id AND c.held_credits = 0
               AND llm._window_end(c.budget_window, c.window_start) <= v_horizon
             ORDER BY llm._budget_slot(c.scope, c.budget_window), c.scope_id, c.window_start, c.stripe
               FOR UPDATE SKIP LOCKED) AS l;
    IF v_locked IS NULL THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM llm.budget_counters AS c
         WHERE c.organization_id = p_organization_id AND c.id = ANY (v_locked) AND c.held_credits = 0
           -- the whole counter: every stripe of it locked here, and holding nothing
           AND NOT EXISTS (
                 SELECT FROM llm.budget_counters AS o
                  WHERE o.organization_id = p_organization_id AND o.scope = c.scope
                    AND (o.scope_id = c.scope_id OR (o.scope_id IS NULL AND c.scope_id IS NULL))
                    AND o.budget_window = c.budget_window AND o.window_start = c.window_start
                    AND (o.id <> ALL (v_locked) OR o.held_credits <> 0))
           AND NOT EXISTS (
                 SELECT FROM llm._invocation_budget_keys AS k
                  WHERE k.organization_id = p_organization_id
                    AND k.status IN ('reserved', 'dispatched')
                    -- none open: no time; never a NULL the planner folds the subquery
                    -- away with, which leaves Citus a join it cannot route (0A000)
                    AND k.created_at >= coalesce(v_floor, 'infinity')
                    AND k.created_at < (llm._window_end(c.budget_window, c.window_start)::timestamp AT TIME ZONE 'UTC')
                    AND k.scope = c.scope AND k.budget_window = c.budget_window
                    AND k.window_start = c.window_start
                    AND (k.scope_id = c.scope_id OR (k.scope_id IS NULL AND c.scope_id IS NULL)))
        RETURNING c.stripe)
    SELECT count(*) FILTER (WHERE g.stripe = 0) INTO v_deleted FROM gone AS g;
    RETURN v_deleted;
END
$$;
COMMENT ON FUNCTION llm._retain_budgets(uuid, timestamptz, interval) IS
    'Raises the organization''s retention horizon (LEAST(p_now, now()) - p_retention, never past its oldest open request''s day) and deletes the counters of windows ended on or before it that hold nothing and no open request is admitted under, all their stripes locked in lock order, skipping locked ones; returns how many counters.';

-- ---------------------------------------------------------------- set_budget

-- The organization's row held for a change of its budgets (the lock order's row 4,
-- first of such a change: docs/architecture.md "Lock order"); LL002 for an unknown
-- organization.
CREATE OR REPLACE FUNCTION llm._lock_budgets_of(p_organization_id uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM FROM llm.organizations AS o WHERE o.id = p_organization_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
END
$$;
COMMENT ON FUNCTION llm._lock_budgets_of(uuid) IS
    'Locks the organization''s row (FOR NO KEY UPDATE) for a change of its budgets; LL002 for an unknown organization.';

-- The ids of a scope with a budget of their own for a window: those its '*' budget
-- does not govern. PL/pgSQL: it reads a distributed table (Citus rule 7).
CREATE OR REPLACE FUNCTION llm._own_budget_ids(p_organization_id uuid, p_scope text, p_window text)
RETURNS text[]
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_own text[];
BEGIN
    SELECT coalesce(pg_catalog.array_agg(b.scope_id), '{}') INTO v_own
      FROM llm.budget_limits AS b
     WHERE b.organization_id = p_organization_id AND b.scope = p_scope
       AND b.budget_window = p_window AND b.scope_id <> '*';
    RETURN v_own;
END
$$;
COMMENT ON FUNCTION llm._own_budget_ids(uuid, text, text) IS
    'The ids of p_scope with a budget of their own for p_window (not governed by its ''*'' budget).';

-- What a set, changed or removed budget owes at once, in the window containing p_now:
-- every threshold the counters it now governs stand at or above, under the budget that
-- applies to each now, as a changed allowance owes its own. Their stripes are locked in
-- the lock order (scope id, then stripe), so a movement waits for this or this for it,
-- and the later one reads the other's figures; their rooms are dropped, so a movement
-- that read the organization's budgets revision before this committed and waited here
-- takes the exact path, under the budget in force.
CREATE OR REPLACE FUNCTION llm._budget_reached(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_start date := llm._window_start(p_window, p_now);
    v_own text[] := ARRAY[]::text[];
    v_counter record;
    v_created integer := 0;
    v_budget record;
BEGIN
    IF p_scope_id = '*' THEN
        v_own := llm._own_budget_ids(p_organization_id, p_scope, p_window);
    END IF;
    PERFORM FROM llm.budget_counters AS c
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND c.budget_window = p_window AND c.window_start = v_start
       AND (c.scope_id IS NOT DISTINCT FROM p_scope_id OR (p_scope_id = '*' AND c.scope_id <> ALL (v_own)))
     ORDER BY c.scope_id, c.stripe
       FOR UPDATE;
    UPDATE llm.budget_counters AS c
       SET admit_room = NULL, notice_room = NULL, cents_room = NULL, rooms_revision = NULL
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND c.budget_window = p_window AND c.window_start = v_start
       AND (c.scope_id IS NOT DISTINCT FROM p_scope_id OR (p_scope_id = '*' AND c.scope_id <> ALL (v_own)));
    FOR v_counter IN
        SELECT c.scope_id, sum(c.used_credits)::bigint AS used
          FROM llm.budget_counters AS c
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND c.budget_window = p_window AND c.window_start = v_start
           AND (c.scope_id IS NOT DISTINCT FROM p_scope_id OR (p_scope_id = '*' AND c.scope_id <> ALL (v_own)))
         GROUP BY c.scope_id
         ORDER BY c.scope_id
    LOOP
        SELECT * INTO v_budget
          FROM llm._budget_terms(p_organization_id, p_scope, v_counter.scope_id, p_window);
        CONTINUE WHEN v_budget.limit_credits IS NULL;
        v_created := v_created
            + llm._owe_notices(p_organization_id, v_start, v_budget.thresholds, v_counter.used,
                               v_budget.limit_credits, p_now, p_scope, v_counter.scope_id, p_window);
    END LOOP;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION llm._budget_reached(uuid, text, text, text, timestamptz) IS
    'With the budget just changed: locks the stripes of the counters it governs in the window containing p_now (one id, or every id without its own budget for ''*''), drops their rooms and owes every threshold they stand at or above under the budget that applies to each now.';

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

-- The organization's row, locked first (the lock order of every change of it), with
-- whether it has a budget now and a new budgets revision (none without a budget): the
-- rooms of its counters spread before serve no movement that reads the new one. And,
-- when no budget names an id, the budgets themselves (uniform_budget_mask, their
-- limits and revisions in bit order): admission then finds what applies to a request
-- from the scopes it names, without reading a budget (30_admission.sql). Every caller
-- holds the organization's row, so the budgets read here are those it writes.
CREATE OR REPLACE FUNCTION llm._budgets_changed(p_organization_id uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_revision uuid := pg_catalog.gen_random_uuid();  -- before the UPDATE (Citus rule 6)
    v_has boolean;
    v_named boolean;  -- a budget names an id
    v_mask integer;
    v_limits bigint[];
    v_revisions uuid[];
BEGIN
    SELECT pg_catalog.count(*) > 0, coalesce(pg_catalog.bool_or(b.scope_id <> '*'), false),
           coalesce(pg_catalog.sum(1 << llm._budget_slot(b.scope, b.budget_window)), 0),
           pg_catalog.array_agg(b.limit_credits ORDER BY llm._budget_slot(b.scope, b.budget_window)),
           pg_catalog.array_agg(b.revision ORDER BY llm._budget_slot(b.scope, b.budget_window))
      INTO v_has, v_named, v_mask, v_limits, v_revisions
      FROM llm.budget_limits AS b
     WHERE b.organization_id = p_organization_id;
    UPDATE llm.organizations AS o
       SET has_budgets = v_has, budgets_revision = CASE WHEN v_has THEN v_revision END,
           uniform_budget_mask = CASE WHEN NOT v_named THEN v_mask END,
           uniform_budget_limits = CASE WHEN NOT v_named THEN coalesce(v_limits, '{}') END,
           uniform_budget_revisions = CASE WHEN NOT v_named THEN coalesce(v_revisions, '{}') END
     WHERE o.id = p_organization_id;
END
$$;
COMMENT ON FUNCTION llm._budgets_changed(uuid) IS
    'Records that one of the organization''s budgets changed: whether it has a budget now, a new budgets revision, and its budgets when none names an id (uniform_budget_mask).';

CREATE OR REPLACE FUNCTION llm._set_budget(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint,
    p_thresholds integer[], p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_revision uuid := pg_catalog.gen_random_uuid();  -- before the INSERT (Citus rule 6)
    v_existed boolean;
BEGIN
    -- lock order: the organization's row, the budget's row, its counters
    PERFORM llm._lock_budgets_of(p_organization_id);
    -- (every change of the organization's budgets holds its row: this read stays true)
    v_existed := EXISTS (SELECT FROM llm.budget_limits AS b
                          WHERE b.organization_id = p_organization_id AND b.scope = p_scope
                            AND (b.scope_id = p_scope_id OR (b.scope_id IS NULL AND p_scope_id IS NULL))
                            AND b.budget_window = p_window);
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
    IF p_limit_credits IS NOT NULL OR v_existed THEN  -- (a missing budget removed: no change)
        PERFORM llm._budgets_changed(p_organization_id);
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

-- ---------------------------------------------------------------- stripes

-- A counter spread over a new number of stripes, its stripes locked in order (stripe
-- 0 first: stripes come and go under its lock): its stripes become 0 .. p_stripes - 1,
-- each holding exactly the holds of the open requests on it (budget_stripe %
-- p_stripes; read from the open floor of the period stripes, no open request is
-- admitted earlier), its used credits and cents on stripe 0 (only their sums mean
-- anything), its rooms dropped until its next exact movement spreads them.
CREATE OR REPLACE FUNCTION llm._restripe_counter(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date,
    p_stripes integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_counter record;
    v_holds bigint[];
    v_held bigint;
    v_priced numeric;
    v_floor timestamptz := GREATEST(llm._open_floor(p_organization_id),
                                    p_window_start::timestamp AT TIME ZONE 'UTC');
    v_end timestamptz := llm._window_end(p_window, p_window_start)::timestamp AT TIME ZONE 'UTC';
BEGIN
    SELECT * INTO v_counter FROM llm._lock_counter(p_organization_id, p_scope, p_scope_id, p_window, p_window_start);
    IF v_counter.stripes IS NULL OR v_counter.stripes = p_stripes THEN
        RETURN;
    END IF;
    SELECT sum(c.priced_nanos) INTO v_priced  -- its stripes locked above
      FROM llm.budget_counters AS c
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
       AND c.budget_window = p_window AND c.window_start = p_window_start;
    -- the holds of its open requests, by their stripe under the new count
    SELECT pg_catalog.array_agg(coalesce(h.held, 0) ORDER BY g) INTO v_holds
      FROM pg_catalog.generate_series(0, p_stripes - 1) AS g
      LEFT JOIN (SELECT coalesce(k.budget_stripe, 0) % p_stripes AS stripe, sum(k.hold_credits)::bigint AS held
                   FROM llm._invocation_budget_keys AS k
                  WHERE k.organization_id = p_organization_id
                    AND k.created_at >= v_floor AND k.created_at < v_end
                    AND k.status IN ('reserved', 'dispatched')
                    AND k.scope = p_scope AND k.budget_window = p_window AND k.window_start = p_window_start
                    AND (k.scope_id = p_scope_id OR (k.scope_id IS NULL AND p_scope_id IS NULL))
                  GROUP BY 1) AS h ON h.stripe = g;
    DELETE FROM llm.budget_counters AS c
     WHERE c.organization_id = p_organization_id AND c.scope = p_scope
       AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
       AND c.budget_window = p_window AND c.window_start = p_window_start AND c.stripe >= p_stripes;
    INSERT INTO llm.budget_counters AS c
           (organization_id, scope, scope_id, budget_window, window_start, stripe, stripes,
            admitted_limit, admitted_revision)
    SELECT c0.organization_id, c0.scope, c0.scope_id, c0.budget_window, c0.window_start, g, p_stripes,
           c0.admitted_limit, c0.admitted_revision
      FROM llm.budget_counters AS c0
     CROSS JOIN pg_catalog.generate_series(v_counter.stripes, p_stripes - 1) AS g
     WHERE c0.organization_id = p_organization_id AND c0.scope = p_scope
       AND (c0.scope_id = p_scope_id OR (c0.scope_id IS NULL AND p_scope_id IS NULL))
       AND c0.budget_window = p_window AND c0.window_start = p_window_start AND c0.stripe = 0;
    FOR v_stripe IN 0 .. p_stripes - 1 LOOP
        v_held := v_holds[v_stripe + 1];  -- a variable: Citus reads no array element in an UPDATE
        UPDATE llm.budget_counters AS c
           SET stripes = p_stripes,
               used_credits = CASE WHEN v_stripe = 0 THEN v_counter.used ELSE 0 END,
               used_cents = CASE WHEN v_stripe = 0 THEN v_counter.cents ELSE 0 END,
               priced_nanos = CASE WHEN v_stripe = 0 THEN v_priced ELSE 0 END,
               held_credits = v_held,
               admit_room = NULL, notice_room = NULL, cents_room = NULL, rooms_revision = NULL
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND (c.scope_id = p_scope_id OR (c.scope_id IS NULL AND p_scope_id IS NULL))
           AND c.budget_window = p_window AND c.window_start = p_window_start AND c.stripe = v_stripe;
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm._restripe_counter(uuid, text, text, text, date, integer) IS
    'Spreads a budget counter over p_stripes stripes, its stripes locked in order: each holds the holds of its open requests (budget_stripe % p_stripes), stripe 0 its used credits, cents and priced nanos; its rooms dropped.';

CREATE OR REPLACE FUNCTION llm._set_budget_stripes(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_start date := llm._window_start(p_window, p_now);
    v_own text[] := ARRAY[]::text[];
    v_id record;
BEGIN
    -- lock order: the organization's row, the budget's row, its counters (scope id,
    -- then stripe), as set_budget
    PERFORM llm._lock_budgets_of(p_organization_id);
    UPDATE llm.budget_limits AS b
       SET stripes = p_stripes
     WHERE b.organization_id = p_organization_id AND b.scope = p_scope
       AND (b.scope_id = p_scope_id OR (b.scope_id IS NULL AND p_scope_id IS NULL))
       AND b.budget_window = p_window;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'llm: organization % has no % % budget for %', p_organization_id, p_scope, p_window,
                        coalesce(pg_catalog.quote_literal(p_scope_id), 'the organization')
            USING ERRCODE = '22023',
                  HINT = 'Set the budget with llm.set_budget first; its stripes spread the counters it governs.';
    END IF;
    PERFORM llm._budgets_changed(p_organization_id);
    -- The counters it governs in the window containing p_now, spread at once (a hot
    -- key needs it now); those of other windows keep the count they were created with.
    IF p_scope_id = '*' THEN
        v_own := llm._own_budget_ids(p_organization_id, p_scope, p_window);
    END IF;
    FOR v_id IN
        SELECT DISTINCT c.scope_id FROM llm.budget_counters AS c
         WHERE c.organization_id = p_organization_id AND c.scope = p_scope
           AND c.budget_window = p_window AND c.window_start = v_start
           AND (c.scope_id IS NOT DISTINCT FROM p_scope_id OR (p_scope_id = '*' AND c.scope_id <> ALL (v_own)))
         ORDER BY c.scope_id
    LOOP
        PERFORM llm._restripe_counter(p_organization_id, p_scope, v_id.scope_id, p_window, v_start, p_stripes);
    END LOOP;
    RETURN p_stripes;
END
$$;
COMMENT ON FUNCTION llm._set_budget_stripes(uuid, text, text, text, integer, timestamptz) IS
    'Distributed twin of set_budget_stripes; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.set_budget_stripes(
    p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer,
    p_now timestamptz DEFAULT now())
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_stripes integer;
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now);
    PERFORM llm._check_scope_and_window(p_scope, p_window);
    IF (p_scope = 'organization') <> (p_scope_id IS NULL) THEN
        RAISE EXCEPTION 'llm: a % budget % a scope id', p_scope,
                        CASE WHEN p_scope = 'organization' THEN 'takes no' ELSE 'needs' END
            USING ERRCODE = '22023', HINT = 'Pass the budget''s scope id as llm.set_budget took it (''*'' for a default, NULL for the organization scope).';
    ELSIF p_scope_id IS NOT NULL AND p_scope_id <> '*' THEN
        PERFORM llm._check_scope_id('p_scope_id', p_scope_id);
    END IF;
    PERFORM llm._check_stripes(p_stripes, 'A budget''s',
                               'Use 1 for most ids; about the number of concurrent sessions (up to 64) for a key or user that many of them share.');
    SELECT n INTO v_stripes
      FROM llm._set_budget_stripes(p_organization_id, p_scope, p_scope_id, p_window, p_stripes,
                                   coalesce(p_now, pg_catalog.now())) AS n;
    RETURN v_stripes;
END
$$;
COMMENT ON FUNCTION llm.set_budget_stripes(uuid, text, text, text, integer, timestamptz) IS
    'Spreads the counters of a budget (for ''*'', of every id it governs) over 1 to 64 stripes, so concurrent requests of one hot key or user hold on different rows; applies to the counters of the window containing p_now at once and to every counter created after; returns the new count.';

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
          FROM llm._budget_terms(p_organization_id, p_scope, p_scope_id, p_window) AS f;
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
-- '*'" (the writers decide by llm._budget_terms): the report, the metric and the
-- demo read it here. A counter is the sum of its stripes. Columns are only ever
-- appended (CREATE OR REPLACE VIEW).
CREATE OR REPLACE VIEW llm.budget_usage WITH (security_invoker = true) AS
SELECT c.organization_id, c.scope, c.scope_id, c.budget_window, c.window_start,
       coalesce(own.limit_credits, dflt.limit_credits) AS limit_credits,
       c.used_credits, c.held_credits, c.used_cents,
       coalesce(own.thresholds, dflt.thresholds) AS thresholds,
       -- the budget's key in llm.budgets (an organization budget's id is NULL)
       CASE WHEN own.organization_id IS NOT NULL THEN own.scope_id ELSE dflt.scope_id END AS budget_scope_id,
       c.used_cost_nanos
  FROM (SELECT s.organization_id, s.scope, s.scope_id, s.budget_window, s.window_start,
               sum(s.used_credits)::bigint AS used_credits, sum(s.held_credits)::bigint AS held_credits,
               sum(s.used_cents)::bigint AS used_cents,
               sum(s.used_cents)::numeric * 10000000 + sum(s.priced_nanos) AS used_cost_nanos
          FROM llm.budget_counters AS s
         GROUP BY s.organization_id, s.scope, s.scope_id, s.budget_window, s.window_start) AS c
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
    'One row per scope id and window that counted a request (the sum of its counter''s stripes), under the real id (a default budget''s rows too), with the budget that applies to it now (the id''s own, else the scope''s ''*''): its limit, thresholds and scope_id in llm.budgets (budget_scope_id; NULL columns: none), and its used cost in nanos (used_cost_nanos: used_cents * 10^7 plus the cost the book priced).';
