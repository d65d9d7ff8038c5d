-- Admission (CAP-PFM-LLM-007) and dispatch: a request is admitted with a hold
-- on its period and on the counters of the budgets that apply to it
-- (28_budgets.sql), all or nothing, then marked as sent to the provider. How it ends (settled with
-- measured usage, or failed) and how a terminal request is booked: 35_settlement.sql.
-- Every call is one transaction, taking its locks in the one order of
-- docs/architecture.md "Lock order" (a hot key's counter comes last, so it is held
-- shortest).
--
-- A request without budgets pays nothing for them: its organization's row says
-- whether it has any (has_budgets), and the request keeps its scope ids and the bits
-- of its budgets on its own row, which its settlement updates anyway.

-- ---------------------------------------------------------------- admission

-- 0.4.0 priced admission (docs/architecture.md "The price book"): admit_invocation
-- and its twin gained trailing parameters. The previous public signature goes in this
-- transaction, the one that creates the new (all of sql/ is one), so a caller finds
-- one admit_invocation or the other, never none and never two (a call naming nine
-- arguments would match both). The previous twin stays until migrate drops the
-- routines sql/ no longer defines, after the barrier: a call of the previous
-- admit_invocation still running calls it (tests/test_upgrade_live.py found one that
-- did). A later run drops nothing.
DROP FUNCTION IF EXISTS llm.admit_invocation(uuid, bigint, text, uuid, uuid, timestamptz, text, text, text);

-- A request linked to a task: its task must be running (LL006 when unknown, LL009
-- when closed), but for the retry of a request admitted while it ran, which is
-- returned as it was (or LL007 when the arguments differ). NULL fields: admit it.
CREATE OR REPLACE FUNCTION llm._task_admits(
    p_organization_id uuid, p_execution_id uuid, p_invocation_id uuid, p_estimate_credits bigint,
    p_model text, p_project text, p_api_key text, p_end_user text)
RETURNS llm.invocations
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_exec_status text;
    v_inv llm.invocations;
BEGIN
    SELECT x.status INTO v_exec_status
      FROM llm.executions AS x
     WHERE x.organization_id = p_organization_id AND x.id = p_execution_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_execution(p_organization_id, p_execution_id);
    ELSIF v_exec_status = 'running' THEN
        RETURN v_inv;
    END IF;
    IF p_invocation_id IS NOT NULL THEN
        SELECT * INTO v_inv FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
        IF FOUND THEN
            RETURN llm._same_admission(v_inv, p_estimate_credits, p_model, p_execution_id,
                                       p_project, p_api_key, p_end_user);
        END IF;
    END IF;
    RAISE EXCEPTION 'llm: execution % is %', p_execution_id, v_exec_status
        USING ERRCODE = 'LL009',
              DETAIL = 'Only a running execution admits new requests.',
              HINT = 'Open a new execution for new work.';
END
$$;
COMMENT ON FUNCTION llm._task_admits(uuid, uuid, uuid, bigint, text, text, text, text) IS
    'For a request linked to a task: NULL fields when the task runs; the earlier admission when it is a retry of one admitted while it ran; else LL006 (unknown task) or LL009 (closed).';

-- The public result of admission and dispatch (llm.admission_result): a request's columns as
-- of 0.2.0, named one by one (a column added to llm.invocations stays out), then
-- whether the call replayed an earlier one. Inlinable: one expression.
CREATE OR REPLACE FUNCTION llm._admission(p_inv llm.invocations, p_replayed boolean)
RETURNS llm.admission_result
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ROW(p_inv.organization_id, p_inv.id, p_inv.period_start, p_inv.execution_id, p_inv.model,
               p_inv.status, p_inv.estimate_credits, p_inv.hold_credits, p_inv.charged_credits,
               p_inv.charged_cents, p_inv.input_tokens, p_inv.output_tokens, p_inv.settlement_kind,
               p_inv.created_at, p_inv.dispatched_at, p_inv.settled_at, p_inv.past_window_alerted_at,
               p_inv.error, p_inv.late_credits, p_inv.late_cents, p_inv.late_input_tokens,
               p_inv.late_output_tokens, p_inv.late_reported_at, p_inv.recovered_credits, p_inv.stripe,
               p_replayed)::llm.admission_result
$$;
COMMENT ON FUNCTION llm._admission(llm.invocations, boolean) IS
    'The llm.admission_result of a request: its columns as of 0.2.0, then replayed.';

