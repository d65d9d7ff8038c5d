-- Organizations, what a changed allowance or threshold list does to their periods
-- (whose stripes 20_stripes.sql keeps), and the task catalog.

CREATE OR REPLACE FUNCTION llm._check_thresholds(p_thresholds integer[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_sorted integer[];
BEGIN
    IF p_thresholds IS NULL
       OR pg_catalog.array_ndims(p_thresholds) > 1
       OR pg_catalog.array_position(p_thresholds, NULL) IS NOT NULL
       OR EXISTS (SELECT FROM pg_catalog.unnest(p_thresholds) AS t(pct) WHERE t.pct < 1 OR t.pct > 1000)
       OR pg_catalog.cardinality(p_thresholds) > 20 THEN
        RAISE EXCEPTION 'llm: invalid notice thresholds %', p_thresholds
            USING ERRCODE = '22023',
                  DETAIL = 'Thresholds are a one-dimensional list of at most 20 distinct percentages between 1 and 1000, without NULLs.',
                  HINT = 'For example ''{80,100}''; ''{}'' sends no notices.';
    END IF;
    SELECT coalesce(pg_catalog.array_agg(DISTINCT t.pct ORDER BY t.pct), '{}')
      INTO v_sorted
      FROM pg_catalog.unnest(p_thresholds) AS t(pct);
    IF pg_catalog.cardinality(v_sorted) <> pg_catalog.cardinality(p_thresholds) THEN
        RAISE EXCEPTION 'llm: duplicate notice thresholds %', p_thresholds
            USING ERRCODE = '22023', HINT = 'List each percentage once.';
    END IF;
    RETURN v_sorted;
END
$$;
COMMENT ON FUNCTION llm._check_thresholds(integer[]) IS
    'The threshold list sorted, or 22023 for NULL, NULL elements, duplicates, values outside 1..1000 or more than 20 entries.';

-- What a changed allowance or threshold list does to the organization's periods.
--
-- Which periods. A changed allowance applies to the period containing p_now and to
-- any later one a moved clock already opened (invariant 9); an earlier period keeps
-- the allowance its month had. A period's notices are judged by the organization's
-- threshold list as it is now, whatever its month (_record_crossings, _spread_rooms,
-- invariant 5b), so a changed list spreads the notice rooms of every period again,
-- an earlier one still settling its open requests too: its next crossing is then
-- notified whichever path, fast or exact, moves it.
--
-- What the change owes. In the period containing p_now and later ones, every
-- threshold the used credits now stand at or above and not notified yet is owed at
-- once, in this transaction (_record_reached): a lowered allowance
-- or a threshold added below the usage. An earlier period, its month over, owes none
-- for a level it reached before; it owes its later crossings as usual.
--
-- Locks in the order of docs/architecture.md "Lock order" (the caller holds the
-- organization's row FOR UPDATE): a settlement or a sweep never waits for that row while holding a
-- stripe, and an admission waits for it (_ensure_period) only before it holds any, so
-- a change under live traffic waits for the stripes in use and cannot deadlock with a
-- call.
CREATE OR REPLACE FUNCTION llm._apply_to_periods(
    p_organization_id uuid, p_allowance bigint, p_thresholds integer[], p_every_period boolean,
    p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_current date := llm._period_start(p_now);
    v_start date;
    v_head llm.period_heads;
    v_booked bigint;
BEGIN
    -- A first admission of the month creating its period holds the organization row
    -- FOR SHARE (_ensure_period), so the period it creates is either seen here or
    -- created after this transaction commits, with the new allowance.
    FOR v_start IN
        SELECT h.period_start FROM llm.period_heads AS h
         WHERE h.organization_id = p_organization_id
           AND (p_every_period OR h.period_start >= v_current)
         ORDER BY h.period_start
    LOOP
        -- 1. the period's stripes, in stripe order
        v_head := llm._lock_period(p_organization_id, v_start);
        IF v_start >= v_current THEN
            -- how far used + held stands over the new allowance, measured under the
            -- stripes' locks: the most invariant 4 lets the period stay over it by
            SELECT sum(s.used_credits) + sum(s.held_credits) INTO v_booked
              FROM llm.period_stripes AS s
             WHERE s.organization_id = p_organization_id AND s.period_start = v_start;
            UPDATE llm.period_heads AS h
               SET allowance_credits = p_allowance,
                   allowance_excess = GREATEST(0, coalesce(v_booked - p_allowance, 0))
             WHERE h.organization_id = p_organization_id AND h.period_start = v_start
               AND h.allowance_credits IS DISTINCT FROM p_allowance;
            v_head.allowance_credits := p_allowance;
            -- 2. its notices: the thresholds the change itself puts behind
            PERFORM llm._record_reached(p_organization_id, v_start, p_thresholds, p_allowance, p_now);
        END IF;
        -- 3. its rooms, for its allowance and the new list (after the notices: a
        --    notified threshold is behind)
        PERFORM llm._spread_rooms(p_organization_id, v_start, v_head.allowance_credits);
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm._apply_to_periods(uuid, bigint, integer[], boolean, timestamptz) IS
    'Applies a changed allowance to the period containing p_now and later ones, owing at once the thresholds their usage now stands at or above, and spreads the rooms again of those periods, or of every period of the organization when its threshold list changed (p_every_period); periods locked in period order.';

-- The public result of the organization's setters (llm.organization_settings): its
-- columns as of 0.2.0, named one by one (a column added to llm.organizations stays
-- out). Inlinable: one expression.
CREATE OR REPLACE FUNCTION llm._organization_settings(p_org llm.organizations)
RETURNS llm.organization_settings
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ROW(p_org.id, p_org.name, p_org.status, p_org.monthly_allowance_credits, p_org.notice_thresholds,
               p_org.created_at, p_org.updated_at, p_org.recovery_charge, p_org.late_settlement,
               p_org.period_stripes)::llm.organization_settings
$$;
COMMENT ON FUNCTION llm._organization_settings(llm.organizations) IS
    'The llm.organization_settings of an organization: its columns as of 0.2.0.';

-- A NULL status or threshold list keeps the organization's (a new one: operational,
-- {80,100}): raising an allowance must not reactivate a suspended tenant or reset its
-- thresholds (0.4.0).
CREATE OR REPLACE FUNCTION llm._upsert_organization(
    p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint,
    p_status text, p_notice_thresholds integer[], p_now timestamptz)
RETURNS llm.organization_settings
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_org llm.organizations;
    v_old_allowance bigint;
    v_old_thresholds integer[];
    v_thresholds integer[];
BEGIN
    SELECT o.monthly_allowance_credits, o.notice_thresholds INTO v_old_allowance, v_old_thresholds
      FROM llm.organizations AS o WHERE o.id = p_organization_id FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO llm.organizations AS o
               (id, name, status, monthly_allowance_credits, notice_thresholds, created_at, updated_at,
                has_budgets)
        VALUES (p_organization_id, p_name, coalesce(p_status, 'operational'), p_monthly_allowance_credits,
                coalesce(p_notice_thresholds, '{80,100}'), p_now, p_now, false)
        ON CONFLICT (id) DO NOTHING
        RETURNING o.* INTO v_org;
        IF FOUND THEN
            RETURN llm._organization_settings(v_org);
        END IF;
        -- created concurrently: lock it and update as below
        SELECT o.monthly_allowance_credits, o.notice_thresholds INTO v_old_allowance, v_old_thresholds
          FROM llm.organizations AS o WHERE o.id = p_organization_id FOR UPDATE;
    END IF;
    v_thresholds := coalesce(p_notice_thresholds, v_old_thresholds);

    UPDATE llm.organizations AS o
       SET name = p_name,
           status = coalesce(p_status, o.status),
           monthly_allowance_credits = p_monthly_allowance_credits,
           notice_thresholds = v_thresholds,
           updated_at = p_now
     WHERE o.id = p_organization_id
    RETURNING o.* INTO v_org;

    IF v_old_allowance IS DISTINCT FROM p_monthly_allowance_credits
       OR v_old_thresholds IS DISTINCT FROM v_thresholds THEN
        PERFORM llm._apply_to_periods(p_organization_id, p_monthly_allowance_credits, v_thresholds,
                                      v_old_thresholds IS DISTINCT FROM v_thresholds, p_now);
    END IF;
    RETURN llm._organization_settings(v_org);
END
$$;
COMMENT ON FUNCTION llm._upsert_organization(uuid, text, bigint, text, integer[], timestamptz) IS
    'Distributed twin of upsert_organization; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.upsert_organization(
    p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint,
    p_status text DEFAULT NULL, p_notice_thresholds integer[] DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS llm.organization_settings
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_org llm.organization_settings;  -- the twin's result
    v_thresholds integer[];
    v_now timestamptz := coalesce(p_now, pg_catalog.now());
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now);
    PERFORM llm._check_text('p_name', p_name, 200);
    PERFORM llm._check_amount('p_monthly_allowance_credits', p_monthly_allowance_credits, true);
    IF p_status NOT IN ('operational', 'suspended', 'closed') THEN
        RAISE EXCEPTION 'llm: invalid organization status %', p_status
            USING ERRCODE = '22023', HINT = 'Use operational, suspended or closed; NULL keeps the organization''s.';
    END IF;
    IF p_notice_thresholds IS NOT NULL THEN  -- NULL keeps the organization's list
        v_thresholds := llm._check_thresholds(p_notice_thresholds);
    END IF;
    SELECT * INTO v_org
      FROM llm._upsert_organization(p_organization_id, p_name, p_monthly_allowance_credits,
                                    p_status, v_thresholds, v_now);
    RETURN v_org;
END
$$;
COMMENT ON FUNCTION llm.upsert_organization(uuid, text, bigint, text, integer[], timestamptz) IS
    'Creates or updates an organization; a NULL status or threshold list keeps the organization''s (a new one: operational, {80,100}). A changed allowance (NULL = unlimited) also applies to the period containing p_now and later open ones, which owe at once every threshold their usage now stands at or above; a changed threshold list applies to every period.';

CREATE OR REPLACE FUNCTION llm._set_allowance(
    p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamptz)
RETURNS llm.organization_settings
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_org llm.organizations;
    v_old_allowance bigint;
BEGIN
    SELECT o.monthly_allowance_credits INTO v_old_allowance
      FROM llm.organizations AS o WHERE o.id = p_organization_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    UPDATE llm.organizations AS o
       SET monthly_allowance_credits = p_monthly_allowance_credits, updated_at = p_now
     WHERE o.id = p_organization_id
    RETURNING o.* INTO v_org;
    IF v_old_allowance IS DISTINCT FROM p_monthly_allowance_credits THEN
        PERFORM llm._apply_to_periods(p_organization_id, p_monthly_allowance_credits, v_org.notice_thresholds,
                                      false, p_now);
    END IF;
    RETURN llm._organization_settings(v_org);
END
$$;
COMMENT ON FUNCTION llm._set_allowance(uuid, bigint, timestamptz) IS
    'Distributed twin of set_allowance; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.set_allowance(
    p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamptz DEFAULT now())
RETURNS llm.organization_settings
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_org llm.organization_settings;  -- the twin's result
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now);
    PERFORM llm._check_amount('p_monthly_allowance_credits', p_monthly_allowance_credits, true);
    SELECT * INTO v_org
      FROM llm._set_allowance(p_organization_id, p_monthly_allowance_credits,
                              coalesce(p_now, pg_catalog.now()));
    RETURN v_org;
