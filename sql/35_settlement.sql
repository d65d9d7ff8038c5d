-- Settlement (the end of the request lifecycle): settle with measured usage or
-- fail; a measured settlement or a failure arriving after recovery is kept for
-- audit or trues the books up (late_settlement). Recovery (60_recovery.sql) books
-- the requests it ends its own way, in batches; the threshold crossings a movement
-- records are created in 15_notices.sql.
-- Every call is one transaction, taking its locks in the one order of
-- docs/architecture.md "Lock order".

-- 0.4.0: the routines that end a request gained the price book's figures (a
-- settlement priced from usage, docs/architecture.md "The price book"). The previous
-- public fail_invocation goes in this transaction, the one that creates the new (a
-- call naming its six arguments would match both); the previous private routines
-- stay until migrate drops what sql/ no longer defines, after the barrier, for the
-- calls of the previous functions still running (as in 30_admission.sql).
DROP FUNCTION IF EXISTS llm.fail_invocation(uuid, uuid, text, bigint, bigint, timestamptz);

-- ---------------------------------------------------------------- booking

-- A live request ends here, settled (measured) or failed: compare-and-set on its open
-- status (a concurrent settlement or recovery wins, and this returns false), then
-- booked in the same transaction, its locks in the order of docs/architecture.md
-- "Lock order" (the request's row is locked by this UPDATE). Its ledger rows are
-- derived (llm.ledger). The request comes back as the few fields the booking reads (a
-- whole row costs ~10 us more), its budgets' keys included; it is read whole, locked
-- already, only when it was admitted by the previous release with budgets to book.
-- Recovery books its batch its own way, in 60_recovery.sql.
CREATE OR REPLACE FUNCTION llm._end_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_status text, p_error text,
    p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamptz,
    p_price llm.priced_usage)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_cents bigint := coalesce(p_cents, 0);
    v_priced bigint := 0;  -- the cost the book priced (the caller's is its cents)
    v_execution_id uuid;
    v_period date;
    v_stripe smallint;
    v_hold bigint;
    v_created timestamptz;
    -- its budgets' bits (NULL: admitted before 0.4.0, in llm.invocation_scopes), their keys
    v_mask smallint; v_budget_stripe smallint; v_project text; v_api_key text; v_end_user text;
    v_inv llm.invocations;
    -- the book's price, as plain values (a field of the composite in the UPDATE costs
    -- every settlement more than these assignments cost a priced one)
    v_priced_by text;
    v_cost_nanos bigint;
    v_usage jsonb;
    v_price_tier bigint;