-- Long on purpose: the request path's admission reads top to bottom, its fast path
-- inline (each routine it does not call is a statement and a pinned search_path less).
-- Its movement of stripe 0 passes every argument of _move_stripe's: see there.
CREATE OR REPLACE FUNCTION llm._admit_invocation(
    p_organization_id uuid, p_estimate_credits bigint, p_model text,
    p_execution_id uuid, p_invocation_id uuid, p_now timestamptz,
    p_project text, p_api_key text, p_end_user text,
    p_input_tokens bigint, p_max_output_tokens bigint)
RETURNS llm.admission_result
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_org_status text;
    v_stripes integer;
    v_exec_status text;
    v_has_budgets boolean;
    v_budgets_revision uuid;
    v_mask integer := 0;  -- the budgets that apply: none unless the organization has one
    v_limits bigint[];
    v_revisions uuid[];
    v_uniform integer;  -- its budgets, when none names an id (NULL: read them)
    v_stripe smallint;
    v_inv llm.invocations;
    v_period date := llm._period_start(p_now);
    v_estimate bigint := p_estimate_credits;
    v_version bigint;  -- the price version in force for the model (NULL: none)
    v_rates jsonb;
    v_unit_nanos jsonb;
    v_rate_id bigint;  -- and the credit rate, looked up only with a version
    v_nanos_per_credit bigint;
    v_cost numeric;  -- a priced estimate's nanos
