-- The price book (docs/architecture.md "The price book"): versioned prices per model,
-- credit rates, and the one function that turns measured usage into an exact cost.
--
-- Money is an integer of nanos, 10^-9 of the book's currency (llm.settings.currency).
-- A rate is per million tokens, so a class's share of a cost is tokens * rate * 1000
-- nanos, and the per-call fee (the class requests) calls * fee * 10^9; all of it is
-- added as numeric, exactly, and rounded once, half up, to a whole nano. A cost is at
-- most _max_amount() nanos (10^15, a million units of the currency), so the sums the
-- books keep of it stay within the sum limit as credits do.
--
-- Token classes are disjoint: input (uncached prompt), cache_read, cache_write_5m,
-- cache_write_1h, output (visible completion), reasoning (billed at the output rate
-- unless the version prices it) and requests (the call itself: 1 unless usage says).
-- A class with tokens and no rate is refused (22023), never priced at 0.

-- Inlinable constant: the classes, in the order a cost adds them.
CREATE OR REPLACE FUNCTION llm._price_classes()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '{input,cache_read,cache_write_5m,cache_write_1h,output,reasoning,requests}'::text[] $$;
COMMENT ON FUNCTION llm._price_classes() IS
    'The token classes a usage and a price name, disjoint: input, cache_read, cache_write_5m, cache_write_1h, output, reasoning, requests.';