BEGIN
    IF p_price.priced_by IS NOT NULL THEN  -- (a composite IS NOT NULL only when every field is)
        v_priced_by := p_price.priced_by;
        v_cost_nanos := p_price.cost_nanos;
        v_priced := p_price.cost_nanos;
        v_usage := p_price.usage;
        v_price_tier := p_price.price_tier;
    END IF;
    UPDATE llm.invocations AS i
       SET status = p_status,
           settlement_kind = CASE WHEN p_status = 'settled' THEN 'measured' END,
           settled_at = p_now, error = p_error,
           charged_credits = p_credits, charged_cents = p_cents,
           input_tokens = p_input_tokens, output_tokens = p_output_tokens,
           -- the book's price (NULL when the caller priced it: a settlement writes nothing more
           -- than it did, so its update stays HOT)
           priced_by = v_priced_by, cost_nanos = v_cost_nanos, usage = v_usage, price_tier = v_price_tier
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id
       AND i.status IN ('reserved', 'dispatched')
    RETURNING i.execution_id, i.period_start, i.stripe, i.hold_credits, i.created_at, i.budget_mask,
              i.budget_stripe, i.project, i.api_key, i.end_user
         INTO v_execution_id, v_period, v_stripe, v_hold, v_created, v_mask,
              v_budget_stripe, v_project, v_api_key, v_end_user;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_execution_id IS NOT NULL THEN
        UPDATE llm.executions AS x
           SET request_count = x.request_count + 1,
               credits = x.credits + p_credits,
               cents = x.cents + v_cents,
               priced_nanos = coalesce(x.priced_nanos, 0) + v_priced
         WHERE x.organization_id = p_organization_id AND x.id = v_execution_id;
    END IF;
    -- charge in, hold out, one open request less; crossed thresholds recorded on the
    -- exact path (on stripe 0, the fast path called here: a call less on the request path)
    IF v_stripe <> 0
       OR NOT llm._move_within_rooms(p_organization_id, v_period, v_stripe,
                                     p_credits, -v_hold, v_cents, v_priced, -1, p_now,
                                     llm._hours_up(p_now - v_created), llm._hours_up(v_created - p_now)) THEN
        PERFORM llm._move_stripe(p_organization_id, v_period, v_stripe,
                                 p_credits, -v_hold, v_cents, v_priced, p_now, -1, v_created);
    END IF;
    -- then the budgets it was admitted under, in their windows of its admission (one of
    -- the previous release keeps its bits in llm.invocation_scopes: its row read whole)
    IF v_mask <> 0 THEN
        PERFORM llm._move_request_counters(p_organization_id, v_mask, v_project, v_api_key, v_end_user, v_created,
                                           v_budget_stripe, p_credits, -v_hold, v_cents, v_priced, NULL, NULL,
                                           llm._budgets_revision(p_organization_id), p_now);
    ELSIF v_mask IS NULL THEN
        SELECT * INTO STRICT v_inv FROM llm.invocations AS i WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
        PERFORM llm._move_budgets(p_organization_id, ARRAY[v_inv], false, p_now);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION llm._end_invocation(uuid, uuid, text, text, bigint, bigint, bigint, bigint, timestamptz, llm.priced_usage) IS
    'Ends an open (reserved or dispatched) invocation as settled (measured) or failed with its charge (priced by the caller, or by the book: p_price) and books it: its task''s totals, its stripe''s movement (charge in, hold out) with the threshold notices the period crosses, then its budgets'' counters; false when it was no longer open.';