BEGIN
    -- The organization, then the price in force for the model (docs/architecture.md
    -- "The price book": the model's before the fallback '*', the organization's own
    -- before the book's, the latest) and, only with a price, its credit rate (likewise),
    -- which every admission pins. Statements of their own: in one (the price a LATERAL
    -- subquery of the organization's row), Citus refused the delegated call (0A000,
    -- "queries must filter by the distribution argument"); and a request of a model
    -- with no price (one statement, found nothing) starts no executor for credit rates.
    SELECT o.status, o.period_stripes, o.has_budgets, o.budgets_revision,
           o.uniform_budget_mask, o.uniform_budget_limits, o.uniform_budget_revisions
      INTO v_org_status, v_stripes, v_has_budgets, v_budgets_revision, v_uniform, v_limits, v_revisions
      FROM llm.organizations AS o
     WHERE o.id = p_organization_id;
    SELECT v.id, v.rates, v.unit_nanos INTO v_version, v_rates, v_unit_nanos
      FROM llm.price_versions AS v
     WHERE v.model = ANY (ARRAY[p_model, '*'])
       AND (v.organization_id = p_organization_id OR v.organization_id IS NULL)
       AND v.effective_from <= p_now
     ORDER BY v.model = '*', v.organization_id IS NULL, v.effective_from DESC
     LIMIT 1;
    IF v_org_status IS DISTINCT FROM 'operational' THEN
        PERFORM llm._operational_org(p_organization_id);  -- raises LL002 (unknown) or LL003
    END IF;
    IF v_version IS NOT NULL THEN
        SELECT r.id, r.nanos_per_credit INTO v_rate_id, v_nanos_per_credit
          FROM llm.credit_rates AS r
         WHERE (r.organization_id = p_organization_id OR r.organization_id IS NULL)
           AND r.effective_from <= p_now
         ORDER BY r.organization_id IS NULL, r.effective_from DESC
         LIMIT 1;
    END IF;
    IF p_estimate_credits IS NULL THEN
        -- priced from its tokens, the whole prompt at the input rate (admission cannot
        -- know what the cache will hold); LL014 without a price or a credit rate
        IF v_rate_id IS NULL THEN
            PERFORM llm._require_price(p_organization_id, p_model, p_now, v_version, v_rate_id);
        END IF;
        v_cost := pg_catalog.round(llm._unit_estimate(v_unit_nanos, p_input_tokens, p_max_output_tokens));
        IF v_cost <= llm._max_amount() THEN  -- from the version's units, in one expression
            v_estimate := llm._credits_of(v_cost::bigint, v_nanos_per_credit);
        ELSE  -- a price with tiers, or what is refused (a class with no rate, a cost too high): class by class
            v_estimate := (llm._usage_cost(p_model, v_version, v_rates, llm._estimate_usage(p_input_tokens, p_max_output_tokens),
                                           v_nanos_per_credit)).credits;
        END IF;
    END IF;

    IF p_execution_id IS NOT NULL THEN
        -- a running task admits (read here: a call less on the request path); else
        -- _task_admits says why not, or finds the retry of a request admitted while it ran
        SELECT x.status INTO v_exec_status
          FROM llm.executions AS x
         WHERE x.organization_id = p_organization_id AND x.id = p_execution_id;
        IF v_exec_status IS DISTINCT FROM 'running' THEN
            v_inv := llm._task_admits(p_organization_id, p_execution_id, p_invocation_id, v_estimate,
                                      p_model, p_project, p_api_key, p_end_user);
            IF v_inv.id IS NOT NULL THEN
                RETURN llm._admission(v_inv, true);  -- a retry of a request admitted while its task ran
            END IF;
        END IF;
    END IF;

    -- The budgets that apply, fixed on the request (its budget_mask) and decided
    -- against the limits read here, with their revisions, in bit order: the
    -- organization's day and week budgets, and for each scope id the request names
    -- its own budget per window, else the scope's '*'. When no budget names an id, the
    -- organization's row holds them (read above, written with them under its lock) and
    -- those of the scopes the request names apply; else they are read in one statement
    -- (a concurrent set_budget applies wholly or not at all, either way). Nothing is
    -- looked up when the organization has no budget (has_budgets false).
    IF v_uniform IS NOT NULL THEN
        v_mask := v_uniform & llm._named_scopes_mask(p_project, p_api_key, p_end_user);
        IF v_mask <> v_uniform THEN  -- a scope it does not name: the others' limits, in bit order
            v_limits := llm._mask_elements(v_uniform, v_mask, v_limits);
            v_revisions := llm._mask_elements(v_uniform, v_mask, v_revisions);
        END IF;
    ELSIF v_has_budgets IS NOT FALSE THEN
        SELECT coalesce(sum(1 << a.slot), 0),
               coalesce(pg_catalog.array_agg(a.limit_credits ORDER BY a.slot), '{}'),
               coalesce(pg_catalog.array_agg(a.revision ORDER BY a.slot), '{}')
          INTO v_mask, v_limits, v_revisions
          FROM (SELECT DISTINCT ON (b.scope, b.budget_window)
                       llm._budget_slot(b.scope, b.budget_window) AS slot, b.limit_credits, b.revision
                  FROM llm.budget_limits AS b
                 WHERE b.organization_id = p_organization_id
                   AND (b.scope = 'organization'
                        OR (b.scope = 'project' AND b.scope_id IN (p_project, '*') AND p_project IS NOT NULL)
                        OR (b.scope = 'api_key' AND b.scope_id IN (p_api_key, '*') AND p_api_key IS NOT NULL)
                        OR (b.scope = 'end_user' AND b.scope_id IN (p_end_user, '*') AND p_end_user IS NOT NULL))
                 ORDER BY b.scope, b.budget_window, b.scope_id = '*') AS a;  -- its own before '*'
    END IF;

    -- This session's stripe: concurrent sessions of one organization hold on
    -- different rows (a session keeps its stripe, and its cache lines, between calls);
    -- its budget counters' stripe is the same residue, of 64 (budget_stripe).
    v_stripe := pg_catalog.mod(pg_catalog.pg_backend_pid(), v_stripes)::smallint;
    INSERT INTO llm.invocations AS i
           (organization_id, id, period_start, execution_id, model, status,
            estimate_credits, hold_credits, created_at, stripe,
            project, api_key, end_user, budget_mask, budget_stripe, price_version_id, credit_rate_id)
    VALUES (p_organization_id, coalesce(p_invocation_id, pg_catalog.gen_random_uuid()), v_period,
            p_execution_id, p_model, 'reserved', v_estimate, v_estimate, p_now, v_stripe,
            p_project, p_api_key, p_end_user, v_mask,
            CASE WHEN v_mask <> 0 THEN pg_catalog.mod(pg_catalog.pg_backend_pid(), 64) END,
            v_version, v_rate_id)
    ON CONFLICT (organization_id, id) DO NOTHING
    RETURNING i.* INTO v_inv;
    IF NOT FOUND THEN
        -- A retried id (admitted before, or concurrently and committed since): the same
        -- arguments return the first admission and place no second hold; others LL007.
        SELECT * INTO STRICT v_inv FROM llm.invocations AS i
         WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
        RETURN llm._admission(llm._same_admission(v_inv,
                                                  llm._retried_estimate(v_inv, v_estimate, CASE WHEN p_estimate_credits IS NULL
                                                      THEN llm._estimate_usage(p_input_tokens, p_max_output_tokens) END),
                                                  p_model, p_execution_id, p_project, p_api_key, p_end_user), true);
    END IF;
    -- The hold from this stripe's room, in one row; else the exact path (the period
    -- locked, LL001 unless used + held + estimate <= allowance, the period created on
    -- its month's first admission). The allowance is decided first, so it is the one
    -- named when it and a budget both refuse.
    -- (on stripe 0, the fast path called here: a call less on the request path)
    IF v_stripe <> 0 OR NOT llm._move_within_rooms(p_organization_id, v_period, v_stripe, 0, v_estimate, 0, 0,
                                                   1, p_now, NULL, NULL) THEN
        PERFORM llm._move_stripe(p_organization_id, v_period, v_stripe, 0, v_estimate, 0, 0, p_now, 1, NULL);
    END IF;
    -- Then its hold on every budget's counter, in bit order, last (a hot key's row is
    -- held from here to the commit only), each iff used + held + estimate <= the limit
    -- read above (LL001 naming the first that does not fit, and this transaction rolls
    -- back every hold; LL012 for a counter it would create past retention).
    IF v_mask <> 0 THEN
        PERFORM llm._move_request_counters(p_organization_id, v_mask, p_project, p_api_key, p_end_user,
                                           v_inv.created_at, v_inv.budget_stripe, 0, v_inv.hold_credits, 0, 0,
                                           v_limits, v_revisions, v_budgets_revision, v_inv.created_at);
    END IF;
    RETURN llm._admission(v_inv, false);