END
$$;
COMMENT ON FUNCTION llm.set_allowance(uuid, bigint, timestamptz) IS
    'Changes only the monthly allowance (NULL = unlimited) of an existing organization (LL002 otherwise), as upsert_organization would: the period containing p_now and later open ones take it and owe at once every threshold their usage now stands at or above. Name, status and thresholds stay.';

CREATE OR REPLACE FUNCTION llm._set_period_stripes(p_organization_id uuid, p_stripes integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_stripes integer;
BEGIN
    UPDATE llm.organizations AS o
       SET period_stripes = p_stripes
     WHERE o.id = p_organization_id
    RETURNING o.period_stripes INTO v_stripes;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    -- From the next admission on: a session takes its hold from stripe pid % N; the
    -- first hold that does not fit its stripe's room (or finds no stripe yet) spreads
    -- the period's rooms over the new N. Holds on stripes beyond it stay where they are.
    RETURN v_stripes;
END
$$;
COMMENT ON FUNCTION llm._set_period_stripes(uuid, integer) IS
    'Distributed twin of set_period_stripes; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.set_period_stripes(p_organization_id uuid, p_stripes integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_stripes integer;
BEGIN
    PERFORM llm._require_org_id(p_organization_id);
    PERFORM llm._check_stripes(p_stripes, 'A period''s',
                               'Use 1 for a small organization; about the number of its concurrent sessions (up to 64) for a busy one.');
    SELECT n INTO v_stripes FROM llm._set_period_stripes(p_organization_id, p_stripes) AS n;
    RETURN v_stripes;
END
$$;
COMMENT ON FUNCTION llm.set_period_stripes(uuid, integer) IS
    'Spreads the organization''s period counters over p_stripes rows (1 to 64; 22023 otherwise, LL002 for an unknown organization) from its next admission on; returns the new count. Admission stays exact and no threshold crossing is missed.';

CREATE OR REPLACE FUNCTION llm._set_recovery_policy(
    p_organization_id uuid, p_recovery_charge text, p_late_settlement text)
RETURNS llm.organization_settings
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_org llm.organizations;
BEGIN
    UPDATE llm.organizations AS o
       SET recovery_charge = p_recovery_charge, late_settlement = p_late_settlement
     WHERE o.id = p_organization_id
    RETURNING o.* INTO v_org;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    RETURN llm._organization_settings(v_org);
END
$$;
COMMENT ON FUNCTION llm._set_recovery_policy(uuid, text, text) IS
    'Distributed twin of set_recovery_policy; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.set_recovery_policy(
    p_organization_id uuid, p_recovery_charge text, p_late_settlement text)