-- A true-up moves the daily usage of its request's settlement day by the signed
-- difference, whatever a concurrent rebuild of that day does.
-- The row it adds to is the latest committed one: the UPDATE waits for a rebuild that
-- deleted the row, then finds it gone; the INSERT then waits for the rebuild's new row
-- and, finding it committed, inserts nothing, so the loop's next UPDATE (a new snapshot)
-- adds to it. A rebuild never counts this request's new figures, as they commit after
-- the rebuild read them. A day without the row (not rebuilt since the recovery) gets it
-- computed from the requests, this one included; a rebuild meeting that row rebuilds
-- again (80_reporting). The difference is written in one statement, the UPDATE.
CREATE OR REPLACE FUNCTION llm._true_up_daily_usage(p_inv llm.invocations, p_credits bigint, p_cents bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_day date := (p_inv.settled_at AT TIME ZONE 'UTC')::date;
    v_row llm.daily_usage;
    v_window record;
    v_priced_ids uuid[];
    v_inserted integer;
BEGIN
    LOOP
        UPDATE llm.daily_usage AS d
           SET credits = d.credits + p_credits,
               cents = d.cents + p_cents,
               priced_nanos = coalesce(d.priced_nanos, 0) + coalesce(p_inv.cost_nanos, 0),
               uncosted_requests = d.uncosted_requests - 1,  -- recovered, it had no cost (NULL: built before 0.4.0)
               fallback_requests = coalesce(d.fallback_requests, 0) + CASE WHEN p_inv.priced_by = 'fallback' THEN 1 ELSE 0 END,
               input_tokens = d.input_tokens + coalesce(p_inv.input_tokens, 0),
               output_tokens = d.output_tokens + coalesce(p_inv.output_tokens, 0)
         WHERE d.organization_id = p_inv.organization_id AND d.day = v_day AND d.model = p_inv.model;
        EXIT WHEN FOUND;
        -- rare (a true-up before the pass rebuilt its recovery day): the row as a rebuild
        -- would give it now, from the requests admitted when one settled that day can have
        -- been; one table per statement (docs/architecture.md "Citus rules" 9)
        SELECT * INTO v_window FROM llm._settle_window(p_inv.organization_id, v_day, v_day);
        SELECT p_inv.organization_id, v_day, p_inv.model, count(*),
               count(*) FILTER (WHERE i.settlement_kind IN ('recovered', 'trued_up')),
               coalesce(sum(i.charged_credits), 0), coalesce(sum(i.charged_cents), 0),
               coalesce(sum(i.input_tokens), 0), coalesce(sum(i.output_tokens), 0),
               coalesce(sum(i.cost_nanos), 0),
               count(*) FILTER (WHERE i.charged_cents IS NULL AND i.cost_nanos IS NULL),
               count(*) FILTER (WHERE i.priced_by = 'fallback'),
               pg_catalog.array_agg(i.id) FILTER (WHERE i.cost_nanos IS NOT NULL)
          INTO v_row.organization_id, v_row.day, v_row.model, v_row.requests, v_row.recovered_requests,
               v_row.credits, v_row.cents, v_row.input_tokens, v_row.output_tokens,
               v_row.priced_nanos, v_row.uncosted_requests, v_row.fallback_requests, v_priced_ids
          FROM llm.invocations AS i
         WHERE i.organization_id = p_inv.organization_id AND i.model = p_inv.model
           AND i.created_at >= v_window.created_from AND i.created_at < v_window.created_to
           AND i.settled_at >= (v_day::timestamp AT TIME ZONE 'UTC')
           AND i.settled_at < ((v_day + 1)::timestamp AT TIME ZONE 'UTC');
        SELECT coalesce(sum(c.difference_nanos), 0) INTO v_row.corrections_nanos  -- of repricing
          FROM llm.cost_corrections AS c
         WHERE c.organization_id = p_inv.organization_id AND c.invocation_id = ANY (v_priced_ids);
        -- the outcome from RETURNING, not FOUND (docs/scaling.md, "Constructs Citus mishandles")
        WITH inserted AS (
            INSERT INTO llm.daily_usage
                   (organization_id, day, model, requests, recovered_requests, credits, cents,
                    input_tokens, output_tokens, priced_nanos, uncosted_requests, fallback_requests,
                    corrections_nanos)
            VALUES (v_row.organization_id, v_row.day, v_row.model, v_row.requests, v_row.recovered_requests,
                    v_row.credits, v_row.cents, v_row.input_tokens, v_row.output_tokens,
                    v_row.priced_nanos, v_row.uncosted_requests, v_row.fallback_requests, v_row.corrections_nanos)
            ON CONFLICT (organization_id, day, model) DO NOTHING
            RETURNING 1)
        SELECT count(*) INTO v_inserted FROM inserted;
        EXIT WHEN v_inserted = 1;
        -- a rebuild committed the day's row after the UPDATE's snapshot: add to that row
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm._true_up_daily_usage(llm.invocations, bigint, bigint) IS
    'Moves the daily usage row of a trued-up request''s settlement day and model by the signed difference (inserting the row, computed from the requests, when the day has none); never lost to a concurrent rebuild_daily_usage.';

-- A recovered request trued up to its late measured settlement: the signed
-- difference moves its task, its own period (a closed month too) and the daily
-- usage of its settlement day (its 'adjustment' ledger row is derived); its locks in
-- the order of docs/architecture.md "Lock order", the day's usage last.
CREATE OR REPLACE FUNCTION llm._book_true_up(p_inv llm.invocations, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_credits bigint := p_inv.charged_credits - p_inv.recovered_credits;  -- signed
    v_cents bigint := coalesce(p_inv.charged_cents, 0);  -- recovery charged no cents
    v_priced bigint := coalesce(p_inv.cost_nanos, 0);     -- nor any cost
BEGIN
    -- its adjustment ledger row is derived from the request (llm.ledger)
    IF p_inv.execution_id IS NOT NULL THEN
        UPDATE llm.executions AS x
           SET credits = x.credits + v_credits, cents = x.cents + v_cents,
               priced_nanos = coalesce(x.priced_nanos, 0) + v_priced
         WHERE x.organization_id = p_inv.organization_id AND x.id = p_inv.execution_id;
    END IF;
    -- its own period's stripe (a closed month too); a rise records the thresholds it crosses
    PERFORM llm._move_stripe(p_inv.organization_id, p_inv.period_start, p_inv.stripe,
                             v_credits, 0, v_cents, v_priced, p_now, 0, NULL);
    -- the budgets it was admitted under, by the same difference
    PERFORM llm._move_budgets(p_inv.organization_id, ARRAY[p_inv], true, p_now);
    -- the daily usage of its settlement day, last: the cache the pass rebuilds
    PERFORM llm._true_up_daily_usage(p_inv, v_credits, v_cents);
END
$$;
COMMENT ON FUNCTION llm._book_true_up(llm.invocations, timestamptz) IS
    'Books a true-up by the signed difference (the request''s adjustment ledger row): the task''s totals, the stripe of the request''s period (crossings when usage rises) and the daily usage of its settlement day, in the settlement''s transaction.';

-- ---------------------------------------------------------------- settlement

CREATE OR REPLACE FUNCTION llm._terminal_outcome(p_organization_id uuid, p_invocation_id uuid)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_inv llm.invocations;
BEGIN
    SELECT * INTO v_inv FROM llm.invocations AS i
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_invocation(p_organization_id, p_invocation_id);
    END IF;
    RETURN CASE
        WHEN v_inv.status = 'failed' THEN 'already_failed'
        WHEN v_inv.settlement_kind = 'recovered' THEN 'already_recovered'
        ELSE 'already_settled'
    END;
END
$$;
COMMENT ON FUNCTION llm._terminal_outcome(uuid, uuid) IS
    'For an invocation that is no longer open: already_settled, already_recovered or already_failed (LL005 when unknown).';

-- A report on a request no longer open. Most are retries and get their already_*
-- answer. A late report: the worker comes back after recovery with its measured
-- settlement or its failure (a failure reports usage too: its partial charge, 0 by
-- default, as the provider charged nothing). The late_settlement policy in force now decides:
-- audit keeps the figures (and the error) in late_* and charges nothing; true_up
-- makes them the request's charge through _book_true_up. Either way only the first
-- late report counts: a request whose late figures were recorded is never trued up.
-- The request keeps its terminal status ('settled' by recovery).
CREATE OR REPLACE FUNCTION llm._settle_late(
    p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint,
    p_input_tokens bigint, p_output_tokens bigint, p_now timestamptz, p_price llm.priced_usage)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_inv llm.invocations;
    v_outcome text;
    v_true_up boolean;
BEGIN
    v_outcome := llm._terminal_outcome(p_organization_id, p_invocation_id);  -- LL005 if unknown
    IF v_outcome <> 'already_recovered' THEN
        RETURN v_outcome;  -- settled, failed or trued up before: nothing changes
    END IF;
    SELECT o.late_settlement = 'true_up' INTO v_true_up
      FROM llm.organizations AS o WHERE o.id = p_organization_id;
    -- the compare on 'recovered' and no late report yet: one late report wins
    UPDATE llm.invocations AS i
       SET late_credits = p_credits, late_cents = p_cents,
           late_input_tokens = p_input_tokens, late_output_tokens = p_output_tokens,
           late_reported_at = p_now,
           error = p_error,  -- a recovered request has none; a late settlement has none
           settlement_kind = CASE WHEN v_true_up THEN 'trued_up' ELSE i.settlement_kind END,
           charged_credits = CASE WHEN v_true_up THEN p_credits ELSE i.charged_credits END,
           charged_cents = CASE WHEN v_true_up THEN p_cents ELSE i.charged_cents END,
           input_tokens = CASE WHEN v_true_up THEN p_input_tokens ELSE i.input_tokens END,
           output_tokens = CASE WHEN v_true_up THEN p_output_tokens ELSE i.output_tokens END,
           -- the charge's price, when it becomes the charge (audit keeps credits and tokens)
           priced_by = CASE WHEN v_true_up THEN p_price.priced_by ELSE i.priced_by END,
           cost_nanos = CASE WHEN v_true_up THEN p_price.cost_nanos ELSE i.cost_nanos END,
           usage = CASE WHEN v_true_up THEN p_price.usage ELSE i.usage END,
           price_tier = CASE WHEN v_true_up THEN p_price.price_tier ELSE i.price_tier END
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id
       AND i.settlement_kind = 'recovered' AND i.late_reported_at IS NULL
    RETURNING i.* INTO v_inv;
    IF NOT FOUND THEN
        -- recorded before (already_recovered) or trued up by a concurrent call (already_settled)
        RETURN llm._terminal_outcome(p_organization_id, p_invocation_id);
    END IF;
    IF v_true_up THEN
        PERFORM llm._book_true_up(v_inv, p_now);
        RETURN 'trued_up';
    END IF;
    RETURN 'already_recovered';  -- audit: kept for audit, never charged
END
$$;
COMMENT ON FUNCTION llm._settle_late(uuid, uuid, text, bigint, bigint, bigint, bigint, timestamptz, llm.priced_usage) IS
    'Answers a report (measured settlement or failure) on a request no longer open: its already_* outcome, except for the first late report of a recovered request, which under late_settlement = true_up becomes its charge (trued_up, the books moved by the signed difference) and under audit is recorded in late_* with its error (already_recovered).';

-- A measured settlement repeated on a request whose measured settlement is stored
-- (charged, or kept in late_* by the audit policy) is a retry: the same figures
-- answer as before, other figures are LL007 naming both (docs/contract.md), never a
-- silent already_*. A request ended by a failure (its error set) answers as it does.
CREATE OR REPLACE FUNCTION llm._same_settlement(
    p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint,
    p_input_tokens bigint, p_output_tokens bigint, p_usage jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_inv llm.invocations;
    v_stored text[];
    v_usage jsonb := llm._full_usage(p_usage);  -- compared only with a usage the request keeps, class by class
BEGIN
    SELECT * INTO v_inv FROM llm.invocations AS i
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
    IF v_inv.status <> 'settled' OR v_inv.error IS NOT NULL THEN
        RETURN;  -- failed, or ended by a (late) failure: not a settlement to repeat
    ELSIF v_inv.settlement_kind = 'recovered' THEN
        IF v_inv.late_reported_at IS NULL THEN
            RETURN;
        END IF;
        v_stored := ARRAY[v_inv.late_credits::text, v_inv.late_cents::text,
                          v_inv.late_input_tokens::text, v_inv.late_output_tokens::text];
        v_usage := NULL;  -- kept for audit: its credits and tokens, not its usage
    ELSE
        v_stored := ARRAY[v_inv.charged_credits::text, v_inv.charged_cents::text,
                          v_inv.input_tokens::text, v_inv.output_tokens::text];
    END IF;
    -- a settlement priced from usage compares its usage too (DETAIL ... usage=...)
    PERFORM llm._check_retry(
        pg_catalog.format('llm: invocation %s was settled with different figures', p_invocation_id),
        'credits=%s cents=%s input_tokens=%s output_tokens=%s' || CASE WHEN v_usage IS NULL THEN '' ELSE ' usage=%s' END,
        v_stored || CASE WHEN v_usage IS NULL THEN '{}'::text[] ELSE ARRAY[llm._full_usage(v_inv.usage)::text] END,
        ARRAY[p_credits::text, p_cents::text, p_input_tokens::text, p_output_tokens::text]
            || CASE WHEN v_usage IS NULL THEN '{}'::text[] ELSE ARRAY[v_usage::text] END,
        'A settlement is reported once; its retry repeats its figures. Nothing was changed.');
END
$$;
COMMENT ON FUNCTION llm._same_settlement(uuid, uuid, bigint, bigint, bigint, bigint, jsonb) IS
    'For a settlement answered already_*: LL007 (DETAIL stored and given) when the request''s stored measured settlement has other figures; nothing when they agree or the request ended by a failure.';

CREATE OR REPLACE FUNCTION llm._settle_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint,
    p_input_tokens bigint, p_output_tokens bigint, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF llm._end_invocation(p_organization_id, p_invocation_id, 'settled', NULL, p_credits, p_cents,
                           p_input_tokens, p_output_tokens, p_now, NULL) THEN
        RETURN 'settled';
    END IF;
    v_outcome := llm._settle_late(p_organization_id, p_invocation_id, NULL, p_credits, p_cents,
                                  p_input_tokens, p_output_tokens, p_now, NULL);
    IF v_outcome IN ('already_settled', 'already_recovered') THEN
        PERFORM llm._same_settlement(p_organization_id, p_invocation_id, p_credits, p_cents,
                                     p_input_tokens, p_output_tokens);  -- LL007 when they differ
    END IF;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION llm._settle_invocation(uuid, uuid, bigint, bigint, bigint, bigint, timestamptz) IS
    'Distributed twin of settle_invocation; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.settle_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint,
    p_input_tokens bigint DEFAULT NULL, p_output_tokens bigint DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL
            AND llm._amount_ok(p_credits) AND llm._amount_ok(p_cents)
            AND llm._amount_ok(p_input_tokens, true) AND llm._amount_ok(p_output_tokens, true)) IS NOT TRUE THEN
        PERFORM llm._check_call(p_organization_id, p_now, 'invocation', p_invocation_id);
        PERFORM llm._check_amount('p_credits', p_credits);
        PERFORM llm._check_amount('p_cents', p_cents);
        PERFORM llm._check_amount('p_input_tokens', p_input_tokens, true);
        PERFORM llm._check_amount('p_output_tokens', p_output_tokens, true);
    END IF;
    SELECT s INTO v_outcome
      FROM llm._settle_invocation(p_organization_id, p_invocation_id, p_credits, p_cents,
                                  p_input_tokens, p_output_tokens, coalesce(p_now, pg_catalog.now())) AS s;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION llm.settle_invocation(uuid, uuid, bigint, bigint, bigint, bigint, timestamptz) IS
    'Settles a request with measured usage: charges it once, releases its hold, moves its own period, adds to its task and records crossed thresholds. Returns settled, or already_settled / already_recovered / already_failed with nothing charged (LL007 when a stored measured settlement has other figures); under late_settlement = true_up the first measured settlement of a recovered request returns trued_up and moves the books by the signed difference.';

CREATE OR REPLACE FUNCTION llm._fail_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint,
    p_now timestamptz, p_usage jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_price llm.priced_usage;
    v_credits bigint := p_credits;
    v_cents bigint := p_cents;
BEGIN
    IF p_usage IS NOT NULL THEN  -- the partial usage, priced at the request's pinned version
        v_price := llm._price_request(p_organization_id, p_invocation_id, p_usage);
        v_credits := v_price.credits;
        v_cents := NULL;
    END IF;
    IF llm._end_invocation(p_organization_id, p_invocation_id, 'failed', p_error, v_credits, v_cents,
                           v_price.input_tokens, v_price.output_tokens, p_now, v_price) THEN
        RETURN 'failed';
    END IF;
    -- a late failure reports usage too: the partial charge it names (0: none)
    RETURN llm._settle_late(p_organization_id, p_invocation_id, p_error, v_credits, v_cents,
                            v_price.input_tokens, v_price.output_tokens, p_now, v_price);
END
$$;
COMMENT ON FUNCTION llm._fail_invocation(uuid, uuid, text, bigint, bigint, timestamptz, jsonb) IS
    'Distributed twin of fail_invocation; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.fail_invocation(
    p_organization_id uuid, p_invocation_id uuid, p_error text,
    p_credits bigint DEFAULT 0, p_cents bigint DEFAULT 0, p_now timestamptz DEFAULT now(),
    p_usage jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL
            AND llm._text_ok(p_error, 4000) AND llm._amount_ok(p_credits) AND llm._amount_ok(p_cents)
            AND (p_usage IS NULL OR (llm._usage_ok(p_usage) AND p_credits = 0 AND p_cents = 0))) IS NOT TRUE THEN
        PERFORM llm._check_call(p_organization_id, p_now, 'invocation', p_invocation_id);
        PERFORM llm._check_text('p_error', p_error, 4000);
        PERFORM llm._check_amount('p_credits', p_credits);
        PERFORM llm._check_amount('p_cents', p_cents);
        IF p_usage IS NOT NULL THEN
            PERFORM llm._check_usage(p_usage);
            RAISE EXCEPTION 'llm: a partial charge and a usage to price were both given'
                USING ERRCODE = '22023',
                      HINT = 'Pass p_credits and p_cents, or p_usage for the book to price (with p_credits and p_cents 0).';
        END IF;
    END IF;
    SELECT f INTO v_outcome
      FROM llm._fail_invocation(p_organization_id, p_invocation_id, p_error, p_credits, p_cents,
                                coalesce(p_now, pg_catalog.now()), p_usage) AS f;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION llm.fail_invocation(uuid, uuid, text, bigint, bigint, timestamptz, jsonb) IS
    'Fails a request: releases its hold and charges the optional partial usage once (p_credits and p_cents, or p_usage priced at the request''s pinned version). Returns failed, or already_settled / already_recovered / already_failed with nothing changed; the first failure of a recovered request is a late report: under late_settlement = true_up it returns trued_up and moves the books to its partial charge by the signed difference, under audit it records its figures and error and returns already_recovered.';

-- ---------------------------------------------------------------- priced settlement

-- A request's usage priced at the version and credit rate its admission pinned: the
-- credits to charge (cost / rate, rounded up), the tokens the books keep (the prompt
-- in, visible and reasoning output out) and the cost. LL005 for an unknown request,
-- LL014 for one admitted with no price in force. Not locked: the pins never change.
CREATE OR REPLACE FUNCTION llm._price_request(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb)
RETURNS llm.priced_usage
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_model text;
    v_version bigint;
    v_rate bigint;
    v_created timestamptz;
    v_rates jsonb;
    v_unit_nanos jsonb;
    v_fallback boolean;
    v_nanos_per_credit bigint;
    v_usage jsonb := llm._full_usage(p_usage);
    v_nanos numeric;  -- its cost
    v_tier bigint;  -- the tier that priced it (NULL: base rates)
    v_credits bigint;
    v_cost record;
BEGIN
    -- the request's pins, then the catalogs' rows they name (joined to the request in
    -- one statement, Citus refused the delegated call: 0A000, docs/architecture.md
    -- "Citus rules" 9)
    SELECT i.model, i.price_version_id, i.credit_rate_id, i.created_at
      INTO v_model, v_version, v_rate, v_created
      FROM llm.invocations AS i
     WHERE i.organization_id = p_organization_id AND i.id = p_invocation_id;
    IF NOT FOUND THEN
        PERFORM llm._raise_unknown_invocation(p_organization_id, p_invocation_id);
    END IF;
    SELECT v.rates, v.unit_nanos, v.model = '*', r.nanos_per_credit INTO v_rates, v_unit_nanos, v_fallback, v_nanos_per_credit
      FROM llm.price_versions AS v, llm.credit_rates AS r
     WHERE v.id = v_version AND r.id = v_rate;  -- two reference tables: they join
    IF v_version IS NULL OR v_rate IS NULL THEN
        PERFORM llm._raise_price_missing(p_organization_id, v_model, v_created,
                                         CASE WHEN v_version IS NULL THEN 'price' ELSE 'credit rate' END);
    END IF;
    v_nanos := pg_catalog.round(llm._unit_cost(v_unit_nanos, v_usage));
    IF v_nanos <= llm._max_amount() THEN  -- from the version's units, in one expression
        v_credits := llm._credits_of(v_nanos::bigint, v_nanos_per_credit);
    ELSE  -- a price with tiers, or what is refused (a class with no rate, a cost too high): class by class
        v_cost := llm._usage_cost(v_model, v_version, v_rates, v_usage, v_nanos_per_credit);
        v_nanos := v_cost.cost_nanos;
        v_tier := v_cost.price_tier;
        v_credits := v_cost.credits;
    END IF;
    -- tokens in: the prompt (input and the cache's reads and writes); out: visible and
    -- reasoning. The request keeps the usage as reported, not with every class: a
    -- settlement's new row version goes to the WAL whole, and the seven classes of a
    -- typical call take 186 bytes where its three take 80 (llm_db.Usage sends the
    -- classes with tokens); the cycle is bound by its WAL as much as by its CPU.
    RETURN ROW(v_credits,
               pg_catalog.jsonb_path_query_first(v_usage, '$.input + $.cache_read + $.cache_write_5m + $.cache_write_1h')::bigint,
               pg_catalog.jsonb_path_query_first(v_usage, '$.output + $.reasoning')::bigint,
               v_nanos, p_usage, v_tier,
               CASE WHEN v_fallback THEN 'fallback' ELSE 'model' END)::llm.priced_usage;
END
$$;
COMMENT ON FUNCTION llm._price_request(uuid, uuid, jsonb) IS
    'p_usage of a request priced at its pinned version and credit rate: credits, tokens in and out, cost, the usage as reported, tier and priced_by; LL005 (unknown), LL014 (no price pinned).';

CREATE OR REPLACE FUNCTION llm._settle_usage(
    p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_price llm.priced_usage := llm._price_request(p_organization_id, p_invocation_id, p_usage);
    v_outcome text;
BEGIN
    -- as settle_invocation, with the book's figures and no cents (the cost is exact)
    IF llm._end_invocation(p_organization_id, p_invocation_id, 'settled', NULL, v_price.credits, NULL,
                           v_price.input_tokens, v_price.output_tokens, p_now, v_price) THEN
        RETURN 'settled';
    END IF;
    v_outcome := llm._settle_late(p_organization_id, p_invocation_id, NULL, v_price.credits, NULL,
                                  v_price.input_tokens, v_price.output_tokens, p_now, v_price);
    IF v_outcome IN ('already_settled', 'already_recovered') THEN
        PERFORM llm._same_settlement(p_organization_id, p_invocation_id, v_price.credits, NULL,
                                     v_price.input_tokens, v_price.output_tokens, v_price.usage);
    END IF;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION llm._settle_usage(uuid, uuid, jsonb, timestamptz) IS
    'Distributed twin of settle_usage; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.settle_usage(
    p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamptz DEFAULT now())
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_outcome text;
BEGIN
    IF (p_organization_id IS NOT NULL AND llm._clock_ok(p_now) AND p_invocation_id IS NOT NULL
            AND llm._usage_ok(p_usage)) IS NOT TRUE THEN
        PERFORM llm._check_call(p_organization_id, p_now, 'invocation', p_invocation_id);
        PERFORM llm._check_usage(p_usage);
    END IF;
    SELECT s INTO v_outcome
      FROM llm._settle_usage(p_organization_id, p_invocation_id, p_usage, coalesce(p_now, pg_catalog.now())) AS s;
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION llm.settle_usage(uuid, uuid, jsonb, timestamptz) IS
    'Settles a request with the provider''s measured usage, priced exactly at the version and credit rate its admission pinned: charges the credits, records cost_nanos, usage, price_tier and priced_by, and moves the books as settle_invocation does, with the same outcomes (LL014 for a request admitted with no price in force).';