END
$$;
COMMENT ON FUNCTION llm._admit_invocation(uuid, bigint, text, uuid, uuid, timestamptz, text, text, text, bigint, bigint) IS
    'Distributed twin of admit_invocation; arguments already checked. It pins the price in force and prices a NULL estimate from the tokens (LL014 without a price). replayed: the earlier admission of a retried id, returned unchanged.';

-- The estimate a retried priced admission stands for: its tokens (p_priced_estimate,
-- {"input": N, "output": M}) priced at the version and credit rate the first
-- admission pinned, not at those in force at the retry, so a price that changed in
-- between does not make a retry a conflict. An estimate in credits stands for itself.
CREATE OR REPLACE FUNCTION llm._retried_estimate(p_inv llm.invocations, p_estimate_credits bigint, p_priced_estimate jsonb)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_priced_estimate IS NULL OR p_inv.price_version_id IS NULL OR p_inv.credit_rate_id IS NULL THEN
        RETURN p_estimate_credits;
    END IF;
    RETURN (llm._usage_cost(p_inv.model, p_inv.price_version_id,
                            (SELECT v.rates FROM llm.price_versions AS v WHERE v.id = p_inv.price_version_id),
                            p_priced_estimate,
                            (SELECT r.nanos_per_credit FROM llm.credit_rates AS r WHERE r.id = p_inv.credit_rate_id))).credits;
END
$$;
COMMENT ON FUNCTION llm._retried_estimate(llm.invocations, bigint, jsonb) IS
    'The estimate a retried admission is compared with: a priced one''s tokens at the version and credit rate the request pinned, else p_estimate_credits.';

CREATE OR REPLACE FUNCTION llm._same_admission(
    p_inv llm.invocations, p_estimate_credits bigint, p_model text, p_execution_id uuid,
    p_project text, p_api_key text, p_end_user text)
RETURNS llm.invocations
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_scopes llm.invocation_scopes;
BEGIN
    IF p_inv.budget_mask IS NULL THEN
        -- admitted before 0.4.0: its scope ids are beside it (none when it named none)
        SELECT * INTO v_scopes FROM llm.invocation_scopes AS s
         WHERE s.organization_id = p_inv.organization_id AND s.invocation_id = p_inv.id;
        p_inv.project := v_scopes.project;
        p_inv.api_key := v_scopes.api_key;
        p_inv.end_user := v_scopes.end_user;
    END IF;
    PERFORM llm._check_retry(
        pg_catalog.format('llm: invocation %s was admitted with different arguments', p_inv.id),
        'estimate=%s model=%s execution=%s project=%s api_key=%s end_user=%s',
        ARRAY[p_inv.estimate_credits::text, p_inv.model, p_inv.execution_id::text,
              p_inv.project, p_inv.api_key, p_inv.end_user],
        ARRAY[p_estimate_credits::text, p_model, p_execution_id::text, p_project, p_api_key, p_end_user],
        'Use a new invocation id for a new request; reuse an id only to retry the same one.');
    RETURN p_inv;
END
$$;
COMMENT ON FUNCTION llm._same_admission(llm.invocations, bigint, text, uuid, text, text, text) IS
    'Returns the stored invocation when a retried admission repeats its arguments, else raises LL007.';