CREATE OR REPLACE FUNCTION llm._raise_bad_price(p_model text, p_what text, p_detail text, p_hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'llm: the price of % %', p_model, p_what
        USING ERRCODE = '22023', DETAIL = p_detail,
              HINT = coalesce(p_hint, 'Rates are per million tokens (per call for requests): a JSON number or decimal string from 0 to 1000000 with at most 12 decimals, for example {"input": "3", "output": "15", "cache_read": "0.30"}.');
END
$$;
COMMENT ON FUNCTION llm._raise_bad_price(text, text, text, text) IS
    'Raises 22023 for a price that cannot be stored: what is wrong and where.';

-- A rate as an exact numeric: a JSON number (jsonb keeps it as numeric, exactly) or a
-- plain decimal string; never a float on the way.
CREATE OR REPLACE FUNCTION llm._exact_rate(p_model text, p_where text, p_value jsonb)
RETURNS numeric
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_rate numeric;
BEGIN
    IF pg_catalog.jsonb_typeof(p_value) = 'number' THEN
        v_rate := (p_value #>> '{}')::numeric;
    ELSIF pg_catalog.jsonb_typeof(p_value) = 'string' AND (p_value #>> '{}') ~ '^-?[0-9]+(\.[0-9]+)?$' THEN
        v_rate := (p_value #>> '{}')::numeric;
    ELSE
        PERFORM llm._raise_bad_price(p_model, 'has a rate that is no number',
                                     pg_catalog.format('%s is %s.', p_where, p_value));
    END IF;
    IF v_rate < 0 OR v_rate > 1000000 OR pg_catalog.scale(pg_catalog.trim_scale(v_rate)) > 12 THEN
        PERFORM llm._raise_bad_price(p_model, 'has a rate out of range',
                                     pg_catalog.format('%s is %s; accepted: 0 .. 1000000, at most 12 decimals.', p_where, v_rate));
    END IF;
    RETURN pg_catalog.trim_scale(v_rate);
END
$$;
COMMENT ON FUNCTION llm._exact_rate(text, text, jsonb) IS
    'A rate (JSON number or decimal string, 0 .. 10^6, at most 12 decimals) as an exact numeric; 22023 naming p_where otherwise.';

-- One level of rates (the base, or a tier without its threshold) as a jsonb object
-- of exact numbers; a key that is no class is refused.
CREATE OR REPLACE FUNCTION llm._exact_rates(p_model text, p_where text, p_rates jsonb, p_extra text[])
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_key text;
    v_value jsonb;
    v_out jsonb := '{}'::jsonb;
BEGIN
    FOR v_key, v_value IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(p_rates) AS e LOOP
        IF v_key = ANY (p_extra) THEN
            CONTINUE;
        END IF;
        IF NOT v_key = ANY (llm._price_classes()) THEN
            PERFORM llm._raise_bad_price(p_model, 'names an unknown token class',
                pg_catalog.format('%s has %s; the classes are %s.', p_where, pg_catalog.quote_literal(v_key),
                                  pg_catalog.array_to_string(llm._price_classes(), ', ')));
        END IF;
        v_out := v_out || pg_catalog.jsonb_build_object(
            v_key, llm._exact_rate(p_model, pg_catalog.format('%s.%s', p_where, v_key), v_value));
    END LOOP;
    RETURN v_out;
END
$$;
COMMENT ON FUNCTION llm._exact_rates(text, text, jsonb, text[]) IS
    'The class rates of one level of a price as exact JSON numbers (keys in p_extra skipped); 22023 for an unknown class or a bad rate.';

-- A price as stored: the base rates and the tiers in ascending threshold, every rate
-- an exact JSON number (trailing zeros dropped, so equal rates compare and print alike).
CREATE OR REPLACE FUNCTION llm._normalized_rates(p_model text, p_rates jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_out jsonb;
    v_tier jsonb;
    v_tiers jsonb := '[]'::jsonb;
    v_above numeric;
    v_seen numeric[] := '{}'::numeric[];
BEGIN
    IF p_rates IS NULL OR pg_catalog.jsonb_typeof(p_rates) <> 'object' THEN
        PERFORM llm._raise_bad_price(p_model, 'is no JSON object', pg_catalog.format('p_rates is %s.', coalesce(p_rates::text, 'NULL')));
    END IF;
    v_out := llm._exact_rates(p_model, 'p_rates', p_rates, '{currency,tiers}'::text[]);
    IF v_out = '{}'::jsonb THEN
        PERFORM llm._raise_bad_price(p_model, 'has no rate', 'p_rates names no token class.');
    END IF;
    IF p_rates ? 'tiers' THEN
        IF pg_catalog.jsonb_typeof(p_rates -> 'tiers') <> 'array' THEN
            PERFORM llm._raise_bad_price(p_model, 'has tiers that are no list', pg_catalog.format('tiers is %s.', p_rates -> 'tiers'));
        END IF;
        FOR v_tier IN SELECT t.value FROM pg_catalog.jsonb_array_elements(p_rates -> 'tiers') AS t LOOP
            IF pg_catalog.jsonb_typeof(v_tier) <> 'object'
               OR pg_catalog.jsonb_typeof(v_tier -> 'above_prompt_tokens') IS DISTINCT FROM 'number' THEN
                PERFORM llm._raise_bad_price(p_model, 'has a tier without above_prompt_tokens', pg_catalog.format('The tier is %s.', v_tier));
            END IF;
            v_above := (v_tier ->> 'above_prompt_tokens')::numeric;
            IF v_above <> pg_catalog.trunc(v_above) OR v_above < 0 OR v_above > llm._max_amount() THEN
                PERFORM llm._raise_bad_price(p_model, 'has a tier threshold out of range',
                    pg_catalog.format('above_prompt_tokens is %s; accepted: an integer 0 .. %s.', v_above, llm._max_amount()));
            END IF;
            IF v_above = ANY (v_seen) THEN
                PERFORM llm._raise_bad_price(p_model, 'has two tiers with one threshold',
                    pg_catalog.format('above_prompt_tokens %s appears twice.', v_above));
            END IF;
            v_seen := v_seen || v_above;
            v_tier := llm._exact_rates(p_model, pg_catalog.format('tier above %s', v_above), v_tier, '{above_prompt_tokens}'::text[]);
            IF v_tier = '{}'::jsonb THEN
                PERFORM llm._raise_bad_price(p_model, 'has a tier with no rate',
                    pg_catalog.format('The tier above %s prompt tokens names no token class.', v_above));
            END IF;
            v_tiers := v_tiers || pg_catalog.jsonb_build_array(
                pg_catalog.jsonb_build_object('above_prompt_tokens', v_above::bigint) || v_tier);
        END LOOP;
        SELECT coalesce(pg_catalog.jsonb_agg(t.value ORDER BY (t.value ->> 'above_prompt_tokens')::bigint), '[]'::jsonb)
          INTO v_tiers FROM pg_catalog.jsonb_array_elements(v_tiers) AS t;
        IF v_tiers <> '[]'::jsonb THEN
            v_out := v_out || pg_catalog.jsonb_build_object('tiers', v_tiers);
        END IF;
    END IF;
    RETURN v_out;
END
$$;
COMMENT ON FUNCTION llm._normalized_rates(text, jsonb) IS
    'p_rates checked and as stored: exact rates per class, tiers sorted by threshold, no currency; 22023 for anything that cannot price.';

CREATE OR REPLACE FUNCTION llm._usage_ok(p_usage jsonb)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.jsonb_typeof(p_usage) OPERATOR(pg_catalog.=) 'object'
       AND (p_usage OPERATOR(pg_catalog.-) llm._price_classes()) OPERATOR(pg_catalog.=) '{}'::jsonb
       AND NOT pg_catalog.jsonb_path_exists(p_usage,
               '$.* ? (@.type() != "number" || @ < 0 || @ > 1000000000000000 || @.floor() != @)')
$$;
COMMENT ON FUNCTION llm._usage_ok(jsonb) IS
    'True for a usage object whose keys are token classes and whose values are integers 0 .. 10^15.';

CREATE OR REPLACE FUNCTION llm._check_usage(p_usage jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_key text;
    v_value jsonb;
BEGIN
    IF llm._usage_ok(p_usage) THEN
        RETURN;
    END IF;
    IF p_usage IS NULL OR pg_catalog.jsonb_typeof(p_usage) <> 'object' THEN
        RAISE EXCEPTION 'llm: usage must be a JSON object'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('p_usage is %s.', coalesce(p_usage::text, 'NULL')),
                  HINT = 'Pass token counts by class, for example {"input": 1200, "cache_read": 800, "output": 300}.';
    END IF;
    FOR v_key, v_value IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(p_usage) AS e LOOP
        IF NOT v_key = ANY (llm._price_classes()) THEN
            RAISE EXCEPTION 'llm: usage names an unknown token class %', pg_catalog.quote_literal(v_key)
                USING ERRCODE = '22023',
                      DETAIL = pg_catalog.format('The classes are %s.', pg_catalog.array_to_string(llm._price_classes(), ', ')),
                      HINT = 'llm_db.Usage.from_openai, from_anthropic and from_gemini map a provider''s usage to the classes.';
        END IF;
        IF NOT llm._usage_ok(pg_catalog.jsonb_build_object(v_key, v_value)) THEN
            RAISE EXCEPTION 'llm: usage of % is no token count', v_key
                USING ERRCODE = '22023',
                      DETAIL = pg_catalog.format('%s is %s; accepted: an integer 0 .. %s.', v_key, v_value, llm._max_amount());
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION llm._check_usage(jsonb) IS
    'Raises 22023 unless p_usage is an object of token classes to integers 0 .. 10^15.';

-- The tier of a price that a usage's prompt (input and the cache's reads and writes)
-- selects: the highest threshold the prompt is above ('{}' at base rates). Tiers are
-- stored in ascending threshold order. Inlinable. (Here and below a JSON number is
-- read with -> and a cast, never ->> and a cast: the text round trip costs every
-- transaction's first evaluation two type lookups per field, measured.)
CREATE OR REPLACE FUNCTION llm._price_tier(p_rates jsonb, p_usage jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_rates OPERATOR(pg_catalog.?) 'tiers' THEN coalesce((
        SELECT t.value
          FROM pg_catalog.jsonb_array_elements(p_rates OPERATOR(pg_catalog.->) 'tiers') WITH ORDINALITY AS t (value, n)
         WHERE (t.value OPERATOR(pg_catalog.->) 'above_prompt_tokens')::numeric OPERATOR(pg_catalog.<)
               (coalesce((p_usage OPERATOR(pg_catalog.->) 'input')::numeric, 0)
                OPERATOR(pg_catalog.+) coalesce((p_usage OPERATOR(pg_catalog.->) 'cache_read')::numeric, 0)
                OPERATOR(pg_catalog.+) coalesce((p_usage OPERATOR(pg_catalog.->) 'cache_write_5m')::numeric, 0)
                OPERATOR(pg_catalog.+) coalesce((p_usage OPERATOR(pg_catalog.->) 'cache_write_1h')::numeric, 0))
         ORDER BY t.n DESC
         LIMIT 1), '{}'::jsonb) ELSE '{}'::jsonb END
$$;
COMMENT ON FUNCTION llm._price_tier(jsonb, jsonb) IS
    'The tier of p_rates whose threshold is the highest that p_usage''s prompt tokens are above; ''{}'' (base rates) when none is.';

-- One class's share of a cost, in nanos, exact: its tokens at the tier's rate, else the
-- base's (reasoning then the output rate, the tier's before the base's), per million
-- tokens; for requests, the calls (1 unless the usage says) at the per-call fee (0
-- when the price lists none). NULL for tokens with no rate. Inlinable: with p_class a
-- constant, the planner folds the CASE to its one branch.
CREATE OR REPLACE FUNCTION llm._class_cost(p_rates jsonb, p_tier jsonb, p_usage jsonb, p_class text)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_class OPERATOR(pg_catalog.=) 'requests'
                THEN coalesce((p_usage OPERATOR(pg_catalog.->) 'requests')::numeric, 1)
                     OPERATOR(pg_catalog.*) coalesce((p_tier OPERATOR(pg_catalog.->) 'requests')::numeric,
                                                     (p_rates OPERATOR(pg_catalog.->) 'requests')::numeric, 0)
                     OPERATOR(pg_catalog.*) 1000000000
                WHEN coalesce((p_usage OPERATOR(pg_catalog.->) p_class)::numeric, 0) OPERATOR(pg_catalog.=) 0 THEN 0
                ELSE (p_usage OPERATOR(pg_catalog.->) p_class)::numeric
                     OPERATOR(pg_catalog.*) coalesce(
                         (p_tier OPERATOR(pg_catalog.->) p_class)::numeric,
                         (p_rates OPERATOR(pg_catalog.->) p_class)::numeric,
                         CASE WHEN p_class OPERATOR(pg_catalog.=) 'reasoning'
                              THEN coalesce((p_tier OPERATOR(pg_catalog.->) 'output')::numeric,
                                            (p_rates OPERATOR(pg_catalog.->) 'output')::numeric) END)
                     OPERATOR(pg_catalog.*) 1000 END
$$;
COMMENT ON FUNCTION llm._class_cost(jsonb, jsonb, jsonb, text) IS
    'The exact nanos p_usage''s tokens of p_class cost at p_tier''s rate, else p_rates'' (per million tokens; per call for requests); NULL for tokens with no rate.';

-- A version's base rates as the nanos one unit of each class costs (a token; a call for
-- requests): the cost of a usage of that one unit alone, so the rule is _class_cost's.
-- A class with no rate costs 10^30, more than any usage may cost in all (10^15 nanos),
-- so that a usage with tokens of it can be told by its sum. NULL for a price with
-- tiers (a usage's tier is not known before its prompt is).
CREATE OR REPLACE FUNCTION llm._unit_nanos(p_rates jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.jsonb_object_agg(c.class, coalesce(
               llm._class_cost(p_rates, '{}'::jsonb, pg_catalog.jsonb_build_object(c.class, 1), c.class),
               1000000000000000000000000000000::numeric))
      FROM pg_catalog.unnest(llm._price_classes()) AS c (class)
     WHERE NOT p_rates OPERATOR(pg_catalog.?) 'tiers'
$$;
COMMENT ON FUNCTION llm._unit_nanos(jsonb) IS
    'The nanos one token of each class costs at p_rates'' base rates (one call for requests; 10^30 for a class with no rate); NULL for rates with tiers. Stored as price_versions.unit_nanos.';

-- An admission's estimate in nanos from a version's unit_nanos: the prompt at the input
-- rate, the most output at the output rate, one call's fee; the cost of the usage
-- {"input": p_input, "output": p_output} as _usage_cost finds it, unrounded. Past
-- 10^15 when either class has no rate; NULL without units (a price with tiers).
-- Inlinable: admission prices with no call and no jsonb built.
CREATE OR REPLACE FUNCTION llm._unit_estimate(p_unit_nanos jsonb, p_input bigint, p_output bigint)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (p_input OPERATOR(pg_catalog.*) (p_unit_nanos OPERATOR(pg_catalog.->) 'input')::numeric)
           OPERATOR(pg_catalog.+) (p_output OPERATOR(pg_catalog.*) (p_unit_nanos OPERATOR(pg_catalog.->) 'output')::numeric)
           OPERATOR(pg_catalog.+) (p_unit_nanos OPERATOR(pg_catalog.->) 'requests')::numeric  -- (OPERATOR() binds all alike)
$$;
COMMENT ON FUNCTION llm._unit_estimate(jsonb, bigint, bigint) IS
    'The unrounded nanos of p_input input and p_output output tokens and one call at p_unit_nanos (a version''s unit_nanos); past 10^15 when either class has no rate.';

-- The cost of a usage with every class (llm._full_usage) at a version's unit_nanos,
-- exact and unrounded, in one expression: a jsonpath of numeric products. Past 10^15
-- for tokens of a class with no rate; NULL for a usage without every class or a price
-- without units (one with tiers). The request path's cost (docs/architecture.md
-- "The price book", on the request path): _usage_cost below finds the same cost
-- class by class with some seventy expression nodes, and PL/pgSQL compiles every
-- expression again in each transaction, about 2,000 instructions a node (measured:
-- 161,000 instructions a call against 25,000). Inlinable.
CREATE OR REPLACE FUNCTION llm._unit_cost(p_unit_nanos jsonb, p_usage jsonb)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.jsonb_path_query_first(p_usage,
               '$.input * $input + $.cache_read * $cache_read + $.cache_write_5m * $cache_write_5m'
               ' + $.cache_write_1h * $cache_write_1h + $.output * $output + $.reasoning * $reasoning'
               ' + $.requests * $requests', p_unit_nanos, true)::numeric  -- silent: a missing class is NULL
$$;
COMMENT ON FUNCTION llm._unit_cost(jsonb, jsonb) IS
    'The unrounded nanos of p_usage (every class present) at p_unit_nanos (a version''s unit_nanos); past 10^15 for tokens of a class with no rate, NULL for a usage without every class or no units.';

-- The cost of a usage at a version's rates, exact, rounded once half up (a cost is
-- never negative), the tier that priced it, and the credits it is charged at
-- p_nanos_per_credit (rounded up). Tokens of a class with no rate are refused naming
-- the class and the version. Class by class: the request path prices from units
-- (_unit_cost, _unit_estimate) and comes here for what they cannot price: a price
-- with tiers, and the refusals. Arguments already checked.
CREATE OR REPLACE FUNCTION llm._usage_cost(
    p_model text, p_version_id bigint, p_rates jsonb, p_usage jsonb, p_nanos_per_credit bigint,
    OUT cost_nanos bigint, OUT price_tier bigint, OUT credits bigint)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_tier jsonb := '{}'::jsonb;  -- the tier's rates ('{}': the base's)
    v_class text;
    v_cost numeric;
BEGIN
    IF p_rates ? 'tiers' THEN
        v_tier := llm._price_tier(p_rates, p_usage);
        price_tier := (v_tier -> 'above_prompt_tokens')::bigint;
    END IF;
    v_cost := pg_catalog.round(
        llm._class_cost(p_rates, v_tier, p_usage, 'input') + llm._class_cost(p_rates, v_tier, p_usage, 'cache_read')
        + llm._class_cost(p_rates, v_tier, p_usage, 'cache_write_5m') + llm._class_cost(p_rates, v_tier, p_usage, 'cache_write_1h')
        + llm._class_cost(p_rates, v_tier, p_usage, 'output') + llm._class_cost(p_rates, v_tier, p_usage, 'reasoning')
        + llm._class_cost(p_rates, v_tier, p_usage, 'requests'));
    IF v_cost IS NULL THEN
        FOREACH v_class IN ARRAY llm._price_classes() LOOP
            CONTINUE WHEN llm._class_cost(p_rates, v_tier, p_usage, v_class) IS NOT NULL;
            RAISE EXCEPTION 'llm: the price of % has no rate for %', p_model, v_class
                USING ERRCODE = '22023',
                      DETAIL = pg_catalog.format('Price version %s prices no %s tokens%s; the usage has %s.', p_version_id, v_class,
                                                 CASE WHEN price_tier IS NULL THEN '' ELSE pg_catalog.format(' above %s prompt tokens', price_tier) END,
                                                 p_usage -> v_class),
                      HINT = 'Set a price that lists the class (llm.set_price); an unpriced class is never charged as 0.';
        END LOOP;
    ELSIF v_cost > llm._max_amount() THEN
        RAISE EXCEPTION 'llm: the usage of % costs more than one call may', p_model
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('Price version %s puts it at %s nanos; the most one call may cost is %s.',
                                             p_version_id, v_cost, llm._max_amount());
    END IF;
    cost_nanos := v_cost;
    -- ceil(cost / rate): both at most 10^15, so the sum cannot overflow (llm._credits_of)
    credits := (cost_nanos + p_nanos_per_credit - 1) / p_nanos_per_credit;
END
$$;
COMMENT ON FUNCTION llm._usage_cost(text, bigint, jsonb, jsonb, bigint) IS
    'The exact cost in nanos of p_usage at p_rates, class by class, rounded once half up, the tier that priced it (NULL: base rates) and the credits at p_nanos_per_credit (rounded up); 22023 for tokens of a class with no rate or a cost over 10^15 nanos.';

CREATE OR REPLACE FUNCTION llm._raise_price_missing(p_organization_id uuid, p_model text, p_at timestamptz, p_what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'llm: no % in force for model % of organization %', p_what, p_model, coalesce(p_organization_id::text, '(the book)')
        USING ERRCODE = 'LL014',
              DETAIL = pg_catalog.format('model=%s organization=%s at=%s', p_model,
                                         coalesce(p_organization_id::text, '-'), pg_catalog.to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
              HINT = CASE WHEN p_what = 'price' THEN 'Set one with llm.set_price(model, rates), or a fallback with llm.set_price(''*'', rates): an unknown model is never priced at 0.'
                                 ELSE 'Set one with llm.set_credit_rate(nanos_per_credit).' END;
END
$$;
COMMENT ON FUNCTION llm._raise_price_missing(uuid, text, timestamptz, text) IS
    'Raises LL014 (PriceMissing): no price version (p_what price) or credit rate in force for the model and organization at p_at.';

-- The credits a cost is charged: rounded up, so a tenant never pays fewer credits than
-- its cost. Inlinable; both arguments are at most 10^15, so the sum cannot overflow.
CREATE OR REPLACE FUNCTION llm._credits_of(p_cost_nanos bigint, p_nanos_per_credit bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (p_cost_nanos OPERATOR(pg_catalog.+) p_nanos_per_credit OPERATOR(pg_catalog.-) 1)
           OPERATOR(pg_catalog./) p_nanos_per_credit
$$;
COMMENT ON FUNCTION llm._credits_of(bigint, bigint) IS
    'ceil(p_cost_nanos / p_nanos_per_credit): the credits a cost is charged.';

-- The price version and credit rate in force for an organization's model at a time:
-- the model's version before the fallback '*', the organization's own before the
-- book's, the latest effective_from; the credit rate likewise. NULLs where none is.
-- (PL/pgSQL, not SQL functions: docs/architecture.md "Citus rules".)
CREATE OR REPLACE FUNCTION llm._price_in_force(
    p_organization_id uuid, p_model text, p_at timestamptz,
    OUT price_version_id bigint, OUT rates jsonb, OUT fallback boolean,
    OUT credit_rate_id bigint, OUT nanos_per_credit bigint)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    SELECT v.id, v.rates, v.model = '*' INTO price_version_id, rates, fallback
      FROM llm.price_versions AS v
     WHERE v.model = ANY (ARRAY[p_model, '*'])
       AND (v.organization_id = p_organization_id OR v.organization_id IS NULL)
       AND v.effective_from <= p_at
     ORDER BY v.model = '*', v.organization_id IS NULL, v.effective_from DESC
     LIMIT 1;
    IF price_version_id IS NOT NULL THEN
        SELECT r.id, r.nanos_per_credit INTO credit_rate_id, nanos_per_credit
          FROM llm.credit_rates AS r
         WHERE (r.organization_id = p_organization_id OR r.organization_id IS NULL)
           AND r.effective_from <= p_at
         ORDER BY r.organization_id IS NULL, r.effective_from DESC
         LIMIT 1;
    END IF;
END
$$;
COMMENT ON FUNCTION llm._price_in_force(uuid, text, timestamptz) IS
    'The price version (with its rates and whether it is the fallback) and the credit rate in force for p_organization_id (NULL: the book) and p_model at p_at; NULLs where none is (no credit rate is looked up without a price).';

-- Raises LL014 unless a price version and a credit rate are in force (as
-- _price_in_force found them).
CREATE OR REPLACE FUNCTION llm._require_price(
    p_organization_id uuid, p_model text, p_at timestamptz, p_price_version_id bigint, p_credit_rate_id bigint)
RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_price_version_id IS NULL THEN
        PERFORM llm._raise_price_missing(p_organization_id, p_model, p_at, 'price');
    ELSIF p_credit_rate_id IS NULL THEN
        PERFORM llm._raise_price_missing(p_organization_id, p_model, p_at, 'credit rate');
    END IF;
END
$$;
COMMENT ON FUNCTION llm._require_price(uuid, text, timestamptz, bigint, bigint) IS
    'Raises LL014 (PriceMissing) when _price_in_force found no price version or no credit rate.';

-- What a usage costs and is charged for an organization at a time, with the
-- versions that price it. Arguments already checked.
CREATE OR REPLACE FUNCTION llm._quote(p_organization_id uuid, p_model text, p_usage jsonb, p_at timestamptz)
RETURNS llm.price_quote
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_pin record := llm._price_in_force(p_organization_id, p_model, p_at);
    v_cost record;
BEGIN
    PERFORM llm._require_price(p_organization_id, p_model, p_at, v_pin.price_version_id, v_pin.credit_rate_id);
    v_cost := llm._usage_cost(p_model, v_pin.price_version_id, v_pin.rates, p_usage, v_pin.nanos_per_credit);
    RETURN ROW(v_cost.cost_nanos, v_cost.credits,
               v_pin.price_version_id, v_pin.credit_rate_id, v_cost.price_tier,
               CASE WHEN v_pin.fallback THEN 'fallback' ELSE 'model' END,
               (SELECT s.currency FROM llm.settings AS s))::llm.price_quote;
END
$$;
COMMENT ON FUNCTION llm._quote(uuid, text, jsonb, timestamptz) IS
    'The price_quote of p_usage of p_model for an organization (NULL: the book) at p_at; LL014 without a price or credit rate in force.';

-- A usage with every class present (requests 1 unless it says), so that two usages
-- compare equal exactly when they price alike. Inlinable.
CREATE OR REPLACE FUNCTION llm._full_usage(p_usage jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '{"input": 0, "cache_read": 0, "cache_write_5m": 0, "cache_write_1h": 0, "output": 0, "reasoning": 0, "requests": 1}'::jsonb
           OPERATOR(pg_catalog.||) p_usage
$$;
COMMENT ON FUNCTION llm._full_usage(jsonb) IS
    'p_usage with every token class present: a missing class 0, requests 1.';

-- The usage a priced admission's estimate stands for: its prompt as input tokens (an
-- admission cannot know what the cache will hold) and its most output. Inlinable.
CREATE OR REPLACE FUNCTION llm._estimate_usage(p_input_tokens bigint, p_max_output_tokens bigint)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.jsonb_build_object('input', p_input_tokens, 'output', p_max_output_tokens)
$$;
COMMENT ON FUNCTION llm._estimate_usage(bigint, bigint) IS
    'The usage a priced estimate stands for: {"input": p_input_tokens, "output": p_max_output_tokens}.';

-- An admission's estimate comes from one source: credits, or the tokens the book
-- prices (p_input_tokens and p_max_output_tokens, both).
CREATE OR REPLACE FUNCTION llm._check_estimate_source(
    p_estimate_credits bigint, p_input_tokens bigint, p_max_output_tokens bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_estimate_credits IS NOT NULL AND (p_input_tokens IS NOT NULL OR p_max_output_tokens IS NOT NULL) THEN
        RAISE EXCEPTION 'llm: an estimate in credits and token counts to price were both given'
            USING ERRCODE = '22023',
                  HINT = 'Pass p_estimate_credits, or NULL with p_input_tokens and p_max_output_tokens for the book to price.';
    ELSIF p_estimate_credits IS NULL AND (p_input_tokens IS NOT NULL OR p_max_output_tokens IS NOT NULL) THEN
        PERFORM llm._check_amount('p_input_tokens', p_input_tokens);
        PERFORM llm._check_amount('p_max_output_tokens', p_max_output_tokens);
    ELSE
        IF p_estimate_credits IS NULL THEN
            RAISE EXCEPTION 'llm: p_estimate_credits must not be NULL'
                USING ERRCODE = '22023',
                      HINT = 'Pass 0 when there is nothing to hold, or p_input_tokens and p_max_output_tokens for the book to price the estimate.';
        END IF;
        PERFORM llm._check_amount('p_estimate_credits', p_estimate_credits);
    END IF;
END
$$;
COMMENT ON FUNCTION llm._check_estimate_source(bigint, bigint, bigint) IS
    'Raises 22023 unless an admission names exactly one estimate source: p_estimate_credits, or p_input_tokens and p_max_output_tokens, each an amount 0 .. 10^15.';

CREATE OR REPLACE FUNCTION llm.price_usage(
    p_model text, p_usage jsonb, p_organization_id uuid DEFAULT NULL, p_at timestamptz DEFAULT NULL)
RETURNS llm.price_quote
LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
DECLARE
    v_at timestamptz := coalesce(p_at, pg_catalog.now());
BEGIN
    PERFORM llm._check_text('p_model', p_model, 200);
    PERFORM llm._check_usage(p_usage);
    PERFORM llm._check_clock(p_at);
    IF p_organization_id IS NOT NULL AND NOT EXISTS (SELECT FROM llm.organizations AS o WHERE o.id = p_organization_id) THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    RETURN llm._quote(p_organization_id, p_model, p_usage, v_at);
END
$$;
COMMENT ON FUNCTION llm.price_usage(text, jsonb, uuid, timestamptz) IS
    'What p_usage of p_model costs (exact nanos) and is charged (credits) for an organization (NULL: the book''s prices) at p_at, with the versions that price it; writes nothing. LL014 without a price or credit rate in force, 22023 for a bad usage or a class with no rate.';

CREATE OR REPLACE FUNCTION llm.set_price(
    p_model text, p_rates jsonb, p_effective_from timestamptz DEFAULT now(), p_organization_id uuid DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_from timestamptz := coalesce(p_effective_from, pg_catalog.now());
    v_currency text := (SELECT s.currency FROM llm.settings AS s);
    v_rates jsonb;
    v_id bigint;
    v_stored record;
BEGIN
    PERFORM llm._check_text('p_model', p_model, 200);
    PERFORM llm._check_clock(p_effective_from);
    v_rates := llm._normalized_rates(p_model, p_rates);
    IF p_rates ? 'currency' AND (p_rates ->> 'currency') IS DISTINCT FROM v_currency THEN
        PERFORM llm._raise_bad_price(p_model, 'is in another currency',
            pg_catalog.format('The price is in %s; the book is in %s (llm.settings.currency).', p_rates -> 'currency', v_currency),
            'Set every price in the book''s currency; the book has one.');
    END IF;
    IF p_organization_id IS NOT NULL AND NOT EXISTS (SELECT FROM llm.organizations AS o WHERE o.id = p_organization_id) THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    -- Exactly the rates already in force then (for this model and organization) add
    -- no version: setting a price book again, or importing it twice, changes nothing.
    SELECT v.id, v.rates, v.currency INTO v_stored
      FROM llm.price_versions AS v
     WHERE v.model = p_model AND v.organization_id IS NOT DISTINCT FROM p_organization_id
       AND v.effective_from <= v_from
     ORDER BY v.effective_from DESC
     LIMIT 1;
    IF v_stored.rates = v_rates AND v_stored.currency = v_currency THEN
        RETURN v_stored.id;
    END IF;
    -- Race-free: two callers of one key meet at the unique key, and the second reads
    -- the first's version.
    INSERT INTO llm.price_versions AS v (model, organization_id, effective_from, currency, rates, unit_nanos)
    VALUES (p_model, p_organization_id, v_from, v_currency, v_rates, llm._unit_nanos(v_rates))
    ON CONFLICT ON CONSTRAINT price_versions_key DO NOTHING
    RETURNING v.id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;
    SELECT v.id, v.rates, v.currency INTO v_stored
      FROM llm.price_versions AS v
     WHERE v.model = p_model AND v.organization_id IS NOT DISTINCT FROM p_organization_id AND v.effective_from = v_from;
    IF v_stored.rates = v_rates AND v_stored.currency = v_currency THEN
        RETURN v_stored.id;
    END IF;
    PERFORM llm._raise_bad_price(p_model, 'already has other rates from that time',
        pg_catalog.format('Version %s from %s has %s; a version never changes.', v_stored.id, v_from, v_stored.rates),
        'A correction is a version from a later time; requests already priced move to it only by repricing.');
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION llm.set_price(text, jsonb, timestamptz, uuid) IS
    'Adds a price version of p_model (''*'': the fallback) from p_effective_from, for the book or one organization, and returns its id; exactly the rates in force then return that version and add none; other rates at an existing effective_from are 22023 (versions never change).';

CREATE OR REPLACE FUNCTION llm.set_credit_rate(
    p_nanos_per_credit bigint, p_organization_id uuid DEFAULT NULL, p_effective_from timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_from timestamptz := coalesce(p_effective_from, pg_catalog.now());
    v_id bigint;
    v_stored record;
BEGIN
    IF p_nanos_per_credit IS NULL OR p_nanos_per_credit < 1 OR p_nanos_per_credit > llm._max_amount() THEN
        RAISE EXCEPTION 'llm: % nanos per credit is out of range', coalesce(p_nanos_per_credit::text, 'NULL')
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('accepted: 1 .. %s nanos of the book''s currency per credit.', llm._max_amount()),
                  HINT = 'A credit worth a tenth of a cent of USD is 1000000 nanos; a plan''s markup is a smaller figure.';
    END IF;
    PERFORM llm._check_clock(p_effective_from);
    IF p_organization_id IS NOT NULL AND NOT EXISTS (SELECT FROM llm.organizations AS o WHERE o.id = p_organization_id) THEN
        PERFORM llm._raise_unknown_org(p_organization_id);
    END IF;
    INSERT INTO llm.credit_rates AS r (organization_id, effective_from, nanos_per_credit)
    VALUES (p_organization_id, v_from, p_nanos_per_credit)
    ON CONFLICT ON CONSTRAINT credit_rates_key DO NOTHING
    RETURNING r.id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;
    SELECT r.id, r.nanos_per_credit INTO v_stored
      FROM llm.credit_rates AS r
     WHERE r.organization_id IS NOT DISTINCT FROM p_organization_id AND r.effective_from = v_from;
    IF v_stored.nanos_per_credit = p_nanos_per_credit THEN
        RETURN v_stored.id;
    END IF;
    RAISE EXCEPTION 'llm: a credit rate from % already exists', v_from
        USING ERRCODE = '22023',
              DETAIL = pg_catalog.format('Credit rate %s from then is %s nanos per credit; a rate never changes.', v_stored.id, v_stored.nanos_per_credit),
              HINT = 'Set the new rate from a later time.';
END
$$;
COMMENT ON FUNCTION llm.set_credit_rate(bigint, uuid, timestamptz) IS
    'Adds a credit rate (nanos of the book''s currency per credit) from p_effective_from, for the book or one organization, and returns its id; credits are ceil(cost / rate). The same rate at the same time returns that rate''s id, another is 22023.';

CREATE OR REPLACE VIEW llm.prices WITH (security_invoker = true) AS
SELECT v.id, v.model, v.organization_id, v.effective_from, v.currency, v.rates
  FROM llm.price_versions AS v;
COMMENT ON VIEW llm.prices IS
    'Every price version: model (''*'': the fallback), organization (NULL: the book''s), from when, currency and rates per million tokens (per call for requests).';
