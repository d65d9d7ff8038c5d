-- Shared helpers: the calendar, settings, organization look-ups, argument checks.
-- Private helpers start with `_` and are not granted to llm_app or llm_reader. The
-- exceptions are llm_operator's (99_grants.sql): run_reconciliation is a SECURITY
-- INVOKER procedure, so that role holds the pass's steps (65_pass.sql) and the clock
-- check they call, _check_clock and _clock_ok below.
--
-- The files of sql/ read in dependency order: each calls only itself and the files
-- before it in name order (the order migrate applies them), but the pass, which
-- orchestrates every capability (tests/test_sql_order.py). So 15_notices.sql, which
-- creates the threshold notices, comes before the stripes (20), organizations (25),
-- budgets (28) and settlement (35) that create them.

-- No SET clause on purpose: it would stop PostgreSQL from inlining this pure,
-- fully qualified expression into the admission query (a measurable share of a
-- request's CPU, docs/benchmarks.md); nothing in it resolves through search_path.
CREATE OR REPLACE FUNCTION llm._period_start(p_at timestamptz)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (pg_catalog.date_trunc('month', p_at AT TIME ZONE 'UTC'))::date $$;
COMMENT ON FUNCTION llm._period_start(timestamptz) IS
    'The first day of the UTC calendar month containing p_at: the period an invocation admitted then belongs to.';

-- Inlinable (no SET clause, everything qualified): a span in whole hours, rounded up,
-- never below 0 (NULL for NULL). Exact: the epoch of an interval is numeric.
CREATE OR REPLACE FUNCTION llm._hours_up(p_span interval)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT GREATEST(0, pg_catalog.ceil(pg_catalog.extract('epoch', p_span) OPERATOR(pg_catalog./) 3600))::integer
$$;
COMMENT ON FUNCTION llm._hours_up(interval) IS
    'p_span in whole hours, rounded up, at least 0; NULL for NULL.';

-- Inlinable (no SET clause): a constant the predicates below fold in.
CREATE OR REPLACE FUNCTION llm._max_amount()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000000000000000::bigint $$;
COMMENT ON FUNCTION llm._max_amount() IS
    'The largest credit, cent or token amount one call accepts (10^15).';

-- The sum limit (docs/architecture.md "Sum limits"): what a period's used + held
-- credits, its used cents, and a budget counter's, may reach. Amounts are capped at
-- 10^15, so a sum at the limit plus one more amount still fits a bigint; a movement
-- that would take a sum past it is refused (LL013) instead of failing 22003 in the
-- middle of the books. Sums nothing bounds (tasks, daily usage, reports) are numeric.
CREATE OR REPLACE FUNCTION llm._max_sum()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000000000000000000::bigint $$;
COMMENT ON FUNCTION llm._max_sum() IS
    'The sum limit (10^18): the most a period''s used + held credits, its used cents, or a budget counter''s may reach (LL013 beyond).';

CREATE OR REPLACE FUNCTION llm._refuse_sum(p_table text, p_column text, p_sum numeric, p_subject text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- returns bigint so that a CASE branch of an UPDATE can raise through it
    RAISE EXCEPTION 'llm: % would exceed the sum limit', p_subject
        USING ERRCODE = 'LL013',
              DETAIL = pg_catalog.format('%s.%s would be %s; the limit is %s.', p_table, p_column, p_sum, llm._max_sum()),
              HINT = 'The books keep sums up to 10^18 of a unit per period and budget window; settle or fail open requests, or spread usage over organizations.',
              SCHEMA = 'llm', TABLE = p_table, COLUMN = p_column;
END
$$;
COMMENT ON FUNCTION llm._refuse_sum(text, text, numeric, text) IS
    'Raises LL013 (the sum limit): p_table.p_column would be p_sum, past _max_sum(); nothing of the call is kept.';

-- The argument rules as inlinable predicates (no SET clause, everything
-- qualified, like _period_start): a public function tests all its arguments in
-- one expression with these, and only when one fails calls the _check_* helpers
-- below, which apply the same predicates and raise the precise error. So each
-- rule is written once, and a valid call runs no helper at all.
CREATE OR REPLACE FUNCTION llm._amount_ok(p_value bigint, p_nullable boolean DEFAULT false)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_value IS NULL THEN p_nullable
                ELSE p_value OPERATOR(pg_catalog.>=) 0::bigint
                     AND p_value OPERATOR(pg_catalog.<=) llm._max_amount() END
$$;
COMMENT ON FUNCTION llm._amount_ok(bigint, boolean) IS
    'True for a non-negative amount no larger than _max_amount() (10^15), or a NULL when p_nullable.';

CREATE OR REPLACE FUNCTION llm._text_ok(p_value text, p_max integer, p_nullable boolean DEFAULT false)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_value IS NULL THEN p_nullable
                ELSE pg_catalog.btrim(p_value) OPERATOR(pg_catalog.<>) ''::text
                     AND pg_catalog.length(p_value) OPERATOR(pg_catalog.<=) p_max END
$$;
COMMENT ON FUNCTION llm._text_ok(text, integer, boolean) IS
    'True for a text that is not blank and has at most p_max characters, or a NULL when p_nullable.';

CREATE OR REPLACE FUNCTION llm._clock_ok(p_now timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_now IS NULL
        OR (pg_catalog.isfinite(p_now)
            AND p_now OPERATOR(pg_catalog.>=) '0001-01-01 00:00:00+00'::timestamptz
            AND p_now OPERATOR(pg_catalog.<) '10000-01-01 00:00:00+00'::timestamptz)
$$;
COMMENT ON FUNCTION llm._clock_ok(timestamptz) IS
    'True for NULL (the function''s own now()) or a finite time between the years 1 and 9999 (UTC).';

CREATE OR REPLACE FUNCTION llm._check_amount(p_name text, p_value bigint, p_nullable boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_value IS NULL THEN
        IF NOT p_nullable THEN
            RAISE EXCEPTION 'llm: % must not be NULL', p_name
                USING ERRCODE = '22023', HINT = 'Pass 0 when there is nothing to record.';
        END IF;
    ELSIF NOT llm._amount_ok(p_value) THEN
        RAISE EXCEPTION 'llm: % is out of range', p_name
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s = %s; accepted: 0 .. %s.', p_name, p_value, llm._max_amount());
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_amount(text, bigint, boolean) IS
    'Raises 22023 unless p_value is a non-negative amount no larger than _max_amount() (NULL allowed only when p_nullable).';

CREATE OR REPLACE FUNCTION llm._check_text(p_name text, p_value text, p_max integer, p_nullable boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_value IS NULL THEN
        IF NOT p_nullable THEN
            RAISE EXCEPTION 'llm: % must not be NULL', p_name USING ERRCODE = '22023';
        END IF;
    ELSIF pg_catalog.btrim(p_value) = '' THEN
        RAISE EXCEPTION 'llm: % must not be empty', p_name USING ERRCODE = '22023';
    ELSIF NOT llm._text_ok(p_value, p_max) THEN
        RAISE EXCEPTION 'llm: % is too long', p_name
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s has %s characters; at most %s are accepted.',
                                             p_name, pg_catalog.length(p_value), p_max);
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_text(text, text, integer, boolean) IS
    'Raises 22023 for a NULL (unless p_nullable), blank or over-long text argument.';

CREATE OR REPLACE FUNCTION llm._check_clock(p_now timestamptz)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    -- NULL means the function's own now(). Anything else must be a finite time the
    -- calendar arithmetic (period ends, windows, durations, backoff) cannot overflow:
    -- an infinite clock would be stored, or recover every live request of a tenant.
    IF NOT llm._clock_ok(p_now) THEN
        RAISE EXCEPTION 'llm: p_now % is not a usable clock', p_now
            USING ERRCODE = '22023',
                  DETAIL = 'p_now must be a finite time between the years 1 and 9999 (UTC).',
                  HINT = 'Omit p_now (or pass NULL) to use the transaction''s now().';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_clock(timestamptz) IS
    'Raises 22023 for a p_now that is infinite or outside the years 1 .. 9999; NULL (the function''s own now()) passes.';

-- A stripe count (set_period_stripes, set_budget_stripes): 1 to 64 rows, the range a
-- backend's stripe (pid mod N, budget_stripe mod 64) is read in. p_whose and p_hint
-- say whose counters and how many to choose.
CREATE OR REPLACE FUNCTION llm._check_stripes(p_stripes integer, p_whose text, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_stripes IS NULL OR p_stripes < 1 OR p_stripes > 64 THEN
        RAISE EXCEPTION 'llm: % stripes is out of range', coalesce(p_stripes::text, 'NULL')
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s counters are spread over 1 to 64 stripe rows.', p_whose),
                  HINT = p_hint;
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_stripes(integer, text, text) IS
    'Raises 22023 for a stripe count that is NULL or outside 1 .. 64 (DETAIL: whose counters; HINT: p_hint).';

-- An organization's sweep lock (docs/architecture.md "Lock order", row 3), held to the
-- end of the transaction: one sweep of an organization at a time (a pass and a tool may
-- overlap), and a repricing of it waits for its sweep, or the sweep for it: both move
-- its tasks, and in orders that could otherwise cycle.
CREATE OR REPLACE FUNCTION llm._lock_sweep_of(p_organization_id uuid)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('llm.reconcile_org'),
                                             pg_catalog.hashtext(p_organization_id::text));
END
$$;
COMMENT ON FUNCTION llm._lock_sweep_of(uuid) IS
    'Takes the organization''s sweep lock (an advisory lock to the end of the transaction): its sweep and its repricing, one at a time.';

CREATE OR REPLACE FUNCTION llm._require_org_id(p_organization_id uuid)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_organization_id IS NULL THEN
        RAISE EXCEPTION 'llm: organization id must not be NULL'
            USING ERRCODE = '22023',
                  HINT = 'Every per-organization call names its organization first.';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._require_org_id(uuid) IS
    'Raises 22023 for a NULL organization id, before any distributed twin is called (Citus crashes on a NULL distribution argument).';

CREATE OR REPLACE FUNCTION llm._raise_unknown_org(p_organization_id uuid)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'llm: unknown organization %', p_organization_id
        USING ERRCODE = 'LL002',
              HINT = 'Create it first with llm.upsert_organization(id, name, allowance).';
END
$$;
COMMENT ON FUNCTION llm._raise_unknown_org(uuid) IS 'Raises LL002 for an organization id that does not exist.';

CREATE OR REPLACE FUNCTION llm._operational_org(p_organization_id uuid)
RETURNS llm.organizations
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_org llm.organizations;
BEGIN
    SELECT * INTO v_org FROM llm.organizations WHERE id = p_organization_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    IF v_org.status <> 'operational' THEN
        RAISE EXCEPTION 'llm: organization % is %', p_organization_id, v_org.status
            USING ERRCODE = 'LL003',
                  DETAIL = pg_catalog.format('status = %s; only operational organizations are admitted and swept.',
                                             v_org.status),
                  HINT = 'Set it operational with llm.upsert_organization(..., p_status => ''operational'').';
    END IF;
    RETURN v_org;
END
$$;
COMMENT ON FUNCTION llm._operational_org(uuid) IS
    'The organization row, or LL002 when unknown and LL003 when not operational.';

CREATE OR REPLACE FUNCTION llm._settings()
RETURNS llm.settings
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_settings llm.settings;
BEGIN
    SELECT * INTO STRICT v_settings FROM llm.settings;
    RETURN v_settings;
END
$$;
COMMENT ON FUNCTION llm._settings() IS 'The one settings row.';

-- The first checks of every per-organization call, in this order (so the same
-- bad call always gets the same error): its organization, its clock, and the id
-- of the row it acts on (p_what names it: invocation, execution, notice).
CREATE OR REPLACE FUNCTION llm._check_call(
    p_organization_id uuid, p_now timestamptz, p_what text DEFAULT NULL, p_id uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    PERFORM llm._require_org_id(p_organization_id);
    PERFORM llm._check_clock(p_now);
    IF p_what IS NOT NULL AND p_id IS NULL THEN
        RAISE EXCEPTION 'llm: % id must not be NULL', p_what USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_call(uuid, timestamptz, text, uuid) IS
    'Raises 22023 for a NULL organization id, an unusable clock, or (when p_what names it) a NULL id of the row the call acts on.';

-- A retry (an admission with the same invocation id, a task opened again with its
-- replay key) must repeat the first call: the stored and the given arguments, as
-- texts in the same order, and p_format describing one side in the DETAIL.
CREATE OR REPLACE FUNCTION llm._check_retry(
    p_message text, p_format text, p_stored text[], p_given text[], p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_stored IS DISTINCT FROM p_given THEN
        RAISE EXCEPTION '%', p_message
            USING ERRCODE = 'LL007',
                  DETAIL = pg_catalog.format('stored: %s; given: %s', pg_catalog.format(p_format, VARIADIC p_stored),
                                             pg_catalog.format(p_format, VARIADIC p_given)),
                  HINT = p_hint;
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_retry(text, text, text[], text[], text) IS
    'Raises LL007 (DETAIL: stored and given, each in p_format) when a retry''s arguments differ from the first call''s.';

CREATE OR REPLACE FUNCTION llm._raise_unknown_invocation(p_organization_id uuid, p_invocation_id uuid)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    PERFORM FROM llm.organizations AS o WHERE o.id = p_organization_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    RAISE EXCEPTION 'llm: unknown invocation % for organization %', p_invocation_id, p_organization_id
        USING ERRCODE = 'LL005',
              HINT = 'Pass the id admit_invocation returned, with the organization that admitted it.';
END
$$;
COMMENT ON FUNCTION llm._raise_unknown_invocation(uuid, uuid) IS
    'Raises LL002 when the organization is unknown, else LL005: an invocation of another organization is unknown here.';

CREATE OR REPLACE FUNCTION llm._raise_unknown_execution(p_organization_id uuid, p_execution_id uuid)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_elsewhere boolean;
BEGIN
    -- Error path only: telling a caller that it mixed up tenants is worth one
    -- look beyond its own organization (a multi-shard read under Citus).
    BEGIN
        PERFORM FROM llm.executions AS x
         WHERE x.id = p_execution_id AND x.organization_id <> p_organization_id;
        v_elsewhere := FOUND;
    EXCEPTION WHEN internal_error THEN
        -- Citus refuses that read inside a call delegated to a worker ("cannot
        -- execute a distributed query from a query on a shard"): say LL006
        IF SQLERRM NOT LIKE 'cannot execute a distributed query%' THEN
            RAISE;
        END IF;
        v_elsewhere := false;
    END;
    IF v_elsewhere THEN
        RAISE EXCEPTION 'llm: execution % belongs to another organization', p_execution_id
            USING ERRCODE = 'LL008',
                  DETAIL = pg_catalog.format('organization given: %s', p_organization_id),
                  HINT = 'Link a request only to a task of its own organization.';
    END IF;
    RAISE EXCEPTION 'llm: unknown execution % for organization %', p_execution_id, p_organization_id
        USING ERRCODE = 'LL006',
              HINT = 'Pass the execution_id open_execution returned.';
END
$$;
COMMENT ON FUNCTION llm._raise_unknown_execution(uuid, uuid) IS
    'Raises LL008 when the execution exists in another organization, else LL006 (always LL006 inside a call Citus delegated to a worker).';