CREATE OR REPLACE FUNCTION llm.admit_invocation(
    p_organization_id uuid, p_estimate_credits bigint, p_model text,
    p_execution_id uuid DEFAULT NULL, p_invocation_id uuid DEFAULT NULL,
    p_now timestamptz DEFAULT now(), p_project text DEFAULT NULL, p_api_key text DEFAULT NULL,
    p_end_user text DEFAULT NULL, p_input_tokens bigint DEFAULT NULL, p_max_output_tokens bigint DEFAULT NULL)
RETURNS llm.admission_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_inv llm.admission_result;  -- the twin's result: llm.invocations' columns as of 0.2.0, then replayed
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now)
            AND (llm._amount_ok(p_estimate_credits) AND p_input_tokens IS NULL AND p_max_output_tokens IS NULL
                 OR (p_estimate_credits IS NULL AND llm._amount_ok(p_input_tokens) AND llm._amount_ok(p_max_output_tokens)))
            AND llm._text_ok(p_model, 200)
            AND llm._scope_id_ok(p_project) AND llm._scope_id_ok(p_api_key)
            AND llm._scope_id_ok(p_end_user)) IS NOT TRUE THEN
        PERFORM llm._check_call(p_organization_id, p_now);
        PERFORM llm._check_estimate_source(p_estimate_credits, p_input_tokens, p_max_output_tokens);
        PERFORM llm._check_text('p_model', p_model, 200);
        PERFORM llm._check_scope_id('p_project', p_project);
        PERFORM llm._check_scope_id('p_api_key', p_api_key);
        PERFORM llm._check_scope_id('p_end_user', p_end_user);
    END IF;
    SELECT * INTO v_inv
      FROM llm._admit_invocation(p_organization_id, p_estimate_credits, p_model, p_execution_id,
                                 p_invocation_id, coalesce(p_now, pg_catalog.now()),
                                 p_project, p_api_key, p_end_user, p_input_tokens, p_max_output_tokens);
    RETURN v_inv;
END
$$;
COMMENT ON FUNCTION llm.admit_invocation(uuid, bigint, text, uuid, uuid, timestamptz, text, text, text, bigint, bigint) IS
    'Admits a request iff used + held + estimate fits the allowance and every budget that applies to its project, API key and end user (LL001 naming the first that does not), placing its hold on the current period and on those budgets'' counters; the estimate is p_estimate_credits, or (NULL) p_input_tokens and p_max_output_tokens priced by the book (LL014 without a price). Pins the price in force for its model. A repeated p_invocation_id with the same arguments returns the first admission as it stands now, with replayed = true (different arguments: LL007).';

-- ---------------------------------------------------------------- dispatch

CREATE OR REPLACE FUNCTION llm._mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamptz)
RETURNS llm.admission_result
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    UPDATE llm.invocations AS i
       SET status = 'dispatched', dispatched_at = p_now
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id AND i.status = 'reserved'
    RETURNING i.* INTO v_inv;
    IF FOUND THEN
        RETURN llm._admission(v_inv, false);
    END IF;
    SELECT * INTO v_inv FROM llm.invocations AS i
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_invocation(p_organization_id, p_invocation_id);
    ELSIF v_inv.status <> 'dispatched' THEN
        RAISE EXCEPTION 'llm: invocation % is already %', p_invocation_id, v_inv.status
            USING ERRCODE = 'LL009',
                  DETAIL = pg_catalog.format('status=%s settlement_kind=%s', v_inv.status, v_inv.settlement_kind),
                  HINT = 'A terminal request must not be sent to the provider; admit a new one.';
    END IF;
    RETURN llm._admission(v_inv, true);  -- already dispatched: idempotent, a replay
END
$$;
COMMENT ON FUNCTION llm._mark_dispatched(uuid, uuid, timestamptz) IS
    'Distributed twin of mark_dispatched; arguments already checked. replayed: it was dispatched before.';

CREATE OR REPLACE FUNCTION llm.mark_dispatched(
    p_organization_id uuid, p_invocation_id uuid, p_now timestamptz DEFAULT now())
RETURNS llm.admission_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_inv llm.admission_result;  -- the twin's result, column for column
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL) IS NOT TRUE THEN
        PERFORM llm._check_call(p_organization_id, p_now, 'invocation', p_invocation_id);
    END IF;
    SELECT * INTO v_inv
      FROM llm._mark_dispatched(p_organization_id, p_invocation_id, coalesce(p_now, pg_catalog.now()));
    RETURN v_inv;
END
$$;
COMMENT ON FUNCTION llm.mark_dispatched(uuid, uuid, timestamptz) IS
    'Marks a reserved request as sent to the provider (idempotent when already dispatched: replayed = true); LL009 when it is already terminal.';