RETURNS llm.organization_settings
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_org llm.organization_settings;  -- the twin's result
BEGIN
    PERFORM llm._require_org_id(p_organization_id);
    IF p_recovery_charge IS NULL OR p_recovery_charge NOT IN ('estimate', 'dispatched', 'none') THEN
        RAISE EXCEPTION 'llm: unknown recovery charge %', coalesce(p_recovery_charge, 'NULL')
            USING ERRCODE = '22023',
                  DETAIL = 'estimate: every recovered request is charged its estimate; dispatched: only requests sent to the provider are; none: recovery charges nothing.',
                  HINT = 'Pass estimate, dispatched or none.';
    END IF;
    IF p_late_settlement IS NULL OR p_late_settlement NOT IN ('audit', 'true_up') THEN
        RAISE EXCEPTION 'llm: unknown late settlement policy %', coalesce(p_late_settlement, 'NULL')
            USING ERRCODE = '22023',
                  DETAIL = 'audit: a measured settlement after recovery is recorded, never charged; true_up: it replaces the recovery charge.',
                  HINT = 'Pass audit or true_up.';
    END IF;
    SELECT * INTO v_org
      FROM llm._set_recovery_policy(p_organization_id, p_recovery_charge, p_late_settlement);
    RETURN v_org;
END
$$;
COMMENT ON FUNCTION llm.set_recovery_policy(uuid, text, text) IS
    'Sets what recovery charges a stranded request (estimate | dispatched | none) and what a measured settlement arriving after recovery does (audit | true_up); 22023 for another word, LL002 for an unknown organization.';

CREATE OR REPLACE FUNCTION llm.declare_task_kind(p_key text, p_description text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_text('p_key', p_key, 200);
    PERFORM llm._check_text('p_description', p_description, 2000, true);
    INSERT INTO llm.task_kinds AS k (key, description)
    VALUES (p_key, p_description)
    ON CONFLICT (key) DO UPDATE
       SET description = coalesce(excluded.description, k.description)
     WHERE k.description IS DISTINCT FROM coalesce(excluded.description, k.description);
END
$$;
COMMENT ON FUNCTION llm.declare_task_kind(text, text) IS
    'Declares a task kind; idempotent (a repeat with a new description updates it, a NULL description keeps the old one).';
