-- llm-db: the schema as migrations/ and sql/ build it (schema llm; owners left out).
-- Generated, never edited: LLM_DB_WRITE_SCHEMA=1 bash scripts/test.sh tests/test_schema.py
-- tests/test_schema.py fails when this file and a fresh migrate differ.

CREATE SCHEMA llm;

CREATE DOMAIN llm.amount AS bigint
	CONSTRAINT amount_check CHECK ((VALUE >= 0));

COMMENT ON DOMAIN llm.amount IS 'A non-negative credit, cent, token, count or duration amount (NULL allowed where the column allows it).';

CREATE DOMAIN llm.invocation_status AS text
	CONSTRAINT invocation_status_check CHECK ((VALUE = ANY (ARRAY['reserved'::text, 'dispatched'::text, 'settled'::text, 'failed'::text])));

COMMENT ON DOMAIN llm.invocation_status IS 'reserved -> dispatched -> settled | failed.';

CREATE DOMAIN llm.settlement_kind AS text
	CONSTRAINT settlement_kind_check CHECK ((VALUE = ANY (ARRAY['measured'::text, 'recovered'::text, 'trued_up'::text])));

COMMENT ON DOMAIN llm.settlement_kind IS 'How a settled invocation was charged: measured usage, recovered by the pass (per its organization''s recovery_charge), or trued_up to a measured settlement that arrived after recovery.';

CREATE TYPE llm.admission_result AS (
	organization_id uuid,
	id uuid,
	period_start date,
	execution_id uuid,
	model text,
	status llm.invocation_status,
	estimate_credits llm.amount,
	hold_credits llm.amount,
	charged_credits llm.amount,
	charged_cents llm.amount,
	input_tokens llm.amount,
	output_tokens llm.amount,
	settlement_kind llm.settlement_kind,
	created_at timestamp with time zone,
	dispatched_at timestamp with time zone,
	settled_at timestamp with time zone,
	past_window_alerted_at timestamp with time zone,
	error text,
	late_credits bigint,
	late_cents bigint,
	late_input_tokens bigint,
	late_output_tokens bigint,
	late_reported_at timestamp with time zone,
	recovered_credits llm.amount,
	stripe smallint,
	replayed boolean
);

COMMENT ON TYPE llm.admission_result IS 'A request as admit_invocation and mark_dispatched return it: the columns of llm.invocations as of 0.2.0, then replayed (the call returned an earlier admission or dispatch unchanged).';

CREATE DOMAIN llm.execution_status AS text
	CONSTRAINT execution_status_check CHECK ((VALUE = ANY (ARRAY['running'::text, 'completed'::text, 'failed'::text, 'abandoned'::text])));

COMMENT ON DOMAIN llm.execution_status IS 'running -> completed | failed | abandoned.';

CREATE DOMAIN llm.ledger_entry AS text
	CONSTRAINT ledger_entry_check CHECK ((VALUE = ANY (ARRAY['hold'::text, 'release'::text, 'charge'::text, 'adjustment'::text])));

COMMENT ON DOMAIN llm.ledger_entry IS 'The kind of a ledger row: one hold, one release, at most one charge and at most one adjustment (a true-up, signed) per invocation.';

CREATE TYPE llm.notice_claim AS (
	organization_id uuid,
	id uuid,
	period_start date,
	threshold_pct integer,
	crossed_at timestamp with time zone,
	used_credits bigint,
	allowance_credits bigint,
	status text,
	attempts integer,
	last_error text,
	next_attempt_at timestamp with time zone,
	claimed_at timestamp with time zone,
	sent_at timestamp with time zone,
	claim_token uuid,
	scope text,
	scope_id text,
	budget_window text,
	window_start date,
	limit_credits bigint
);

COMMENT ON TYPE llm.notice_claim IS 'A notice as claim_notices returns it: the columns of llm.threshold_notices, with its claim''s token, the scope, id and window it is for (0015), and the window start and limit under their own names (0028).';

CREATE TYPE llm.org_sweep AS (
	organization_id uuid,
	recovered_requests integer,
	released_hold_credits numeric,
	past_window_alerts integer,
	abandoned_executions integer,
	drift_findings integer,
	notices_created integer,
	more_pending boolean,
	recovered_uncharged integer
);

COMMENT ON TYPE llm.org_sweep IS 'The figures of one organization''s reconciliation sweep.';

CREATE TYPE llm.organization_settings AS (
	id uuid,
	name text,
	status text,
	monthly_allowance_credits bigint,
	notice_thresholds integer[],
	created_at timestamp with time zone,
	updated_at timestamp with time zone,
	recovery_charge text,
	late_settlement text,
	period_stripes integer
);

COMMENT ON TYPE llm.organization_settings IS 'An organization as upsert_organization and set_recovery_policy return it: the columns of llm.organizations as of 0.2.0, fixed.';

CREATE TYPE llm.price_quote AS (
	cost_nanos bigint,
	credits bigint,
	price_version_id bigint,
	credit_rate_id bigint,
	price_tier bigint,
	priced_by text,
	currency text
);

COMMENT ON TYPE llm.price_quote IS 'What llm.price_usage returns: the exact cost in nanos, the credits it is charged, the versions that priced it, the tier (NULL at base rates) and whether the model''s price or the fallback priced it.';

CREATE TYPE llm.priced_usage AS (
	credits bigint,
	input_tokens bigint,
	output_tokens bigint,
	cost_nanos bigint,
	usage jsonb,
	price_tier bigint,
	priced_by text
);

COMMENT ON TYPE llm.priced_usage IS 'A request''s usage priced at its pinned version: the credits to charge, the tokens in (the prompt) and out (output and reasoning), the cost, the usage with every class, the tier and priced_by.';

CREATE DOMAIN llm.stripe AS smallint
	CONSTRAINT stripe_check CHECK (((VALUE >= 0) AND (VALUE <= 63)));

COMMENT ON DOMAIN llm.stripe IS 'A stripe of a period''s counters: 0 to 63.';

CREATE DOMAIN llm.total AS numeric
	CONSTRAINT total_check CHECK (((VALUE >= (0)::numeric) AND (VALUE = trunc(VALUE))));

COMMENT ON DOMAIN llm.total IS 'A non-negative whole sum of amounts that nothing bounds (a task''s, a day''s): numeric, so it never overflows.';

CREATE FUNCTION llm._abandon_stale_tasks(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 57fa701746fec141c3f15af1dd111797 $$;

COMMENT ON FUNCTION llm._abandon_stale_tasks(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone) IS 'Marks the organization''s tasks running since p_cutoff or earlier abandoned at p_now (no duration, totals kept); returns how many.';

CREATE FUNCTION llm._add_stripes(p_organization_id uuid, p_period_start date, p_stripes integer) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 c7aeadc2d3be62f0840bd36800f0944d $$;

COMMENT ON FUNCTION llm._add_stripes(p_organization_id uuid, p_period_start date, p_stripes integer) IS 'Creates the stripes 0 .. p_stripes - 1 of a period that it lacks, empty (their open fields NULL until the contract step of 0.4.0 ran).';

CREATE TABLE llm.invocations (
    organization_id uuid NOT NULL,
    id uuid NOT NULL,
    period_start date NOT NULL,
    execution_id uuid,
    model text NOT NULL,
    status llm.invocation_status DEFAULT 'reserved'::text NOT NULL,
    estimate_credits llm.amount NOT NULL,
    hold_credits llm.amount NOT NULL,
    charged_credits llm.amount,
    charged_cents llm.amount,
    input_tokens llm.amount,
    output_tokens llm.amount,
    settlement_kind llm.settlement_kind,
    created_at timestamp with time zone NOT NULL,
    dispatched_at timestamp with time zone,
    settled_at timestamp with time zone,
    past_window_alerted_at timestamp with time zone,
    error text,
    late_credits bigint,
    late_cents bigint,
    late_input_tokens bigint,
    late_output_tokens bigint,
    late_reported_at timestamp with time zone,
    recovered_credits llm.amount,
    stripe smallint DEFAULT 0 NOT NULL,
    project text,
    api_key text,
    end_user text,
    budget_mask smallint,
    budget_stripe smallint,
    price_version_id bigint,
    credit_rate_id bigint,
    priced_by text,
    cost_nanos bigint,
    usage jsonb,
    price_tier bigint
)
WITH (fillfactor='70');

COMMENT ON TABLE llm.invocations IS 'Model requests: reserved -> dispatched -> settled | failed; recovery settles at the estimate with no cents.';

COMMENT ON COLUMN llm.invocations.settled_at IS 'When the invocation became terminal (settled or failed).';

COMMENT ON COLUMN llm.invocations.late_credits IS 'A measured settlement reported after recovery: recorded for audit only, never charged.';

COMMENT ON COLUMN llm.invocations.recovered_credits IS 'What recovery charged this request (its estimate, or 0 under its organization''s recovery_charge); kept after a true-up.';

COMMENT ON COLUMN llm.invocations.stripe IS 'The stripe of its period that holds this request''s hold (and takes its charge).';

COMMENT ON COLUMN llm.invocations.project IS 'The project id the request named at admission (0.4.0 on; before, llm.invocation_scopes).';

COMMENT ON COLUMN llm.invocations.api_key IS 'The API key id the request named at admission (0.4.0 on; before, llm.invocation_scopes).';

COMMENT ON COLUMN llm.invocations.end_user IS 'The end user id the request named at admission (0.4.0 on; before, llm.invocation_scopes).';

COMMENT ON COLUMN llm.invocations.budget_mask IS 'The budget counters the request moves, fixed at admission: bit 3 * scope + window (organization 0, project 1, api_key 2, end_user 3; day 0, week 1, month 2); 0: none; NULL: admitted before 0.4.0 (llm.invocation_scopes holds it).';

COMMENT ON COLUMN llm.invocations.budget_stripe IS 'Which stripe of each budget counter holds the request: budget_stripe modulo the counter''s stripes (0 to 63, its admitting session''s).';

COMMENT ON COLUMN llm.invocations.price_version_id IS 'The price version in force for the request''s model when it was admitted (llm.prices), which prices its usage; NULL: none was.';

COMMENT ON COLUMN llm.invocations.cost_nanos IS 'What the book priced the measured usage at, exactly, in nanos; NULL when the caller priced it (its cost is charged_cents * 10^7) or nothing did (recovered).';

CREATE FUNCTION llm._admission(p_inv llm.invocations, p_replayed boolean) RETURNS llm.admission_result
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 f2dcd5588570661110373b844d66615a $$;

COMMENT ON FUNCTION llm._admission(p_inv llm.invocations, p_replayed boolean) IS 'The llm.admission_result of a request: its columns as of 0.2.0, then replayed.';

CREATE FUNCTION llm._admit_invocation(p_organization_id uuid, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_invocation_id uuid, p_now timestamp with time zone, p_project text, p_api_key text, p_end_user text, p_input_tokens bigint, p_max_output_tokens bigint) RETURNS llm.admission_result
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 7c263961279664a7d30c490f955f5f7e $$;

COMMENT ON FUNCTION llm._admit_invocation(p_organization_id uuid, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_invocation_id uuid, p_now timestamp with time zone, p_project text, p_api_key text, p_end_user text, p_input_tokens bigint, p_max_output_tokens bigint) IS 'Distributed twin of admit_invocation; arguments already checked. It pins the price in force and prices a NULL estimate from the tokens (LL014 without a price). replayed: the earlier admission of a retried id, returned unchanged.';

CREATE FUNCTION llm._allowances_near_limit(p_now timestamp with time zone) RETURNS TABLE(organization_id uuid, allowance bigint, committed numeric)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 ccb3b48e52e606ff64fc133d6eee9a17 $$;

COMMENT ON FUNCTION llm._allowances_near_limit(p_now timestamp with time zone) IS 'The organizations whose period containing p_now stands (used + held) at or above the first of their notice thresholds: the allowance near its limit.';

CREATE FUNCTION llm._amount_ok(p_value bigint, p_nullable boolean DEFAULT false) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 e5b20d3db77f0c00dd6e14aed344f42f $$;

COMMENT ON FUNCTION llm._amount_ok(p_value bigint, p_nullable boolean) IS 'True for a non-negative amount no larger than _max_amount() (10^15), or a NULL when p_nullable.';

CREATE FUNCTION llm._apply_to_periods(p_organization_id uuid, p_allowance bigint, p_thresholds integer[], p_every_period boolean, p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 89baabbb57d0f7141cc7b7ac0213e663 $$;

COMMENT ON FUNCTION llm._apply_to_periods(p_organization_id uuid, p_allowance bigint, p_thresholds integer[], p_every_period boolean, p_now timestamp with time zone) IS 'Applies a changed allowance to the period containing p_now and later ones, owing at once the thresholds their usage now stands at or above, and spreads the rooms again of those periods, or of every period of the organization when its threshold list changed (p_every_period); periods locked in period order.';

CREATE FUNCTION llm._audit_budgets(p_organization_id uuid, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 7c5f72034c8367860a3b3785c7aad334 $$;

COMMENT ON FUNCTION llm._audit_budgets(p_organization_id uuid, p_now timestamp with time zone) IS 'Recomputes the organization''s budget counters of the day, week and month containing p_now and of the ones before them from their requests in one statement; logs (WARNING) and returns how many disagree. Never repairs.';

CREATE FUNCTION llm._audit_org(p_organization_id uuid, p_now timestamp with time zone, p_run_id uuid) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b02fa32a7f519be8e59df6308f4b2633 $$;

COMMENT ON FUNCTION llm._audit_org(p_organization_id uuid, p_now timestamp with time zone, p_run_id uuid) IS 'When due (at least daily), recomputes the organization''s current and previous period, and every period with an unresolved finding, from their requests in one statement; records, logs and returns the periods that disagree (llm.period_findings), resolves findings that no longer hold; then logs and adds the budget counters of the current and previous windows that disagree (llm._audit_budgets); NULL when not due.';

CREATE FUNCTION llm._audits_due(p_now timestamp with time zone) RETURNS uuid[]
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 55a93746f99a45169536ac665df8864b $$;

COMMENT ON FUNCTION llm._audits_due(p_now timestamp with time zone) IS 'The operational organizations whose periods are due for their daily audit at p_now, in id order.';

CREATE FUNCTION llm._begin_run(p_now timestamp with time zone, OUT run_id uuid, OUT token uuid) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 8349c716ae4df17abc3d1d6879465ceb $$;

COMMENT ON FUNCTION llm._begin_run(p_now timestamp with time zone, OUT run_id uuid, OUT token uuid) IS 'Takes the pass lease and records a running pass (its run id and lease token), marking a pass that lost it failed; or, while another pass really holds the lease, records a skipped pass naming the holder and returns NULLs.';

CREATE FUNCTION llm._book_true_up(p_inv llm.invocations, p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 eff67ea59c2b5ed3a0251532a690823b $$;

COMMENT ON FUNCTION llm._book_true_up(p_inv llm.invocations, p_now timestamp with time zone) IS 'Books a true-up by the signed difference (the request''s adjustment ledger row): the task''s totals, the stripe of the request''s period (crossings when usage rises) and the daily usage of its settlement day, in the settlement''s transaction.';

CREATE FUNCTION llm._bound_locks() RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 5483e4c321c5f55d5e477f1dcfe12749 $$;

COMMENT ON FUNCTION llm._bound_locks() IS 'Sets lock_timeout to settings.org_lock_timeout for the rest of the transaction (or until restored); returns the value it replaced.';

CREATE FUNCTION llm._budget_keys(p_mask integer, p_project text, p_api_key text, p_end_user text, p_at timestamp with time zone) RETURNS TABLE(slot integer, scope text, scope_id text, budget_window text, window_start date)
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 49bd57830ced0229172a684be449c1d2 $$;

COMMENT ON FUNCTION llm._budget_keys(p_mask integer, p_project text, p_api_key text, p_end_user text, p_at timestamp with time zone) IS 'The budget counters (scope, real id, window, window start) a request admitted at p_at with budget_mask p_mask moves, in bit order.';

CREATE FUNCTION llm._budget_reached(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 76fae00246b9b8bca4c1f66b7e85b8ff $$;

COMMENT ON FUNCTION llm._budget_reached(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_now timestamp with time zone) IS 'With the budget just changed: locks the stripes of the counters it governs in the window containing p_now (one id, or every id without its own budget for ''*''), drops their rooms and owes every threshold they stand at or above under the budget that applies to each now.';

CREATE FUNCTION llm._budget_scopes() RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 48643dc7adbecdf3a33600721841c228 $$;

COMMENT ON FUNCTION llm._budget_scopes() IS 'The budget scopes in bit order (bit 3 * scope + window, scope from 0).';

CREATE FUNCTION llm._budget_slot(p_scope text, p_window text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 9dd9f080282cdaf445c37598ead6c20b $$;

COMMENT ON FUNCTION llm._budget_slot(p_scope text, p_window text) IS 'The budget_mask bit of a scope and window (3 * scope + window), NULL for an unknown one.';

CREATE FUNCTION llm._budget_terms(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, OUT limit_credits bigint, OUT thresholds integer[], OUT revision uuid, OUT stripes integer) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 f2f530b2d38d6a588d85ec94cd4d645e $$;

COMMENT ON FUNCTION llm._budget_terms(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, OUT limit_credits bigint, OUT thresholds integer[], OUT revision uuid, OUT stripes integer) IS 'The limit, thresholds, revision and stripe count of the budget that applies now to one id of a scope and window: its own, else the scope''s ''*''; NULL when none.';

CREATE FUNCTION llm._budget_windows() RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 7c07c1f5cd49d56e8ef922b29f54f46a $$;

COMMENT ON FUNCTION llm._budget_windows() IS 'The budget windows in bit order (bit 3 * scope + window, window from 0).';

CREATE FUNCTION llm._budgets_changed(p_organization_id uuid) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 851d10ed1554a2b6751ffaefa3408ae8 $$;

COMMENT ON FUNCTION llm._budgets_changed(p_organization_id uuid) IS 'Records that one of the organization''s budgets changed: whether it has a budget now, a new budgets revision, and its budgets when none names an id (uniform_budget_mask).';

CREATE FUNCTION llm._budgets_revision(p_organization_id uuid) RETURNS uuid
    LANGUAGE plpgsql STABLE
    AS $$ body in sql/, md5 1415a4bb2e8faacfd5687cbf0fa3ffba $$;

COMMENT ON FUNCTION llm._budgets_revision(p_organization_id uuid) IS 'The organization''s budgets revision: the one a budget counter''s rooms must be spread under to serve a movement.';

CREATE FUNCTION llm._check_amount(p_name text, p_value bigint, p_nullable boolean DEFAULT false) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 e6ac98b18d98a9e2994c3d0b1c7b864d $$;

COMMENT ON FUNCTION llm._check_amount(p_name text, p_value bigint, p_nullable boolean) IS 'Raises 22023 unless p_value is a non-negative amount no larger than _max_amount() (NULL allowed only when p_nullable).';

CREATE FUNCTION llm._check_call(p_organization_id uuid, p_now timestamp with time zone, p_what text DEFAULT NULL::text, p_id uuid DEFAULT NULL::uuid) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6110e732efc99c1f50edacca94e65342 $$;

COMMENT ON FUNCTION llm._check_call(p_organization_id uuid, p_now timestamp with time zone, p_what text, p_id uuid) IS 'Raises 22023 for a NULL organization id, an unusable clock, or (when p_what names it) a NULL id of the row the call acts on.';

CREATE FUNCTION llm._check_claim(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bae1c2a1b7aa8f6f0ea5cb7135ec18c5 $$;

COMMENT ON FUNCTION llm._check_claim(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) IS 'Raises 22023 for a NULL organization, notice or claim token, or an unusable clock: the arguments of the three ends of a claim.';

CREATE FUNCTION llm._check_clock(p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6dcc4dacf276b8ddcc2399749d9cdda4 $$;

COMMENT ON FUNCTION llm._check_clock(p_now timestamp with time zone) IS 'Raises 22023 for a p_now that is infinite or outside the years 1 .. 9999; NULL (the function''s own now()) passes.';

CREATE FUNCTION llm._check_day_range(p_from date, p_to date) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b890762347c54e218b37535227f8fb94 $$;

COMMENT ON FUNCTION llm._check_day_range(p_from date, p_to date) IS 'Raises 22023 unless p_from .. p_to is a range of finite days, in order, at most ten years long.';

CREATE FUNCTION llm._check_deadline(p_organization_id uuid, p_deadline timestamp with time zone, p_step text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6612d423d7fe73273bc9fbaec369bcc7 $$;

COMMENT ON FUNCTION llm._check_deadline(p_organization_id uuid, p_deadline timestamp with time zone, p_step text) IS 'Raises 57014 (column org_time_budget of llm.settings in its diagnostics) when clock_timestamp() is past p_deadline: the bound on one organization''s sweep, checked between its statements.';

CREATE FUNCTION llm._check_estimate_source(p_estimate_credits bigint, p_input_tokens bigint, p_max_output_tokens bigint) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9bbbd6b655abf478515dd50de90b1487 $$;

COMMENT ON FUNCTION llm._check_estimate_source(p_estimate_credits bigint, p_input_tokens bigint, p_max_output_tokens bigint) IS 'Raises 22023 unless an admission names exactly one estimate source: p_estimate_credits, or p_input_tokens and p_max_output_tokens, each an amount 0 .. 10^15.';

CREATE FUNCTION llm._check_report_scope(p_scope text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 163b57624936d2bd890fd76ffec02ed0 $$;

COMMENT ON FUNCTION llm._check_report_scope(p_scope text) IS 'Raises 22023 unless p_scope is a scope a request names an id of: project, api_key or end_user.';

CREATE FUNCTION llm._check_retry(p_message text, p_format text, p_stored text[], p_given text[], p_hint text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 ea4774bd5b152ad86f157aad60383833 $$;

COMMENT ON FUNCTION llm._check_retry(p_message text, p_format text, p_stored text[], p_given text[], p_hint text) IS 'Raises LL007 (DETAIL: stored and given, each in p_format) when a retry''s arguments differ from the first call''s.';

CREATE FUNCTION llm._check_scope_and_window(p_scope text, p_window text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 2d475e387559484f978c91792c6295ef $$;

COMMENT ON FUNCTION llm._check_scope_and_window(p_scope text, p_window text) IS 'Raises 22023 unless p_scope is organization, project, api_key or end_user and p_window day, week or month.';

CREATE FUNCTION llm._check_scope_id(p_name text, p_value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 e27d8dea5a59a24b358cdd21f1f8f370 $$;

COMMENT ON FUNCTION llm._check_scope_id(p_name text, p_value text) IS 'Raises 22023 naming p_name unless p_value is NULL or a valid scope id.';

CREATE FUNCTION llm._check_stripes(p_stripes integer, p_whose text, p_hint text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 893e5af310a64c23e690c8792b7f7db9 $$;

COMMENT ON FUNCTION llm._check_stripes(p_stripes integer, p_whose text, p_hint text) IS 'Raises 22023 for a stripe count that is NULL or outside 1 .. 64 (DETAIL: whose counters; HINT: p_hint).';

CREATE FUNCTION llm._check_text(p_name text, p_value text, p_max integer, p_nullable boolean DEFAULT false) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 af6dc67e32ebbdf4117cc0d30261005d $$;

COMMENT ON FUNCTION llm._check_text(p_name text, p_value text, p_max integer, p_nullable boolean) IS 'Raises 22023 for a NULL (unless p_nullable), blank or over-long text argument.';

CREATE FUNCTION llm._check_thresholds(p_thresholds integer[]) RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 cfeae82e697214fd8bc7710468781fa0 $$;

COMMENT ON FUNCTION llm._check_thresholds(p_thresholds integer[]) IS 'The threshold list sorted, or 22023 for NULL, NULL elements, duplicates, values outside 1..1000 or more than 20 entries.';

CREATE FUNCTION llm._check_usage(p_usage jsonb) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 c1a23e9fb8a68b4045eb0157e0d3804d $$;

COMMENT ON FUNCTION llm._check_usage(p_usage jsonb) IS 'Raises 22023 unless p_usage is an object of token classes to integers 0 .. 10^15.';

CREATE FUNCTION llm._class_cost(p_rates jsonb, p_tier jsonb, p_usage jsonb, p_class text) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 e59df28ca99cf7f868848d525547688a $$;

COMMENT ON FUNCTION llm._class_cost(p_rates jsonb, p_tier jsonb, p_usage jsonb, p_class text) IS 'The exact nanos p_usage''s tokens of p_class cost at p_tier''s rate, else p_rates'' (per million tokens; per call for requests); NULL for tokens with no rate.';

CREATE FUNCTION llm._clock_ok(p_now timestamp with time zone) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 27ca9aff329b74d2b64ef028b1fc436f $$;

COMMENT ON FUNCTION llm._clock_ok(p_now timestamp with time zone) IS 'True for NULL (the function''s own now()) or a finite time between the years 1 and 9999 (UTC).';

CREATE FUNCTION llm._close_execution(p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text, p_now timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 445ff9fe72e1bfb34055bc5d4294b5d6 $$;

COMMENT ON FUNCTION llm._close_execution(p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text, p_now timestamp with time zone) IS 'Distributed twin of close_execution; arguments already checked.';

CREATE FUNCTION llm._correct_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripe smallint, p_difference bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 a4a929d96d08a35e542d4ed5c54781a1 $$;

COMMENT ON FUNCTION llm._correct_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripe smallint, p_difference bigint) IS 'Moves one budget counter stripe''s priced nanos by a correction''s difference.';

CREATE FUNCTION llm._cost_metrics(p_now timestamp with time zone) RETURNS TABLE(metric text, labels jsonb, value double precision)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b65419ce0921042e1823a76cb86a7ee8 $$;

COMMENT ON FUNCTION llm._cost_metrics(p_now timestamp with time zone) IS 'The series of llm.metrics about cost at p_now: the cost of the month''s settled requests by model (nanos, as repriced) and the requests priced at the fallback, from llm.daily_usage.';

CREATE FUNCTION llm._create_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer, p_limit bigint, p_revision uuid) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 f8a9e06051416554047a3005f5e5449d $$;

COMMENT ON FUNCTION llm._create_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer, p_limit bigint, p_revision uuid) IS 'Creates a budget counter with its stripes, unless its window ended on or before the organization''s retention horizon (LL012, read again after the INSERT).';

CREATE FUNCTION llm._credits_of(p_cost_nanos bigint, p_nanos_per_credit bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 f1932680ef6bb14d5be1b1321dbace70 $$;

COMMENT ON FUNCTION llm._credits_of(p_cost_nanos bigint, p_nanos_per_credit bigint) IS 'ceil(p_cost_nanos / p_nanos_per_credit): the credits a cost is charged.';

CREATE FUNCTION llm._cron_job_seen() RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4e9b23f76652168f642c35d59ef3f529 $$;

COMMENT ON FUNCTION llm._cron_job_seen() IS 'For health before the first pass: whether the pg_cron job llm-reconciliation of this database is visible and scheduled, and how.';

CREATE FUNCTION llm._end_claim(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_end text, p_error text, p_now timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 0f610cd155be86ffa731c63b26b30a0b $$;

COMMENT ON FUNCTION llm._end_claim(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_end text, p_error text, p_now timestamp with time zone) IS 'Distributed twin of complete_notice (p_end sent), fail_notice (failed) and release_notice (released); arguments already checked. False, changing nothing, unless the notice is being sent under p_claim_token.';

CREATE FUNCTION llm._end_invocation(p_organization_id uuid, p_invocation_id uuid, p_status text, p_error text, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone, p_price llm.priced_usage) RETURNS boolean
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 c0b8645e693ca343fa874a9587f2212a $$;

COMMENT ON FUNCTION llm._end_invocation(p_organization_id uuid, p_invocation_id uuid, p_status text, p_error text, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone, p_price llm.priced_usage) IS 'Ends an open (reserved or dispatched) invocation as settled (measured) or failed with its charge (priced by the caller, or by the book: p_price) and books it: its task''s totals, its stripe''s movement (charge in, hold out) with the threshold notices the period crosses, then its budgets'' counters; false when it was no longer open.';

CREATE FUNCTION llm._ensure_period(p_organization_id uuid, p_period_start date) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 f9eb483d64a99eab0e5aaa0ec86e9611 $$;

COMMENT ON FUNCTION llm._ensure_period(p_organization_id uuid, p_period_start date) IS 'Creates the period (its head, with the organization''s allowance read under a share lock of the organization, so a concurrent upsert_organization cannot be lost: invariant 9, and its stripes) on first use.';

CREATE FUNCTION llm._estimate_usage(p_input_tokens bigint, p_max_output_tokens bigint) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 27baffc57d9bb2bee8969705032fbdbd $$;

COMMENT ON FUNCTION llm._estimate_usage(p_input_tokens bigint, p_max_output_tokens bigint) IS 'The usage a priced estimate stands for: {"input": p_input_tokens, "output": p_max_output_tokens}.';

CREATE FUNCTION llm._exact_rate(p_model text, p_where text, p_value jsonb) RETURNS numeric
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $_$ body in sql/, md5 2e5f17615715fbc2359bdeda8f4b8119 $_$;

COMMENT ON FUNCTION llm._exact_rate(p_model text, p_where text, p_value jsonb) IS 'A rate (JSON number or decimal string, 0 .. 10^6, at most 12 decimals) as an exact numeric; 22023 naming p_where otherwise.';

CREATE FUNCTION llm._exact_rates(p_model text, p_where text, p_rates jsonb, p_extra text[]) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 43f9412e8084e852d9f2ba4e4ffe07a9 $$;

COMMENT ON FUNCTION llm._exact_rates(p_model text, p_where text, p_rates jsonb, p_extra text[]) IS 'The class rates of one level of a price as exact JSON numbers (keys in p_extra skipped); 22023 for an unknown class or a bad rate.';

CREATE FUNCTION llm._fail_invocation(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_now timestamp with time zone, p_usage jsonb) RETURNS text
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 63d4b41e6003a0947bc4affb19b74a53 $$;

COMMENT ON FUNCTION llm._fail_invocation(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_now timestamp with time zone, p_usage jsonb) IS 'Distributed twin of fail_invocation; arguments already checked.';

CREATE TABLE llm.reconciliation_runs (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    clock timestamp with time zone NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    orgs_visited integer DEFAULT 0 NOT NULL,
    orgs_failed integer DEFAULT 0 NOT NULL,
    requests_recovered bigint DEFAULT 0 NOT NULL,
    released_hold_credits llm.total DEFAULT 0 NOT NULL,
    past_window_alerts bigint DEFAULT 0 NOT NULL,
    executions_abandoned bigint DEFAULT 0 NOT NULL,
    drift_findings bigint DEFAULT 0 NOT NULL,
    notices_rearmed bigint DEFAULT 0 NOT NULL,
    daily_rows_rebuilt bigint DEFAULT 0 NOT NULL,
    more_pending_orgs integer DEFAULT 0 NOT NULL,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    recovered_uncharged bigint DEFAULT 0 NOT NULL,
    period_findings bigint DEFAULT 0 NOT NULL,
    daily_rebuilt_through date,
    CONSTRAINT reconciliation_runs_status_check CHECK ((status = ANY (ARRAY['running'::text, 'succeeded'::text, 'partial'::text, 'failed'::text, 'skipped'::text])))
);

COMMENT ON TABLE llm.reconciliation_runs IS 'One row per reconciliation pass (coordinator-local under Citus); skipped when another pass held the lock.';

COMMENT ON COLUMN llm.reconciliation_runs.recovered_uncharged IS 'Requests the pass recovered and charged nothing (recovery_charge dispatched or none); requests_recovered counts them too.';

COMMENT ON COLUMN llm.reconciliation_runs.period_findings IS 'Periods whose counters disagreed with their requests in this pass''s audit.';

COMMENT ON COLUMN llm.reconciliation_runs.daily_rebuilt_through IS 'Set when this pass rebuilt every day of daily usage it owed, up to this day (its clock''s day); the next pass rebuilds from there.';

CREATE FUNCTION llm._finish_run(p_run_id uuid, p_token uuid) RETURNS llm.reconciliation_runs
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 49fa0c25573f863e92ccc57402dc0cfb $$;

COMMENT ON FUNCTION llm._finish_run(p_run_id uuid, p_token uuid) IS 'Closes a pass that still holds its lease: succeeded without errors, failed when every organization failed, partial otherwise; frees the lease.';

CREATE FUNCTION llm._full_usage(p_usage jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 d3d59113b0bf4935fbbcaa8d248ff56b $$;

COMMENT ON FUNCTION llm._full_usage(p_usage jsonb) IS 'p_usage with every token class present: a missing class 0, requests 1.';

CREATE FUNCTION llm._functions_only() RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 d7aaa4baef60d72aee1ed8024d57f8a7 $$;

COMMENT ON FUNCTION llm._functions_only() IS 'True once the contract step of 0.4.0 ran: every call that could move the books without this release''s columns has ended.';

CREATE FUNCTION llm._hours_up(p_span interval) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 d296d933d9c1858068344d76897f6564 $$;

COMMENT ON FUNCTION llm._hours_up(p_span interval) IS 'p_span in whole hours, rounded up, at least 0; NULL for NULL.';

CREATE FUNCTION llm._invariant_1() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 fe4c2d135c4e70348306c1f9f3816ab7 $$;

COMMENT ON FUNCTION llm._invariant_1() IS 'Invariant 1: every period stripe''s held_credits equals the holds of its reserved and dispatched requests.';

CREATE FUNCTION llm._invariant_10() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 eca48f5b946403c0de8f03611a9340b3 $$;

COMMENT ON FUNCTION llm._invariant_10() IS 'Invariant 10: every organization''s sweep_totals equal the counts of its recovered, recovered-uncharged and past-window-alerted requests.';

CREATE FUNCTION llm._invariant_11() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4a42b112b7717bdf5ec65cd20c1c376f $$;

COMMENT ON FUNCTION llm._invariant_11() IS 'Invariant 11: an unresolved period finding means its period''s counters still differ from its requests.';

CREATE FUNCTION llm._invariant_12() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bbb069e4da7f141a8f136d3191a6ec28 $$;

COMMENT ON FUNCTION llm._invariant_12() IS 'Invariant 12: a notice carries a claim token iff it is being sent.';

CREATE FUNCTION llm._invariant_13() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 35ee01f00aa9ae89ca0c707353571ac8 $$;

COMMENT ON FUNCTION llm._invariant_13() IS 'Invariant 13: a drift finding means its task still differs from its terminal requests.';

CREATE FUNCTION llm._invariant_14() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9385ebe1f2d96486a8f13c3122e7ff5f $$;

COMMENT ON FUNCTION llm._invariant_14() IS 'Invariant 14: every budget counter''s used, held and cents (summed over its stripes) equal the requests admitted under it, and every counter a request was admitted under exists unless retention may have deleted it (window ended on or before the organization''s horizon, no open request under it).';

CREATE FUNCTION llm._invariant_15() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bd03d08e9f7438dd87b6e5e1672fe931 $$;

COMMENT ON FUNCTION llm._invariant_15() IS 'Invariant 15: a budget counter''s used + held - overrun (its stripes summed) never exceeds the limit it admits against (the same on all its stripes), the budget''s limit while its revision is unchanged.';

CREATE FUNCTION llm._invariant_16() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9410fcad124cd2e9bf04fa2c6952578f $$;

COMMENT ON FUNCTION llm._invariant_16() IS 'Invariant 16: every request''s row agrees with its status (terminal iff settled_at, a kind iff settled, a charge only when terminal, recovery''s and a true-up''s figures) and its period is the UTC month of its admission.';

CREATE FUNCTION llm._invariant_17() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4b615b16d2b166fc996950225ff9e619 $$;

COMMENT ON FUNCTION llm._invariant_17() IS 'Invariant 17: every period stripe''s open_requests (where known) counts its open requests, none admitted before its open_since (NULL when none), a quiet stripe has none, and its settle bounds hold for each of its terminal requests.';

CREATE FUNCTION llm._invariant_18() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b7eacb02a12ed475465bd92856d63b5b $$;

COMMENT ON FUNCTION llm._invariant_18() IS 'Invariant 18: a budget counter has the stripes it says, each holding the holds of its open requests, and its rooms (spread under the budgets revision in force) promise no more than it has left to its limit and to the sum limit, nor usage past its next threshold not notified.';

CREATE FUNCTION llm._invariant_19() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 3967ab27de95659f7bffc07d55fade0e $$;

COMMENT ON FUNCTION llm._invariant_19() IS 'Invariant 19: a request priced by the book carries its usage and pinned version and credit rate, no cents, and its cost, tier and credits are that usage priced at them; no other request has a cost.';

CREATE FUNCTION llm._invariant_2() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 94283a88e4f9a7d4563dba24dc8592e7 $$;

COMMENT ON FUNCTION llm._invariant_2() IS 'Invariant 2: every period''s used_credits and used_cents equal the charges of its terminal requests and the sum of its ledger charges and adjustments.';

CREATE FUNCTION llm._invariant_20() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 47b51cf0412100b1da2c6f3384b67fd4 $$;

COMMENT ON FUNCTION llm._invariant_20() IS 'Invariant 20: the priced nanos of every period stripe, task and budget counter equal the cost of its terminal requests priced from usage as corrected (a sum''s cost is its cents * 10^7 plus these); corrections are of priced requests, numbered from 1, and the last one''s version prices the request at its corrected cost.';

CREATE FUNCTION llm._invariant_21() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 e55448551c25f70dda75edcaabe6f93e $$;

COMMENT ON FUNCTION llm._invariant_21() IS 'Invariant 21: an organization''s has_budgets (where known) says whether it has a budget, and its uniform budgets (where known) are all of its budgets, none naming an id, their bits, limits and revisions in bit order.';

CREATE FUNCTION llm._invariant_2b() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 a5f7101fa5bbb628b53e3ac9bd30d51a $$;

COMMENT ON FUNCTION llm._invariant_2b() IS 'Invariant 2b, reported as 2: every period stripe''s used_credits and used_cents equal the charges of its terminal requests.';

CREATE FUNCTION llm._invariant_3() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4e6f97b0e05eb71052feca24b7fe6c1b $$;

COMMENT ON FUNCTION llm._invariant_3() IS 'Invariant 3: every request has one hold, a release iff it is terminal, at most one charge and at most one adjustment (iff it was trued up), adding up to its own charge.';

CREATE FUNCTION llm._invariant_4() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6e1b060f39baedc6ba7c1b2cd683dce1 $$;

COMMENT ON FUNCTION llm._invariant_4() IS 'Invariant 4: in every period with an allowance, used + held - overrun stays within the allowance plus allowance_excess.';

CREATE FUNCTION llm._invariant_4b() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 93f96604724dc7db4c0d40e8069e932d $$;

COMMENT ON FUNCTION llm._invariant_4b() IS 'Invariant 4b, reported as 4: the stripes'' admit_rooms (each set under an allowance) and cents_rooms together never promise more than the period has left to its allowance and to the sum limit.';

CREATE FUNCTION llm._invariant_5() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 14e0197b754d51b7dc85eda5afbcce80 $$;

COMMENT ON FUNCTION llm._invariant_5() IS 'Invariant 5: only recovered (or later trued-up) requests carry a past-window alert, and each threshold of a budget window has at most one notice.';

CREATE FUNCTION llm._invariant_5b() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 94e7ad2553b67cff26262d2431fb003e $$;

COMMENT ON FUNCTION llm._invariant_5b() IS 'Invariant 5b, reported as 5: while a threshold is ahead and not notified, every stripe''s notice_room is set and together they stay below the usage that reaches it.';

CREATE FUNCTION llm._invariant_6() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 0de741a681a892cf8626e3fd5a344942 $$;

COMMENT ON FUNCTION llm._invariant_6() IS 'Invariant 6: every task''s request_count, credits and cents equal the sums over its terminal requests, unless it has a drift finding.';

CREATE FUNCTION llm._invariant_7() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 cd187518d7346a0882d37bfb4fc627ed $$;

COMMENT ON FUNCTION llm._invariant_7() IS 'Invariant 7: a task has ended_at iff it is closed, an abandoned task has no duration and a completed one has one.';

CREATE FUNCTION llm._invariant_8() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 20fc099948ee573b2cf9b7c333a82b0d $$;

COMMENT ON FUNCTION llm._invariant_8() IS 'Invariant 8: every request belongs to a stripe of a period and, when linked, to a task of its own organization.';

CREATE FUNCTION llm._invariant_9() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 7c861d69089364268462c3199ee9e04e $$;

COMMENT ON FUNCTION llm._invariant_9() IS 'Invariant 9: every period from the month of its organization''s last update on carries the organization''s allowance.';

CREATE FUNCTION llm._kept_finding(p_finding text, p_last_seen_at timestamp with time zone, p_subject text, p_subject_exists boolean, p_figures text) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 e1b22b93fa55edb52741f52f9e434bc4 $$;

COMMENT ON FUNCTION llm._kept_finding(p_finding text, p_last_seen_at timestamp with time zone, p_subject text, p_subject_exists boolean, p_figures text) IS 'The detail invariants 11 and 13 report for a finding whose subject is gone or agrees with its requests.';

CREATE TABLE llm.pass_lease (
    singleton boolean DEFAULT true NOT NULL,
    run_id uuid,
    token uuid,
    holder_pid integer,
    holder_backend_start timestamp with time zone,
    acquired_at timestamp with time zone,
    renewed_at timestamp with time zone,
    expires_at timestamp with time zone,
    CONSTRAINT pass_lease_check CHECK (((token IS NULL) = (expires_at IS NULL))),
    CONSTRAINT pass_lease_singleton_check CHECK (singleton)
);

COMMENT ON TABLE llm.pass_lease IS 'The one-pass-at-a-time lease (one row, coordinator-local under Citus): the holding pass''s run, token and backend, and an expiry on clock_timestamp(); free when token is NULL.';

COMMENT ON COLUMN llm.pass_lease.acquired_at IS 'clock_timestamp() when the holder took the lease: a holder whose current statement started later is no longer running that pass.';

CREATE FUNCTION llm._lease_holder_running(p_lease llm.pass_lease) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 eed0120e05fa507e1794a434851a746e $$;

COMMENT ON FUNCTION llm._lease_holder_running(p_lease llm.pass_lease) IS 'True while the lease holder''s backend (same pid and start time) is still running the statement that took the lease; a session this role cannot inspect counts as running.';

CREATE FUNCTION llm._lease_locker_pid() RETURNS integer
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b5d6dfd01c8040cb5e57517614ea7897 $$;

COMMENT ON FUNCTION llm._lease_locker_pid() IS 'The pid of the backend whose open transaction holds the pass lease row locked, or NULL.';

CREATE FUNCTION llm._lock_budgets_of(p_organization_id uuid) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 13819135d18a26bc1fad21b84fa0fc67 $$;

COMMENT ON FUNCTION llm._lock_budgets_of(p_organization_id uuid) IS 'Locks the organization''s row (FOR NO KEY UPDATE) for a change of its budgets; LL002 for an unknown organization.';

CREATE FUNCTION llm._lock_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, OUT stripes integer, OUT used bigint, OUT held bigint, OUT cents bigint) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 1cddb6cfd9d45b51bcd9de15b0163234 $$;

COMMENT ON FUNCTION llm._lock_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, OUT stripes integer, OUT used bigint, OUT held bigint, OUT cents bigint) IS 'Locks a budget counter''s stripes in stripe order (stripe 0 first) and returns its stripe count and totals; NULL when it does not exist.';

CREATE TABLE llm.period_heads (
    organization_id uuid NOT NULL,
    period_start date NOT NULL,
    period_end date NOT NULL,
    allowance_credits llm.amount,
    allowance_excess bigint DEFAULT 0 NOT NULL,
    CONSTRAINT periods_check CHECK ((period_end > period_start))
);

COMMENT ON TABLE llm.period_heads IS 'One calendar month (UTC) of an organization: its bounds and allowance. Its counters are the sums of its llm.period_stripes rows (the view llm.periods).';

COMMENT ON COLUMN llm.period_heads.allowance_excess IS 'How far used + held stood over the allowance when it was last changed (0 when within it): the most invariant 4 lets used + held - overrun exceed the allowance by.';

CREATE FUNCTION llm._lock_period(p_organization_id uuid, p_period_start date) RETURNS llm.period_heads
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 54d4b6be255069f00718f0ddd5996338 $$;

COMMENT ON FUNCTION llm._lock_period(p_organization_id uuid, p_period_start date) IS 'Locks a period for an exact decision (every stripe, in stripe order) and returns its head (NULL fields when the period does not exist yet).';

CREATE FUNCTION llm._lock_sweep_of(p_organization_id uuid) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 73c9b9e397df0e7cf68fdf75a2c25e09 $$;

COMMENT ON FUNCTION llm._lock_sweep_of(p_organization_id uuid) IS 'Takes the organization''s sweep lock (an advisory lock to the end of the transaction): its sweep and its repricing, one at a time.';

CREATE FUNCTION llm._mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamp with time zone) RETURNS llm.admission_result
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 adc3680a8ad9b372a4a2811a92475a99 $$;

COMMENT ON FUNCTION llm._mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamp with time zone) IS 'Distributed twin of mark_dispatched; arguments already checked. replayed: it was dispatched before.';

CREATE FUNCTION llm._mask_elements(p_of integer, p_mask integer, p_values anyarray) RETURNS anyarray
    LANGUAGE plpgsql IMMUTABLE
    AS $$ body in sql/, md5 0dc70052a8993d902782cc448c225a1e $$;

COMMENT ON FUNCTION llm._mask_elements(p_of integer, p_mask integer, p_values anyarray) IS 'Of p_values, one per bit of p_of in bit order, those of the bits of p_mask, in bit order.';

CREATE FUNCTION llm._max_amount() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 0f5a641a0888d1c24956e22397f7db6c $$;

COMMENT ON FUNCTION llm._max_amount() IS 'The largest credit, cent or token amount one call accepts (10^15).';

CREATE FUNCTION llm._max_sum() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 2667abcb73df49ecf8caae383001ce5d $$;

COMMENT ON FUNCTION llm._max_sum() IS 'The sum limit (10^18): the most a period''s used + held credits, its used cents, or a budget counter''s may reach (LL013 beyond).';

CREATE FUNCTION llm._may_cross(p_old_used bigint, p_new_used bigint, p_allowance bigint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 4a1310f3a5666cdc8f3c763522f8d470 $$;

COMMENT ON FUNCTION llm._may_cross(p_old_used bigint, p_new_used bigint, p_allowance bigint) IS 'False when moving used credits from p_old_used to p_new_used cannot have crossed any whole-percent threshold of p_allowance (NULL when unlimited).';

CREATE FUNCTION llm._move_budgets(p_organization_id uuid, p_invs llm.invocations[], p_true_up boolean, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 0ca653b3e7890d53b03d59bb699e73b1 $$;

COMMENT ON FUNCTION llm._move_budgets(p_organization_id uuid, p_invs llm.invocations[], p_true_up boolean, p_now timestamp with time zone) IS 'Moves the budget counters of the given requests (terminal: charge in, hold out; p_true_up: the signed difference), each counter by its exact path in lock order, refusing growth past the sum limit (LL013), and owes the thresholds they crossed; returns the notices created.';

CREATE FUNCTION llm._move_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_seeds smallint[], p_used bigint[], p_held bigint[], p_cents bigint[], p_priced bigint[], p_admit_limit bigint, p_admit_revision uuid, p_epoch uuid, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 da745ad288a3ad4eba4b2da945df7f5b $$;

COMMENT ON FUNCTION llm._move_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_seeds smallint[], p_used bigint[], p_held bigint[], p_cents bigint[], p_priced bigint[], p_admit_limit bigint, p_admit_revision uuid, p_epoch uuid, p_now timestamp with time zone) IS 'The exact path of one budget counter: locks its stripes in order (creating it for an admission, LL012 past retention), refuses an admission that does not fit p_admit_limit (LL001) and growth past the sum limit (LL013), moves each request on its stripe, owes the thresholds its total crossed under the budget in force and spreads its rooms again; returns the notices created.';

CREATE FUNCTION llm._move_request_counters(p_organization_id uuid, p_mask integer, p_project text, p_api_key text, p_end_user text, p_created_at timestamp with time zone, p_budget_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_admit_limits bigint[], p_admit_revisions uuid[], p_epoch uuid, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 78a13f7e11c9ddb0b20977240b566a5a $$;

COMMENT ON FUNCTION llm._move_request_counters(p_organization_id uuid, p_mask integer, p_project text, p_api_key text, p_end_user text, p_created_at timestamp with time zone, p_budget_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_admit_limits bigint[], p_admit_revisions uuid[], p_epoch uuid, p_now timestamp with time zone) IS 'Moves every budget counter of one request (its budget_mask, scope ids, admission time and budget_stripe) in bit order: each on its stripe when it fits that stripe''s rooms, else by its exact path; returns the notices created.';

CREATE FUNCTION llm._move_stripe(p_organization_id uuid, p_period_start date, p_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_now timestamp with time zone, p_open integer, p_admitted_at timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 22d2cbe71dc2a983669a2e28317338f2 $$;

COMMENT ON FUNCTION llm._move_stripe(p_organization_id uuid, p_period_start date, p_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_now timestamp with time zone, p_open integer, p_admitted_at timestamp with time zone) IS 'Moves one stripe''s counters (used + p_used, held + p_held, cents + p_cents, priced nanos + p_priced): in one row when it fits the stripe''s rooms, else under the period''s lock, refusing an admission that does not fit the whole period (LL001) and any movement that would take its used + held credits or used cents past the sum limit (LL013), recording the thresholds the period''s total crosses and spreading the rooms again.';

CREATE FUNCTION llm._move_within_counter_room(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripe integer, p_off_zero boolean, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_epoch uuid) RETURNS boolean
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 bd25509084ae74f49e6d37d65c6d058a $$;

COMMENT ON FUNCTION llm._move_within_counter_room(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripe integer, p_off_zero boolean, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_epoch uuid) IS 'Moves one budget counter on the request''s stripe of it (when that is stripe 0, or when it is not: p_off_zero) iff the movement fits that stripe''s rooms under revision p_epoch; false (nothing moved) otherwise.';

CREATE FUNCTION llm._move_within_rooms(p_organization_id uuid, p_period_start date, p_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_open integer, p_now timestamp with time zone, p_lag integer, p_lead integer) RETURNS boolean
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 3f50de5d11061f7306c219406b32c64c $$;

COMMENT ON FUNCTION llm._move_within_rooms(p_organization_id uuid, p_period_start date, p_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_open integer, p_now timestamp with time zone, p_lag integer, p_lead integer) IS 'Moves one stripe''s counters, its open requests (p_open) and settle bounds in one row when the movement fits its rooms; false (nothing moved) otherwise, or when the stripe does not exist.';

CREATE FUNCTION llm._named_scopes_mask(p_project text, p_api_key text, p_end_user text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 6519e382694a734ac397507e7bf70172 $$;

COMMENT ON FUNCTION llm._named_scopes_mask(p_project text, p_api_key text, p_end_user text) IS 'The budget_mask bits of the scopes a request naming these ids falls under: the organization''s, and each scope it names an id of.';

CREATE FUNCTION llm._normalized_rates(p_model text, p_rates jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 1ba1b67b6fb58fcb2d1b339aec52b53b $$;

COMMENT ON FUNCTION llm._normalized_rates(p_model text, p_rates jsonb) IS 'p_rates checked and as stored: exact rates per class, tiers sorted by threshold, no currency; 22023 for anything that cannot price.';

CREATE FUNCTION llm._note_refusal(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_now timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b7196dad824e277bfd92a03f28fbc523 $$;

COMMENT ON FUNCTION llm._note_refusal(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_now timestamp with time zone) IS 'Distributed twin of note_refusal; arguments already checked.';

CREATE FUNCTION llm._notify_notices_owed(p_reason text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 383f959d37614f37be90c35ee6871c51 $$;

COMMENT ON FUNCTION llm._notify_notices_owed(p_reason text) IS 'NOTIFY llm_notices with the reason (created, retry, released, rearmed): sent when the calling transaction commits, never if it rolls back.';

CREATE FUNCTION llm._open_execution(p_organization_id uuid, p_task_key text, p_subject_type text, p_subject_id text, p_replay_key text, p_now timestamp with time zone) RETURNS TABLE(execution_id uuid, status text, replayed boolean)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 2ed87d7cc11b0a5718d09406c332c749 $$;

COMMENT ON FUNCTION llm._open_execution(p_organization_id uuid, p_task_key text, p_subject_type text, p_subject_id text, p_replay_key text, p_now timestamp with time zone) IS 'Distributed twin of open_execution; arguments already checked.';

CREATE FUNCTION llm._open_floor(p_organization_id uuid) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 58b8c41f53c58f1e143549a903b0680d $$;

COMMENT ON FUNCTION llm._open_floor(p_organization_id uuid) IS 'The earliest time an open request of the organization may have been admitted at (its stripes'' open_since; a period''s first day where they are not known); NULL when none is open.';

CREATE FUNCTION llm._open_since(p_open_requests integer, p_open_since timestamp with time zone, p_open integer, p_at timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 c1cf2533aa77c53f99638fef2e0bca09 $$;

COMMENT ON FUNCTION llm._open_since(p_open_requests integer, p_open_since timestamp with time zone, p_open integer, p_at timestamp with time zone) IS 'A period stripe''s open_since after p_open more open requests (an admission at p_at) or fewer (requests ending): the admission''s time on a stripe with none open, NULL once none is (and while its open requests are not known).';

CREATE TABLE llm.organizations (
    id uuid NOT NULL,
    name text NOT NULL,
    status text DEFAULT 'operational'::text NOT NULL,
    monthly_allowance_credits bigint,
    notice_thresholds integer[] DEFAULT '{80,100}'::integer[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    recovery_charge text DEFAULT 'estimate'::text NOT NULL,
    late_settlement text DEFAULT 'audit'::text NOT NULL,
    period_stripes integer DEFAULT 1 NOT NULL,
    has_budgets boolean,
    budgets_revision uuid,
    uniform_budget_mask integer,
    uniform_budget_limits bigint[],
    uniform_budget_revisions uuid[],
    CONSTRAINT organizations_late_settlement_check CHECK ((late_settlement = ANY (ARRAY['audit'::text, 'true_up'::text]))),
    CONSTRAINT organizations_monthly_allowance_credits_check CHECK ((monthly_allowance_credits >= 0)),
    CONSTRAINT organizations_period_stripes_check CHECK (((period_stripes >= 1) AND (period_stripes <= 64))),
    CONSTRAINT organizations_recovery_charge_check CHECK ((recovery_charge = ANY (ARRAY['estimate'::text, 'dispatched'::text, 'none'::text]))),
    CONSTRAINT organizations_status_check CHECK ((status = ANY (ARRAY['operational'::text, 'suspended'::text, 'closed'::text])))
);

COMMENT ON TABLE llm.organizations IS 'Tenants. monthly_allowance_credits NULL means unlimited; only operational ones are admitted and swept.';

COMMENT ON COLUMN llm.organizations.id IS 'The organization id: the distribution column under Citus.';

COMMENT ON COLUMN llm.organizations.recovery_charge IS 'What recovery charges a stranded request: estimate (rule BR-CAP-PFM-LLM-009-01), dispatched (its estimate only if it was sent to the provider, else 0), none (0).';

COMMENT ON COLUMN llm.organizations.late_settlement IS 'What a measured settlement of a recovered request does: audit (recorded in late_*, never charged) or true_up (the books move to the measured figures).';

COMMENT ON COLUMN llm.organizations.period_stripes IS 'How many stripe rows the organization''s period counters are spread over (1 to 64, llm.set_period_stripes): admissions of different sessions take their holds from different stripes.';

COMMENT ON COLUMN llm.organizations.has_budgets IS 'Whether the organization has a budget (llm.budget_limits); NULL: not known, looked up. Kept by set_budget, so an admission of an organization without one reads no budget.';

COMMENT ON COLUMN llm.organizations.budgets_revision IS 'New at every change of one of its budgets (set_budget, set_budget_stripes): a counter''s escrow rooms serve only under the revision they were spread under (budget_counters.rooms_revision).';

COMMENT ON COLUMN llm.organizations.uniform_budget_mask IS 'When no budget of the organization names an id (each is its own day or week, or a scope''s ''*''): the bits of its budgets (as invocations.budget_mask), 0 with none. NULL: a budget names an id, or not known; admission reads llm.budget_limits then.';

COMMENT ON COLUMN llm.organizations.uniform_budget_limits IS 'The limits of the budgets of uniform_budget_mask, in bit order (NULL with it).';

COMMENT ON COLUMN llm.organizations.uniform_budget_revisions IS 'The revisions (llm.budget_limits.revision) of the budgets of uniform_budget_mask, in bit order (NULL with it).';

CREATE FUNCTION llm._operational_org(p_organization_id uuid) RETURNS llm.organizations
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6c1cb64128aac1652e8f789660e56b57 $$;

COMMENT ON FUNCTION llm._operational_org(p_organization_id uuid) IS 'The organization row, or LL002 when unknown and LL003 when not operational.';

CREATE FUNCTION llm._organization_settings(p_org llm.organizations) RETURNS llm.organization_settings
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 410f69ba19fa57f6cf715a00e49bcc60 $$;

COMMENT ON FUNCTION llm._organization_settings(p_org llm.organizations) IS 'The llm.organization_settings of an organization: its columns as of 0.2.0.';

CREATE FUNCTION llm._owe_notices(p_organization_id uuid, p_period_start date, p_thresholds integer[], p_used bigint, p_allowance bigint, p_now timestamp with time zone, p_scope text DEFAULT 'organization'::text, p_scope_id text DEFAULT NULL::text, p_window text DEFAULT 'month'::text, p_old_used bigint DEFAULT NULL::bigint) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 0518a940a5f5f242456f77514bf94d59 $$;

COMMENT ON FUNCTION llm._owe_notices(p_organization_id uuid, p_period_start date, p_thresholds integer[], p_used bigint, p_allowance bigint, p_now timestamp with time zone, p_scope text, p_scope_id text, p_window text, p_old_used bigint) IS 'Creates one owed notice (crossed at p_now) for every threshold of p_thresholds that p_used stands at or above under p_allowance (and, given p_old_used, p_old_used stood below) and not notified yet; NOTIFY llm_notices at commit when it created one.';

CREATE FUNCTION llm._own_budget_ids(p_organization_id uuid, p_scope text, p_window text) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 eee5bc8fa6fe5db756af56ec03cb9854 $$;

COMMENT ON FUNCTION llm._own_budget_ids(p_organization_id uuid, p_scope text, p_window text) IS 'The ids of p_scope with a budget of their own for p_window (not governed by its ''*'' budget).';

CREATE FUNCTION llm._pass_metrics(p_now timestamp with time zone) RETURNS TABLE(metric text, labels jsonb, value double precision)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 2e563df8c3b7c6f7a41442a0d2bcb1be $$;

COMMENT ON FUNCTION llm._pass_metrics(p_now timestamp with time zone) IS 'The series of llm.metrics about the pass at p_now: the health alarm by status, the last success, and the last run''s status, errors, figures, finish, age and duration (0 before the first pass).';

CREATE FUNCTION llm._pass_organizations() RETURNS uuid[]
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 10917fd226a15613f8466fc92a750362 $$;

COMMENT ON FUNCTION llm._pass_organizations() IS 'The operational organizations a pass visits, in id order.';

CREATE FUNCTION llm._period_start(p_at timestamp with time zone) RETURNS date
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 872667e928ea92f819b62af1b59ffb19 $$;

COMMENT ON FUNCTION llm._period_start(p_at timestamp with time zone) IS 'The first day of the UTC calendar month containing p_at: the period an invocation admitted then belongs to.';

CREATE FUNCTION llm._price_classes() RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 44ece1377cb6cdd03e777b95da6f3838 $$;

COMMENT ON FUNCTION llm._price_classes() IS 'The token classes a usage and a price name, disjoint: input, cache_read, cache_write_5m, cache_write_1h, output, reasoning, requests.';

CREATE FUNCTION llm._price_in_force(p_organization_id uuid, p_model text, p_at timestamp with time zone, OUT price_version_id bigint, OUT rates jsonb, OUT fallback boolean, OUT credit_rate_id bigint, OUT nanos_per_credit bigint) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 2aa917c334a711369af01f4dd59ecc34 $$;

COMMENT ON FUNCTION llm._price_in_force(p_organization_id uuid, p_model text, p_at timestamp with time zone, OUT price_version_id bigint, OUT rates jsonb, OUT fallback boolean, OUT credit_rate_id bigint, OUT nanos_per_credit bigint) IS 'The price version (with its rates and whether it is the fallback) and the credit rate in force for p_organization_id (NULL: the book) and p_model at p_at; NULLs where none is (no credit rate is looked up without a price).';

CREATE FUNCTION llm._price_request(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb) RETURNS llm.priced_usage
    LANGUAGE plpgsql STABLE
    AS $_$ body in sql/, md5 c066f0ff28234a8b8a67bf06e690db7b $_$;

COMMENT ON FUNCTION llm._price_request(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb) IS 'p_usage of a request priced at its pinned version and credit rate: credits, tokens in and out, cost, the usage as reported, tier and priced_by; LL005 (unknown), LL014 (no price pinned).';

CREATE FUNCTION llm._price_tier(p_rates jsonb, p_usage jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 c828a0f1f2c247be4a589abd0d47ad14 $$;

COMMENT ON FUNCTION llm._price_tier(p_rates jsonb, p_usage jsonb) IS 'The tier of p_rates whose threshold is the highest that p_usage''s prompt tokens are above; ''{}'' (base rates) when none is.';

CREATE FUNCTION llm._quote(p_organization_id uuid, p_model text, p_usage jsonb, p_at timestamp with time zone) RETURNS llm.price_quote
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 1d7ed89b6adfd32b825ac6ab6c89098a $$;

COMMENT ON FUNCTION llm._quote(p_organization_id uuid, p_model text, p_usage jsonb, p_at timestamp with time zone) IS 'The price_quote of p_usage of p_model for an organization (NULL: the book) at p_at; LL014 without a price or credit rate in force.';

CREATE FUNCTION llm._raise_bad_price(p_model text, p_what text, p_detail text, p_hint text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6e2c88a9d18b9ec52fcb613fcba6d33d $$;

COMMENT ON FUNCTION llm._raise_bad_price(p_model text, p_what text, p_detail text, p_hint text) IS 'Raises 22023 for a price that cannot be stored: what is wrong and where.';

CREATE FUNCTION llm._raise_open_floors(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 2ef8d83635394454f449bdd5d83c4b4d $$;

COMMENT ON FUNCTION llm._raise_open_floors(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone) IS 'Raises the open_since of the organization''s stripes that start at p_cutoff or before to their earliest open request (else p_cutoff), and marks quiet the stripes with none open of months ended by p_now; each stripe under its lock, those a call holds skipped.';

CREATE FUNCTION llm._raise_price_missing(p_organization_id uuid, p_model text, p_at timestamp with time zone, p_what text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 e37036c22951984174861a6de0158fb6 $$;

COMMENT ON FUNCTION llm._raise_price_missing(p_organization_id uuid, p_model text, p_at timestamp with time zone, p_what text) IS 'Raises LL014 (PriceMissing): no price version (p_what price) or credit rate in force for the model and organization at p_at.';

CREATE FUNCTION llm._raise_unknown_execution(p_organization_id uuid, p_execution_id uuid) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 670258163d43e976bcd7c80ec5cad321 $$;

COMMENT ON FUNCTION llm._raise_unknown_execution(p_organization_id uuid, p_execution_id uuid) IS 'Raises LL008 when the execution exists in another organization, else LL006 (always LL006 inside a call Citus delegated to a worker).';

CREATE FUNCTION llm._raise_unknown_invocation(p_organization_id uuid, p_invocation_id uuid) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 fac33307eeef5e0fedc1d88268c753ea $$;

COMMENT ON FUNCTION llm._raise_unknown_invocation(p_organization_id uuid, p_invocation_id uuid) IS 'Raises LL002 when the organization is unknown, else LL005: an invocation of another organization is unknown here.';

CREATE FUNCTION llm._raise_unknown_org(p_organization_id uuid) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b0f023e2515206bf8360361a558b5c42 $$;

COMMENT ON FUNCTION llm._raise_unknown_org(p_organization_id uuid) IS 'Raises LL002 for an organization id that does not exist.';

CREATE FUNCTION llm._rebuild_days(p_now timestamp with time zone) RETURNS date[]
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 13ceadadf1a122c39e4f9848ada13812 $$;

COMMENT ON FUNCTION llm._rebuild_days(p_now timestamp with time zone) IS 'The days of daily usage a pass rebuilds, oldest first: every day since the last complete rebuild by a pass whose clock was not ahead of this one (at most 35 days back) and the last settings.reporting_days, up to the pass clock''s day.';

CREATE FUNCTION llm._reconcile_org(p_organization_id uuid, p_now timestamp with time zone, p_batch integer, p_run_id uuid) RETURNS llm.org_sweep
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9356e650598a593091be5b9f64e5ebda $$;

COMMENT ON FUNCTION llm._reconcile_org(p_organization_id uuid, p_now timestamp with time zone, p_batch integer, p_run_id uuid) IS 'Distributed twin of reconcile_org; arguments already checked.';

CREATE FUNCTION llm._record_crossings(p_organization_id uuid, p_period_start date, p_old_used bigint, p_new_used bigint, p_allowance bigint, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 92a5bc82b1617971106308b07686e9e5 $$;

COMMENT ON FUNCTION llm._record_crossings(p_organization_id uuid, p_period_start date, p_old_used bigint, p_new_used bigint, p_allowance bigint, p_now timestamp with time zone) IS 'Creates one owed notice per threshold crossed when used credits moved from p_old_used to p_new_used; at most one per (organization, period, threshold); NOTIFY llm_notices at commit when it created one.';

CREATE FUNCTION llm._record_reached(p_organization_id uuid, p_period_start date, p_thresholds integer[], p_allowance bigint, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 10d195e69fa8b6d5fd167644be2cd804 $$;

COMMENT ON FUNCTION llm._record_reached(p_organization_id uuid, p_period_start date, p_thresholds integer[], p_allowance bigint, p_now timestamp with time zone) IS 'With the period locked: creates one owed notice (crossed at p_now) for every threshold of p_thresholds its used credits stand at or above under p_allowance and not notified yet; NOTIFY llm_notices at commit when it created one. What an allowance or threshold-list change owes by itself.';

CREATE FUNCTION llm._recover_stranded(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone, p_batch integer, p_recovery_charge text, INOUT p_sweep llm.org_sweep) RETURNS llm.org_sweep
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4e6a2fe1bddf4479dff13fa48d71c1eb $$;

COMMENT ON FUNCTION llm._recover_stranded(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone, p_batch integer, p_recovery_charge text, INOUT p_sweep llm.org_sweep) IS 'Recovers up to p_batch of the organization''s requests unsettled since p_cutoff, oldest first, charged per p_recovery_charge: releases their holds, adds to their tasks, moves their periods'' stripes (each period locked), then their budgets'' counters, and records crossed thresholds; fills the sweep''s figures.';

CREATE FUNCTION llm._refresh_drift(p_organization_id uuid, p_now timestamp with time zone, p_since timestamp with time zone, p_run_id uuid) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6cbb1143e883d2d0c7dff1f5f7aa3046 $$;

COMMENT ON FUNCTION llm._refresh_drift(p_organization_id uuid, p_now timestamp with time zone, p_since timestamp with time zone, p_run_id uuid) IS 'Compares tasks closed since p_since with their terminal requests; stores and logs each disagreement, drops findings (of any age) that no longer disagree, changes no totals.';

CREATE FUNCTION llm._refuse_sum(p_table text, p_column text, p_sum numeric, p_subject text) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 d244f8d4efebd447d5b6be64adc16353 $$;

COMMENT ON FUNCTION llm._refuse_sum(p_table text, p_column text, p_sum numeric, p_subject text) IS 'Raises LL013 (the sum limit): p_table.p_column would be p_sum, past _max_sum(); nothing of the call is kept.';

CREATE FUNCTION llm._renew_lease(p_run_id uuid, p_token uuid) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 1a147aa6b0c81af1a7eed14b6b7f46f1 $$;

COMMENT ON FUNCTION llm._renew_lease(p_run_id uuid, p_token uuid) IS 'Extends the pass lease by settings.pass_lease while this pass still holds it (true); otherwise records the run failed ("lease lost") and returns false.';

CREATE FUNCTION llm._reprice_org(p_organization_id uuid, p_model text, p_from timestamp with time zone, p_to timestamp with time zone, p_version_id bigint, p_apply boolean, OUT requests bigint, OUT cost_before_nanos numeric, OUT cost_after_nanos numeric) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 ab2a096897181ee5380ecdeae953c49e $$;

COMMENT ON FUNCTION llm._reprice_org(p_organization_id uuid, p_model text, p_from timestamp with time zone, p_to timestamp with time zone, p_version_id bigint, p_apply boolean, OUT requests bigint, OUT cost_before_nanos numeric, OUT cost_after_nanos numeric) IS 'Distributed twin of reprice for one organization: its requests of the model admitted in [p_from, p_to) priced from usage (a book version: those pinned to the book''s), their cost as corrected and at the version; with p_apply a correction per changed request and every cost sum moved by it.';

CREATE FUNCTION llm._require_cron(p_schedule text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 331a6dc7f12ae72a8279cab6ded16b60 $$;

COMMENT ON FUNCTION llm._require_cron(p_schedule text) IS 'Raises LL010 when pg_cron is not installed in this database, with a HINT that schedules the pass from the cron database; 42501 with the GRANT to run when the schema cron is not usable.';

CREATE FUNCTION llm._require_notice(p_organization_id uuid, p_notice_id uuid) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 eef6b60ce66ebbbe024a0d3232457efc $$;

COMMENT ON FUNCTION llm._require_notice(p_organization_id uuid, p_notice_id uuid) IS 'Raises 22023 when the notice does not exist for that organization.';

CREATE FUNCTION llm._require_org_id(p_organization_id uuid) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b6409a2973d6fe378a26c5b0914a128f $$;

COMMENT ON FUNCTION llm._require_org_id(p_organization_id uuid) IS 'Raises 22023 for a NULL organization id, before any distributed twin is called (Citus crashes on a NULL distribution argument).';

CREATE FUNCTION llm._require_price(p_organization_id uuid, p_model text, p_at timestamp with time zone, p_price_version_id bigint, p_credit_rate_id bigint) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$ body in sql/, md5 d05ee61e6a5c23d5b93e4cecf9ed9fb7 $$;

COMMENT ON FUNCTION llm._require_price(p_organization_id uuid, p_model text, p_at timestamp with time zone, p_price_version_id bigint, p_credit_rate_id bigint) IS 'Raises LL014 (PriceMissing) when _price_in_force found no price version or no credit rate.';

CREATE FUNCTION llm._restripe_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 076bcb0e79359f5c6b40d0138c3a063b $$;

COMMENT ON FUNCTION llm._restripe_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer) IS 'Spreads a budget counter over p_stripes stripes, its stripes locked in order: each holds the holds of its open requests (budget_stripe % p_stripes), stripe 0 its used credits, cents and priced nanos; its rooms dropped.';

CREATE FUNCTION llm._retain_budgets(p_organization_id uuid, p_now timestamp with time zone, p_retention interval) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9664859d1333779bd49ea5ac97e75b46 $$;

COMMENT ON FUNCTION llm._retain_budgets(p_organization_id uuid, p_now timestamp with time zone, p_retention interval) IS 'Raises the organization''s retention horizon (LEAST(p_now, now()) - p_retention, never past its oldest open request''s day) and deletes the counters of windows ended on or before it that hold nothing and no open request is admitted under, all their stripes locked in lock order, skipping locked ones; returns how many counters.';

CREATE FUNCTION llm._retried_estimate(p_inv llm.invocations, p_estimate_credits bigint, p_priced_estimate jsonb) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 81092cb3316a9fd0cb42c2da352fe70f $$;

COMMENT ON FUNCTION llm._retried_estimate(p_inv llm.invocations, p_estimate_credits bigint, p_priced_estimate jsonb) IS 'The estimate a retried admission is compared with: a priced one''s tokens at the version and credit rate the request pinned, else p_estimate_credits.';

CREATE FUNCTION llm._run_audit(p_run_id uuid, p_organization_id uuid, p_now timestamp with time zone) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bc14f700449626130c1d22763b1b5611 $$;

COMMENT ON FUNCTION llm._run_audit(p_run_id uuid, p_organization_id uuid, p_now timestamp with time zone) IS 'A step of the pass: audits one organization''s periods when due (llm._audit_org) and counts its findings on the run; an error is recorded on the run and the pass goes on.';

CREATE FUNCTION llm._run_followup(p_run_id uuid, p_token uuid, p_step text, p_now timestamp with time zone, p_day date DEFAULT NULL::date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 0fc8601209e5ceeafa231af79af597c9 $$;

COMMENT ON FUNCTION llm._run_followup(p_run_id uuid, p_token uuid, p_step text, p_now timestamp with time zone, p_day date) IS 'Runs one follow-up step of a pass (rearm_notices, or rebuild_daily_usage of one day) under the lease and org_lock_timeout; an error is recorded on the run and does not stop the next step. False only when the lease was lost.';

CREATE FUNCTION llm._run_org(p_run_id uuid, p_token uuid, p_organization_id uuid, p_now timestamp with time zone, p_batch integer) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 0fd7e3f464f4000cedc338d33474f948 $$;

COMMENT ON FUNCTION llm._run_org(p_run_id uuid, p_token uuid, p_organization_id uuid, p_now timestamp with time zone, p_batch integer) IS 'Sweeps one organization for a pass (bounded by org_lock_timeout and org_time_budget), adds its figures to the run and renews the lease; an error is recorded on the run and the pass goes on. False when the lease was lost: the pass stops.';

CREATE FUNCTION llm._same_admission(p_inv llm.invocations, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_project text, p_api_key text, p_end_user text) RETURNS llm.invocations
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b5cc1666ca1821e0c5862506b331a8fa $$;

COMMENT ON FUNCTION llm._same_admission(p_inv llm.invocations, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_project text, p_api_key text, p_end_user text) IS 'Returns the stored invocation when a retried admission repeats its arguments, else raises LL007.';

CREATE FUNCTION llm._same_settlement(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_usage jsonb DEFAULT NULL::jsonb) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 592e0ee8bb27d1db1597eb15cd1d79c3 $$;

COMMENT ON FUNCTION llm._same_settlement(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_usage jsonb) IS 'For a settlement answered already_*: LL007 (DETAIL stored and given) when the request''s stored measured settlement has other figures; nothing when they agree or the request ended by a failure.';

CREATE FUNCTION llm._scope_id_ok(p_value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 558c42baf2819e71c2b0260afecee093 $$;

COMMENT ON FUNCTION llm._scope_id_ok(p_value text) IS 'True for NULL or a valid scope id (1..200 characters, not blank, no control character, not ''*'').';

CREATE FUNCTION llm._set_allowance(p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamp with time zone) RETURNS llm.organization_settings
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 17e2bd1bbbae62778df62e0b8a68136f $$;

COMMENT ON FUNCTION llm._set_allowance(p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamp with time zone) IS 'Distributed twin of set_allowance; arguments already checked.';

CREATE FUNCTION llm._set_budget(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint, p_thresholds integer[], p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 2d9b2a326dba320710d7a65d6d0530d5 $$;

COMMENT ON FUNCTION llm._set_budget(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint, p_thresholds integer[], p_now timestamp with time zone) IS 'Distributed twin of set_budget (returns the notices it owed); arguments already checked.';

CREATE FUNCTION llm._set_budget_stripes(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 d4d25d2b601dd7b11fd64e5d6fa82b11 $$;

COMMENT ON FUNCTION llm._set_budget_stripes(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamp with time zone) IS 'Distributed twin of set_budget_stripes; arguments already checked.';

CREATE FUNCTION llm._set_period_stripes(p_organization_id uuid, p_stripes integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 3a3e3ea290c5231af1c863ff655afa67 $$;

COMMENT ON FUNCTION llm._set_period_stripes(p_organization_id uuid, p_stripes integer) IS 'Distributed twin of set_period_stripes; arguments already checked.';

CREATE FUNCTION llm._set_recovery_policy(p_organization_id uuid, p_recovery_charge text, p_late_settlement text) RETURNS llm.organization_settings
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4a3c46801b31887eff90f23be8f44081 $$;

COMMENT ON FUNCTION llm._set_recovery_policy(p_organization_id uuid, p_recovery_charge text, p_late_settlement text) IS 'Distributed twin of set_recovery_policy; arguments already checked.';

CREATE TABLE llm.settings (
    singleton boolean DEFAULT true NOT NULL,
    recovery_window interval DEFAULT '24:00:00'::interval NOT NULL,
    drift_window interval DEFAULT '7 days'::interval NOT NULL,
    sweep_batch integer DEFAULT 200 NOT NULL,
    reporting_days integer DEFAULT 2 NOT NULL,
    health_max_age interval DEFAULT '02:00:00'::interval NOT NULL,
    notice_claim_timeout interval DEFAULT '00:15:00'::interval NOT NULL,
    notice_backoff_base interval DEFAULT '00:01:00'::interval NOT NULL,
    notice_backoff_max interval DEFAULT '06:00:00'::interval NOT NULL,
    org_lock_timeout interval DEFAULT '00:00:05'::interval NOT NULL,
    org_time_budget interval DEFAULT '00:01:00'::interval NOT NULL,
    pass_lease interval DEFAULT '00:05:00'::interval NOT NULL,
    budget_retention interval DEFAULT '400 days'::interval NOT NULL,
    currency text DEFAULT 'USD'::text NOT NULL,
    CONSTRAINT settings_budget_retention_range CHECK (((budget_retention > '00:00:00'::interval) AND (budget_retention <= '100 years'::interval))),
    CONSTRAINT settings_currency_range CHECK ((currency ~ '^[A-Z]{3}$'::text)),
    CONSTRAINT settings_drift_window_range CHECK (((drift_window > '00:00:00'::interval) AND (drift_window <= '365 days'::interval))),
    CONSTRAINT settings_health_max_age_range CHECK (((health_max_age > '00:00:00'::interval) AND (health_max_age <= '30 days'::interval))),
    CONSTRAINT settings_notice_backoff_base_range CHECK (((notice_backoff_base > '00:00:00'::interval) AND (notice_backoff_base <= '01:00:00'::interval))),
    CONSTRAINT settings_notice_backoff_max_range CHECK (((notice_backoff_max > '00:00:00'::interval) AND (notice_backoff_max <= '30 days'::interval))),
    CONSTRAINT settings_notice_claim_timeout_range CHECK (((notice_claim_timeout > '00:00:00'::interval) AND (notice_claim_timeout <= '1 day'::interval))),
    CONSTRAINT settings_org_lock_timeout_range CHECK (((org_lock_timeout > '00:00:00'::interval) AND (org_lock_timeout <= '01:00:00'::interval))),
    CONSTRAINT settings_org_time_budget_range CHECK (((org_time_budget > '00:00:00'::interval) AND (org_time_budget <= '1 day'::interval))),
    CONSTRAINT settings_pass_lease_range CHECK (((pass_lease > '00:00:00'::interval) AND (pass_lease <= '1 day'::interval))),
    CONSTRAINT settings_recovery_window_range CHECK (((recovery_window > '00:00:00'::interval) AND (recovery_window <= '365 days'::interval))),
    CONSTRAINT settings_reporting_days_range CHECK (((reporting_days >= 1) AND (reporting_days <= 35))),
    CONSTRAINT settings_singleton_check CHECK (singleton),
    CONSTRAINT settings_sweep_batch_range CHECK (((sweep_batch >= 1) AND (sweep_batch <= 100000)))
);

COMMENT ON TABLE llm.settings IS 'One row of tunables: recovery window, drift window, sweep batch, reporting days, health max age, notice timing, the bounds of a pass. Each has a range (constraint settings_<setting>_range; docs/operations.md, "Settings"); change them with a plain UPDATE as the owner.';

COMMENT ON COLUMN llm.settings.org_lock_timeout IS 'Longest wait for one lock inside an organization''s sweep (and each follow-up step): a transaction-local lock_timeout; a blocked organization is recorded with 55P03 and the pass goes on.';

COMMENT ON COLUMN llm.settings.org_time_budget IS 'Longest run of one organization''s sweep, checked between its statements: 57014 when exceeded, recorded as that organization''s error.';

COMMENT ON COLUMN llm.settings.pass_lease IS 'How long a pass holds the one-pass-at-a-time lease without renewing it (it renews after each organization); a lapsed lease is taken over.';

COMMENT ON COLUMN llm.settings.budget_retention IS 'The pass deletes budget counters of windows that ended longer ago than this.';

COMMENT ON COLUMN llm.settings.currency IS 'The book''s currency, an ISO 4217 code: every price is in it and every cost is nanos (10^-9) of it.';

CREATE FUNCTION llm._settings() RETURNS llm.settings
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 a64eac210c37f826bf39587a7e201d1b $$;

COMMENT ON FUNCTION llm._settings() IS 'The one settings row.';

CREATE FUNCTION llm._settle_invocation(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone) RETURNS text
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 2484c84a9b5cf2d3bad32fecf79e6d52 $$;

COMMENT ON FUNCTION llm._settle_invocation(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone) IS 'Distributed twin of settle_invocation; arguments already checked.';

CREATE FUNCTION llm._settle_late(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone, p_price llm.priced_usage) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 11e25d9a03e84efd96b0553766c55237 $$;

COMMENT ON FUNCTION llm._settle_late(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone, p_price llm.priced_usage) IS 'Answers a report (measured settlement or failure) on a request no longer open: its already_* outcome, except for the first late report of a recovered request, which under late_settlement = true_up becomes its charge (trued_up, the books moved by the signed difference) and under audit is recorded in late_* with its error (already_recovered).';

CREATE FUNCTION llm._settle_usage(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamp with time zone) RETURNS text
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 7996c8ffc8ddfddbccdfe2a9828a1bef $$;

COMMENT ON FUNCTION llm._settle_usage(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamp with time zone) IS 'Distributed twin of settle_usage; arguments already checked.';

CREATE FUNCTION llm._settle_window(p_organization_id uuid, p_from date, p_to date, OUT created_from timestamp with time zone, OUT created_to timestamp with time zone) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 d17959a345845a7960c7ea378c5530dc $$;

COMMENT ON FUNCTION llm._settle_window(p_organization_id uuid, p_from date, p_to date, OUT created_from timestamp with time zone, OUT created_to timestamp with time zone) IS 'The admission times every request of the organization settled on the days p_from .. p_to (UTC) lies within, from its period stripes'' settle bounds (NULL: none can have); any time until the contract step of 0.4.0 counted them.';

CREATE FUNCTION llm._settled_usage(p_from date, p_to date) RETURNS TABLE(organization_id uuid, day date, model text, requests bigint, recovered_requests bigint, credits numeric, cents numeric, input_tokens numeric, output_tokens numeric, priced_nanos numeric, uncosted_requests bigint, fallback_requests bigint, corrections_nanos numeric)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 f3b8df1d46ead0564f6ffaf18850a209 $$;

COMMENT ON FUNCTION llm._settled_usage(p_from date, p_to date) IS 'The terminal requests settled on UTC days p_from .. p_to by organization, day and model (requests, recovered_requests, credits, cents, tokens, the cost the book priced, the requests with no cost, those priced by the fallback and the corrections of repricing): what daily_usage holds when it is right.';

CREATE FUNCTION llm._skip_run(p_now timestamp with time zone, p_lease llm.pass_lease, p_holder_pid integer) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 079720f5bcd591cfe82444c8bb29f51c $$;

COMMENT ON FUNCTION llm._skip_run(p_now timestamp with time zone, p_lease llm.pass_lease, p_holder_pid integer) IS 'Records a skipped pass naming the pass that holds the lease: its pid, and its run, backend start and expiry once its lease is committed.';

CREATE FUNCTION llm._spread_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer, p_used bigint, p_held bigint, p_cents bigint, p_room_limit bigint, p_limit bigint, p_thresholds integer[], p_epoch uuid) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 92a55211cf8ac3d50e62df8e5bca8480 $$;

COMMENT ON FUNCTION llm._spread_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer, p_used bigint, p_held bigint, p_cents bigint, p_room_limit bigint, p_limit bigint, p_thresholds integer[], p_epoch uuid) IS 'With a budget counter locked: gives each stripe an even share of what p_room_limit leaves (admit_room), of the usage before the next threshold of p_limit not notified (notice_room) and of the cents under the sum limit (cents_room), valid under the organization''s budgets revision p_epoch; none without a limit.';

CREATE FUNCTION llm._spread_rooms(p_organization_id uuid, p_period_start date, p_allowance bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b4ca2c43580328a1ba9234c5b6e51600 $$;

COMMENT ON FUNCTION llm._spread_rooms(p_organization_id uuid, p_period_start date, p_allowance bigint) IS 'With the period locked: creates the stripes its organization uses now and gives each an even share of what the period has left (admit_room: to its allowance and the sum limit), of the cents it may still charge (cents_room: to the sum limit) and of the usage before its next threshold (notice_room).';

CREATE FUNCTION llm._task_admits(p_organization_id uuid, p_execution_id uuid, p_invocation_id uuid, p_estimate_credits bigint, p_model text, p_project text, p_api_key text, p_end_user text) RETURNS llm.invocations
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 b7d97a8c81532b784e40b5f672f53c3a $$;

COMMENT ON FUNCTION llm._task_admits(p_organization_id uuid, p_execution_id uuid, p_invocation_id uuid, p_estimate_credits bigint, p_model text, p_project text, p_api_key text, p_end_user text) IS 'For a request linked to a task: NULL fields when the task runs; the earlier admission when it is a retry of one admitted while it ran; else LL006 (unknown task) or LL009 (closed).';

CREATE FUNCTION llm._terminal_outcome(p_organization_id uuid, p_invocation_id uuid) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 8c93db501889914e42c3bda4e0a177fe $$;

COMMENT ON FUNCTION llm._terminal_outcome(p_organization_id uuid, p_invocation_id uuid) IS 'For an invocation that is no longer open: already_settled, already_recovered or already_failed (LL005 when unknown).';

CREATE FUNCTION llm._text_ok(p_value text, p_max integer, p_nullable boolean DEFAULT false) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 05150cd32237535e0cb390b6f4ca2bc7 $$;

COMMENT ON FUNCTION llm._text_ok(p_value text, p_max integer, p_nullable boolean) IS 'True for a text that is not blank and has at most p_max characters, or a NULL when p_nullable.';

CREATE FUNCTION llm._true_up_daily_usage(p_inv llm.invocations, p_credits bigint, p_cents bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9329f36f2ba68de4106277aae53c2d81 $$;

COMMENT ON FUNCTION llm._true_up_daily_usage(p_inv llm.invocations, p_credits bigint, p_cents bigint) IS 'Moves the daily usage row of a trued-up request''s settlement day and model by the signed difference (inserting the row, computed from the requests, when the day has none); never lost to a concurrent rebuild_daily_usage.';

CREATE FUNCTION llm._unit_cost(p_unit_nanos jsonb, p_usage jsonb) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$ body in sql/, md5 515f792a981952888bf94b71ceb96f86 $_$;

COMMENT ON FUNCTION llm._unit_cost(p_unit_nanos jsonb, p_usage jsonb) IS 'The unrounded nanos of p_usage (every class present) at p_unit_nanos (a version''s unit_nanos); past 10^15 for tokens of a class with no rate, NULL for a usage without every class or no units.';

CREATE FUNCTION llm._unit_estimate(p_unit_nanos jsonb, p_input bigint, p_output bigint) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 fb4bc16bca4051a439a17249ce1f03c8 $$;

COMMENT ON FUNCTION llm._unit_estimate(p_unit_nanos jsonb, p_input bigint, p_output bigint) IS 'The unrounded nanos of p_input input and p_output output tokens and one call at p_unit_nanos (a version''s unit_nanos); past 10^15 when either class has no rate.';

CREATE FUNCTION llm._unit_nanos(p_rates jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 725c00a45aef4d4756694de6300077df $$;

COMMENT ON FUNCTION llm._unit_nanos(p_rates jsonb) IS 'The nanos one token of each class costs at p_rates'' base rates (one call for requests; 10^30 for a class with no rate); NULL for rates with tiers. Stored as price_versions.unit_nanos.';

CREATE FUNCTION llm._upsert_organization(p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint, p_status text, p_notice_thresholds integer[], p_now timestamp with time zone) RETURNS llm.organization_settings
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4ee1e7a58f262b7f0589d10329019e15 $$;

COMMENT ON FUNCTION llm._upsert_organization(p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint, p_status text, p_notice_thresholds integer[], p_now timestamp with time zone) IS 'Distributed twin of upsert_organization; arguments already checked.';

CREATE FUNCTION llm._usage_cost(p_model text, p_version_id bigint, p_rates jsonb, p_usage jsonb, p_nanos_per_credit bigint, OUT cost_nanos bigint, OUT price_tier bigint, OUT credits bigint) RETURNS record
    LANGUAGE plpgsql IMMUTABLE
    AS $$ body in sql/, md5 83f7d715e8f62b53c46386bc3f177ecb $$;

COMMENT ON FUNCTION llm._usage_cost(p_model text, p_version_id bigint, p_rates jsonb, p_usage jsonb, p_nanos_per_credit bigint, OUT cost_nanos bigint, OUT price_tier bigint, OUT credits bigint) IS 'The exact cost in nanos of p_usage at p_rates, class by class, rounded once half up, the tier that priced it (NULL: base rates) and the credits at p_nanos_per_credit (rounded up); 22023 for tokens of a class with no rate or a cost over 10^15 nanos.';

CREATE FUNCTION llm._usage_ok(p_usage jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$ body in sql/, md5 5bdd96036cc9399d2679cd6493763c3a $_$;

COMMENT ON FUNCTION llm._usage_ok(p_usage jsonb) IS 'True for a usage object whose keys are token classes and whose values are integers 0 .. 10^15.';

CREATE FUNCTION llm._window_end(p_window text, p_start date) RETURNS date
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 9b83d03681bc460f8505085e3fa8f0b6 $$;

COMMENT ON FUNCTION llm._window_end(p_window text, p_start date) IS 'The first day after the calendar window (day, week, month) that starts on p_start.';

CREATE FUNCTION llm._window_start(p_window text, p_at timestamp with time zone) RETURNS date
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ body in sql/, md5 ec51268a0ae69472d136459fb5b318ff $$;

COMMENT ON FUNCTION llm._window_start(p_window text, p_at timestamp with time zone) IS 'The first day of the calendar window (day, week from Monday, month) containing p_at, in UTC.';

CREATE FUNCTION llm.admit_invocation(p_organization_id uuid, p_estimate_credits bigint, p_model text, p_execution_id uuid DEFAULT NULL::uuid, p_invocation_id uuid DEFAULT NULL::uuid, p_now timestamp with time zone DEFAULT now(), p_project text DEFAULT NULL::text, p_api_key text DEFAULT NULL::text, p_end_user text DEFAULT NULL::text, p_input_tokens bigint DEFAULT NULL::bigint, p_max_output_tokens bigint DEFAULT NULL::bigint) RETURNS llm.admission_result
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 5572e59250994879b426671de67eda72 $$;

COMMENT ON FUNCTION llm.admit_invocation(p_organization_id uuid, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_invocation_id uuid, p_now timestamp with time zone, p_project text, p_api_key text, p_end_user text, p_input_tokens bigint, p_max_output_tokens bigint) IS 'Admits a request iff used + held + estimate fits the allowance and every budget that applies to its project, API key and end user (LL001 naming the first that does not), placing its hold on the current period and on those budgets'' counters; the estimate is p_estimate_credits, or (NULL) p_input_tokens and p_max_output_tokens priced by the book (LL014 without a price). Pins the price in force for its model. A repeated p_invocation_id with the same arguments returns the first admission as it stands now, with replayed = true (different arguments: LL007).';

CREATE FUNCTION llm.books_history(p_organization_ids uuid[]) RETURNS TABLE(recovered_requests bigint, past_window_alerts bigint, abandoned_tasks bigint, notices_sent bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 e59f12b1cf34b4e50db1129c7f5c6f3e $$;

COMMENT ON FUNCTION llm.books_history(p_organization_ids uuid[]) IS 'One row: requests recovered, past-window alerts, tasks abandoned and notices sent, ever, for these organizations (a scan of their rows).';

CREATE FUNCTION llm.books_snapshot(p_organization_ids uuid[] DEFAULT NULL::uuid[], p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(open_requests bigint, held_credits numeric, stale_open_requests bigint, stale_held_credits numeric, running_tasks bigint, stale_running_tasks bigint, drift_findings bigint, notices_owed bigint, notices_sending bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 828c7a498c91f854ac1d34fecf444eff $$;

COMMENT ON FUNCTION llm.books_snapshot(p_organization_ids uuid[], p_now timestamp with time zone) IS 'One row: what the next pass would act on at p_now: open requests and holds (all, and older than the recovery window), running tasks (all, and stale), drift findings, owed and sending notices.';

CREATE FUNCTION llm.check_daily_usage(p_from date, p_to date) RETURNS TABLE(organization_id uuid, day date, recorded jsonb, computed jsonb)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 de48439471218c839f0c0b71f2eddfff $$;

COMMENT ON FUNCTION llm.check_daily_usage(p_from date, p_to date) IS 'One row per organization and UTC day of p_from .. p_to whose daily_usage rows differ from its terminal requests: recorded (the rows) and computed (from the requests), each a jsonb object by model; empty when they agree.';

CREATE FUNCTION llm.check_invariants() RETURNS TABLE(invariant integer, organization_id uuid, subject text, detail text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bf8719775e74899b1f1a528a7c2fd4cc $$;

COMMENT ON FUNCTION llm.check_invariants() IS 'Returns one row per violated invariant (docs/contract.md: held, used, ledger, admission, notices and alerts, task totals, task states, the period and task of every invocation, the current allowance, the sweeps'' totals, period findings, notice claims, drift findings, budget counters, budget ceilings, priced requests, cost sums and what an organization''s row says of its budgets); empty when the books are right.';

CREATE FUNCTION llm.claim_notices(p_limit integer DEFAULT 50, p_now timestamp with time zone DEFAULT now()) RETURNS SETOF llm.notice_claim
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6eefacf58314f2f3f11e18aebada1a08 $$;

COMMENT ON FUNCTION llm.claim_notices(p_limit integer, p_now timestamp with time zone) IS 'Claims up to p_limit due owed notices (owed -> sending), oldest crossing first, by compare-and-set per notice: two workers never claim the same notice. Each row carries its claim''s new claim_token, which ends the claim.';

CREATE FUNCTION llm.close_execution(p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text DEFAULT NULL::text, p_now timestamp with time zone DEFAULT now()) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 156fb6ee717cd78d49f621d0e14b3a92 $$;

COMMENT ON FUNCTION llm.close_execution(p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text, p_now timestamp with time zone) IS 'Closes a running task as completed or failed, stamping ended_at and duration_ms and keeping its totals; false when it was no longer running (a closed task never reopens). LL009 for any other outcome.';

CREATE FUNCTION llm.complete_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone DEFAULT now()) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 544ac6d475ea9a4d81c9f5e8ebf70de4 $$;

COMMENT ON FUNCTION llm.complete_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) IS 'Marks a claimed notice sent (sending -> sent); false, changing nothing, unless it is being sent under p_claim_token (already sent, re-armed, or claimed again since).';

CREATE FUNCTION llm.declare_task_kind(p_key text, p_description text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 7cfba3cea3f83c38e09c71823aa0d015 $$;

COMMENT ON FUNCTION llm.declare_task_kind(p_key text, p_description text) IS 'Declares a task kind; idempotent (a repeat with a new description updates it, a NULL description keeps the old one).';

CREATE FUNCTION llm.distribute(p_shard_count integer DEFAULT NULL::integer) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $_$ body in sql/, md5 ed7bc6c92926619a37b157ab8cba035d $_$;

COMMENT ON FUNCTION llm.distribute(p_shard_count integer) IS 'Under Citus: reference tables for catalogs, per-organization tables distributed on organization_id co-located with organizations, per-organization twins distributed with force_delegation, the other llm routines propagated to the workers; LL011 without citus.';

CREATE FUNCTION llm.fail_invocation(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint DEFAULT 0, p_cents bigint DEFAULT 0, p_now timestamp with time zone DEFAULT now(), p_usage jsonb DEFAULT NULL::jsonb) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bbce5ef8c1902eb92fa175f990cf5215 $$;

COMMENT ON FUNCTION llm.fail_invocation(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_now timestamp with time zone, p_usage jsonb) IS 'Fails a request: releases its hold and charges the optional partial usage once (p_credits and p_cents, or p_usage priced at the request''s pinned version). Returns failed, or already_settled / already_recovered / already_failed with nothing changed; the first failure of a recovered request is a late report: under late_settlement = true_up it returns trued_up and moves the books to its partial charge by the signed difference, under audit it records its figures and error and returns already_recovered.';

CREATE FUNCTION llm.fail_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_error text, p_now timestamp with time zone DEFAULT now()) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 c80da7fc5855c2e4a1fb3888dabae823 $$;

COMMENT ON FUNCTION llm.fail_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_error text, p_now timestamp with time zone) IS 'Returns a claimed notice to owed with its error and an exponential backoff (base * 2^(attempts-1), capped by settings; NOTIFY llm_notices); false, changing nothing, unless it is being sent under p_claim_token.';

CREATE FUNCTION llm.last_run(p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(id uuid, started_at timestamp with time zone, finished_at timestamp with time zone, clock timestamp with time zone, status text, orgs_visited integer, orgs_failed integer, requests_recovered bigint, released_hold_credits numeric, past_window_alerts bigint, executions_abandoned bigint, drift_findings bigint, notices_rearmed bigint, daily_rows_rebuilt bigint, more_pending_orgs integer, errors jsonb, recovered_uncharged bigint, period_findings bigint, daily_rebuilt_through date, duration_seconds double precision, age_seconds double precision)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 2e3c3e8e7ddb0073ee77339d22e9d11a $$;

COMMENT ON FUNCTION llm.last_run(p_now timestamp with time zone) IS 'The newest finished pass that was not skipped (its llm.reconciliation_runs figures), how long it took and its age at p_now on the pass''s clock, in seconds; no row before the first pass.';

CREATE FUNCTION llm.mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamp with time zone DEFAULT now()) RETURNS llm.admission_result
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 3286dea9d8c38428d62b0ee54c4b780a $$;

COMMENT ON FUNCTION llm.mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamp with time zone) IS 'Marks a reserved request as sent to the provider (idempotent when already dispatched: replayed = true); LL009 when it is already terminal.';

CREATE FUNCTION llm.metrics(p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(metric text, labels jsonb, value double precision)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 11dc86cd2a0bc7b60d45c558ae61e9a0 $$;

COMMENT ON FUNCTION llm.metrics(p_now timestamp with time zone) IS 'Every series of the Prometheus exposition at p_now (metric, labels, value): the health alarm, the last pass, what the next pass would act on, the stale requests by organization status, budgets near their limit, the limit windows that refused, the month''s cost and fallback-priced requests by model, and the sweeps'' totals; every series present, 0 when none.';

CREATE FUNCTION llm.note_refusal(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_now timestamp with time zone DEFAULT now()) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 8e94af91b320d9c5fb0c3e8529b90571 $$;

COMMENT ON FUNCTION llm.note_refusal(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_now timestamp with time zone) IS 'Reports an admission''s refusal in a transaction of its own: the first report of each limit (the allowance, or a budget for one id) and window owes one limit_reached notice (threshold 0) and returns true; a later one, or one for a limit not in force, writes nothing and returns false.';

CREATE FUNCTION llm.open_execution(p_organization_id uuid, p_task_key text, p_subject_type text DEFAULT NULL::text, p_subject_id text DEFAULT NULL::text, p_replay_key text DEFAULT NULL::text, p_now timestamp with time zone DEFAULT now()) RETURNS TABLE(execution_id uuid, status text, replayed boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 93fcb079d46ffadd2eaf234813ad4ae4 $$;

COMMENT ON FUNCTION llm.open_execution(p_organization_id uuid, p_task_key text, p_subject_type text, p_subject_id text, p_replay_key text, p_now timestamp with time zone) IS 'Opens a running task of a declared kind (LL004 otherwise). A replay key is unique per organization: opening it again returns the earlier task, whatever its status, with replayed = true; with a different task or subject, LL007.';

CREATE FUNCTION llm.organization_totals(p_organization_ids uuid[]) RETURNS TABLE(organization_id uuid, name text, status text, allowance_credits bigint, used_credits numeric, held_credits numeric, used_cents numeric, notices bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 a074ef14eac040778dca7c222f3785b4 $$;

COMMENT ON FUNCTION llm.organization_totals(p_organization_ids uuid[]) IS 'Per organization of p_organization_ids: its allowance, the sums over its periods (used, held, cents) and its threshold notices.';

CREATE FUNCTION llm.pass_progress(p_since timestamp with time zone) RETURNS TABLE(organizations bigint, orgs_visited integer)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bb75920df60e348a1675f7c7f4df41e0 $$;

COMMENT ON FUNCTION llm.pass_progress(p_since timestamp with time zone) IS 'One row: the operational organizations (what a pass visits) and the organizations visited so far by the pass running since p_since (NULL: none running).';

CREATE FUNCTION llm.price_usage(p_model text, p_usage jsonb, p_organization_id uuid DEFAULT NULL::uuid, p_at timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS llm.price_quote
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 57fcfe5a9f3942c7759fdae40f811dab $$;

COMMENT ON FUNCTION llm.price_usage(p_model text, p_usage jsonb, p_organization_id uuid, p_at timestamp with time zone) IS 'What p_usage of p_model costs (exact nanos) and is charged (credits) for an organization (NULL: the book''s prices) at p_at, with the versions that price it; writes nothing. LL014 without a price or credit rate in force, 22023 for a bad usage or a class with no rate.';

CREATE FUNCTION llm.rearm_notices(p_now timestamp with time zone DEFAULT now()) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 5c8422c351648fd4bd322e60cd12480d $$;

COMMENT ON FUNCTION llm.rearm_notices(p_now timestamp with time zone) IS 'Makes notices owed again whose claim is older than settings.notice_claim_timeout without completion, due at once (NOTIFY llm_notices), voiding the claim''s token; returns how many. Failed notices are already owed with their backoff.';

CREATE FUNCTION llm.rebuild_daily_usage(p_from date, p_to date) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 cbeae891af3d3a3fd865f9f890eb927b $$;

COMMENT ON FUNCTION llm.rebuild_daily_usage(p_from date, p_to date) IS 'Recomputes daily_usage for days p_from .. p_to (UTC settlement day) from the invocations; idempotent; a concurrent true-up is never lost; returns the rows written.';

CREATE FUNCTION llm.reconcile_org(p_organization_id uuid, p_now timestamp with time zone DEFAULT now(), p_batch integer DEFAULT NULL::integer, p_run_id uuid DEFAULT NULL::uuid) RETURNS llm.org_sweep
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 5b85e86b4402f6f255a62350247ed981 $$;

COMMENT ON FUNCTION llm.reconcile_org(p_organization_id uuid, p_now timestamp with time zone, p_batch integer, p_run_id uuid) IS 'One organization''s recovery sweep in one transaction: abandons tasks running past the recovery window, recovers up to p_batch stranded requests at their estimate (oldest first), refreshes drift findings; returns its figures with more_pending. Bounded: 55P03 after settings.org_lock_timeout waiting for a lock, 57014 past settings.org_time_budget.';

CREATE FUNCTION llm.reconciliation_health(p_now timestamp with time zone DEFAULT now()) RETURNS TABLE(status text, last_success_at timestamp with time zone, last_run_status text, detail text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 72277023a35ae9251692f441b6d81c60 $$;

COMMENT ON FUNCTION llm.reconciliation_health(p_now timestamp with time zone) IS 'The missing-run alarm: ok, late (no completed pass within settings.health_max_age), never (no pass ever ran), or failing (the last pass recorded errors, or every pass so far failed).';

CREATE FUNCTION llm.release_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone DEFAULT now()) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 26ef74594bc96fc8b289483d5f5ac816 $$;

COMMENT ON FUNCTION llm.release_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) IS 'Gives a claimed notice back unsent (sending -> owed, due at p_now, no attempt counted, NOTIFY llm_notices): a worker shutting down; false, changing nothing, unless it is being sent under p_claim_token.';

CREATE FUNCTION llm.report_budgets_near_limit(p_scope text DEFAULT NULL::text, p_organization_ids uuid[] DEFAULT NULL::uuid[], p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(organization_id uuid, name text, scope text, scope_id text, budget_window text, window_start date, limit_credits bigint, first_threshold integer, used_credits bigint, held_credits bigint, used_cents bigint, used_cost_nanos numeric)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 ac05597515361c9ffee98ffd87a182e9 $$;

COMMENT ON FUNCTION llm.report_budgets_near_limit(p_scope text, p_organization_ids uuid[], p_now timestamp with time zone) IS 'The budget counters of the windows containing p_now at or above the first threshold of the budget that applies to them (used + held), for scope p_scope (NULL: every scope).';

CREATE FUNCTION llm.report_costs(p_from date, p_to date, p_organization_ids uuid[] DEFAULT NULL::uuid[]) RETURNS TABLE(organization_id uuid, name text, model text, currency text, requests numeric, cost_nanos numeric, original_cost_nanos numeric, uncosted_requests numeric, fallback_requests numeric)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 78bddfcb7796ae7b26491d323106bc1e $$;

COMMENT ON FUNCTION llm.report_costs(p_from date, p_to date, p_organization_ids uuid[]) IS 'The cost of days p_from .. p_to (UTC settlement day) per organization and model, in exact nanos of the book''s currency: requests, cost (as corrected by llm.reprice) and the original cost, requests with no cost (recovered at their estimate) and requests priced at the fallback; dearest first.';

CREATE FUNCTION llm.report_daily_usage(p_from date, p_to date, p_organization_ids uuid[] DEFAULT NULL::uuid[]) RETURNS TABLE(day date, organization_id uuid, name text, model text, requests bigint, recovered_requests bigint, credits numeric, cents numeric, input_tokens numeric, output_tokens numeric, cost_nanos numeric, uncosted_requests bigint, fallback_requests bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 1fb3f2f2b010b049463ec13723a0b47a $$;

COMMENT ON FUNCTION llm.report_daily_usage(p_from date, p_to date, p_organization_ids uuid[]) IS 'The rows of llm.daily_usage for days p_from .. p_to (UTC settlement day), newest day first, with the organization''s name and the cost (nanos; uncosted_requests: in no cost, fallback_requests: priced at the fallback).';

CREATE FUNCTION llm.report_open_holds(p_organization_ids uuid[] DEFAULT NULL::uuid[], p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(organization_id uuid, name text, open_requests bigint, held_credits numeric, oldest_created_at timestamp with time zone, past_window bigint)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 4578f8d82412aeba601c8a3aa0d28f5a $$;

COMMENT ON FUNCTION llm.report_open_holds(p_organization_ids uuid[], p_now timestamp with time zone) IS 'Per organization, the requests still holding credits: how many, their holds, the oldest, and how many are older than the recovery window at p_now.';

CREATE FUNCTION llm.report_periods(p_from date, p_to date, p_organization_ids uuid[] DEFAULT NULL::uuid[]) RETURNS TABLE(organization_id uuid, name text, status text, period_start date, period_end date, allowance_credits bigint, used_credits bigint, held_credits bigint, used_cents bigint, used_cost_nanos numeric)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9896234c538969abff90343d73b12bc7 $$;

COMMENT ON FUNCTION llm.report_periods(p_from date, p_to date, p_organization_ids uuid[]) IS 'The periods overlapping days p_from .. p_to, with their organization: allowance, used, held, cents and used cost (nanos); by organization name and period.';

CREATE FUNCTION llm.report_scope_usage(p_scope text, p_from date, p_to date, p_organization_ids uuid[] DEFAULT NULL::uuid[]) RETURNS TABLE(organization_id uuid, name text, scope_id text, requests bigint, open_requests bigint, used_credits numeric, held_credits numeric, used_cents numeric, used_cost_nanos numeric)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 6ad328dc49b03ef8d30e31c79e1ebd70 $$;

COMMENT ON FUNCTION llm.report_scope_usage(p_scope text, p_from date, p_to date, p_organization_ids uuid[]) IS 'Usage per id of scope p_scope (project, api_key or end_user) of the requests admitted in days p_from .. p_to: requests, open ones, used, held, cents and used cost (nanos); 22023 for another scope.';

CREATE FUNCTION llm.report_tasks(p_from date, p_organization_ids uuid[] DEFAULT NULL::uuid[]) RETURNS TABLE(organization_id uuid, name text, status text, tasks bigint, requests bigint, credits numeric, cents numeric, cost_nanos numeric)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 3c47e2f608c04fd840425bc8409b1c3c $$;

COMMENT ON FUNCTION llm.report_tasks(p_from date, p_organization_ids uuid[]) IS 'Per organization and status, the tasks started since day p_from (UTC) and every task still running: how many, and their requests, credits, cents and cost (nanos).';

CREATE FUNCTION llm.reprice(p_model text, p_from timestamp with time zone, p_to timestamp with time zone, p_version_id bigint, p_apply boolean DEFAULT false) RETURNS TABLE(organization_id uuid, requests bigint, cost_before_nanos numeric, cost_after_nanos numeric, difference_nanos numeric)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 a3bd5040d1cfca614899df44c4230031 $$;

COMMENT ON FUNCTION llm.reprice(p_model text, p_from timestamp with time zone, p_to timestamp with time zone, p_version_id bigint, p_apply boolean) IS 'Reprices the requests of p_model admitted in [p_from, p_to) that were priced from usage at price version p_version_id (an organization''s own version: that organization''s; a book version: those pinned to book versions); one row per organization: requests, cost before (as already corrected), after, difference. With p_apply it writes one correction per changed request and moves every cost sum by it in this transaction; credits stay as charged; repeating it changes nothing.';

CREATE PROCEDURE llm.run_reconciliation(IN p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, IN p_batch integer DEFAULT NULL::integer)
    LANGUAGE plpgsql
    AS $$ body in sql/, md5 98f96ae454a8e5bb593256c8a72231a7 $$;

COMMENT ON PROCEDURE llm.run_reconciliation(IN p_now timestamp with time zone, IN p_batch integer) IS 'The hourly pass: one at a time under a lease (a concurrent call is recorded as skipped; a dead, cancelled or pooled-away pass is taken over), sweeps every operational organization committing after each and audits its periods when due, records errors and goes on, then re-arms notices and rebuilds daily usage one day at a time since the last complete rebuild; one llm.reconciliation_runs row per call.';

CREATE FUNCTION llm.schedule_reconciliation(p_schedule text DEFAULT '0 * * * *'::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $_$ body in sql/, md5 fcd7aad37d61f1d5851b607d37d0740f $_$;

COMMENT ON FUNCTION llm.schedule_reconciliation(p_schedule text) IS 'Schedules (or reschedules) the pg_cron job llm-reconciliation of the schema owner running CALL llm.run_reconciliation() in this database; returns its job id; LL010 without pg_cron, 42501 without its grants, 42710 when that job runs in another database.';

CREATE FUNCTION llm.set_allowance(p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamp with time zone DEFAULT now()) RETURNS llm.organization_settings
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 8edb242894bf3e76f7b29d66e4a724cd $$;

COMMENT ON FUNCTION llm.set_allowance(p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamp with time zone) IS 'Changes only the monthly allowance (NULL = unlimited) of an existing organization (LL002 otherwise), as upsert_organization would: the period containing p_now and later open ones take it and owe at once every threshold their usage now stands at or above. Name, status and thresholds stay.';

CREATE FUNCTION llm.set_budget(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint, p_thresholds integer[] DEFAULT '{80,100}'::integer[], p_now timestamp with time zone DEFAULT now()) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 61074413915dfbc0aeb6ee5a7474a606 $$;

COMMENT ON FUNCTION llm.set_budget(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint, p_thresholds integer[], p_now timestamp with time zone) IS 'Sets (or with a NULL limit removes) the budget of a scope id, or of every id of the scope without one (''*''), per day, week or month in UTC; it applies to every admission after it commits, and owes at once the thresholds the window containing p_now stands at or above.';

CREATE FUNCTION llm.set_budget_stripes(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamp with time zone DEFAULT now()) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 62a2ea2f4b0664318fceedf236d4e647 $$;

COMMENT ON FUNCTION llm.set_budget_stripes(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamp with time zone) IS 'Spreads the counters of a budget (for ''*'', of every id it governs) over 1 to 64 stripes, so concurrent requests of one hot key or user hold on different rows; applies to the counters of the window containing p_now at once and to every counter created after; returns the new count.';

CREATE FUNCTION llm.set_credit_rate(p_nanos_per_credit bigint, p_organization_id uuid DEFAULT NULL::uuid, p_effective_from timestamp with time zone DEFAULT now()) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 45013de5d318af2857cca865956e8cdb $$;

COMMENT ON FUNCTION llm.set_credit_rate(p_nanos_per_credit bigint, p_organization_id uuid, p_effective_from timestamp with time zone) IS 'Adds a credit rate (nanos of the book''s currency per credit) from p_effective_from, for the book or one organization, and returns its id; credits are ceil(cost / rate). The same rate at the same time returns that rate''s id, another is 22023.';

CREATE FUNCTION llm.set_period_stripes(p_organization_id uuid, p_stripes integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 482bc274338ed80e81e4b205d3e53bf3 $$;

COMMENT ON FUNCTION llm.set_period_stripes(p_organization_id uuid, p_stripes integer) IS 'Spreads the organization''s period counters over p_stripes rows (1 to 64; 22023 otherwise, LL002 for an unknown organization) from its next admission on; returns the new count. Admission stays exact and no threshold crossing is missed.';

CREATE FUNCTION llm.set_price(p_model text, p_rates jsonb, p_effective_from timestamp with time zone DEFAULT now(), p_organization_id uuid DEFAULT NULL::uuid) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 0ad5c851022dd466fe0e531e395f7f43 $$;

COMMENT ON FUNCTION llm.set_price(p_model text, p_rates jsonb, p_effective_from timestamp with time zone, p_organization_id uuid) IS 'Adds a price version of p_model (''*'': the fallback) from p_effective_from, for the book or one organization, and returns its id; exactly the rates in force then return that version and add none; other rates at an existing effective_from are 22023 (versions never change).';

CREATE FUNCTION llm.set_recovery_policy(p_organization_id uuid, p_recovery_charge text, p_late_settlement text) RETURNS llm.organization_settings
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 8496f94db3aa0f1a6a027872f172487a $$;

COMMENT ON FUNCTION llm.set_recovery_policy(p_organization_id uuid, p_recovery_charge text, p_late_settlement text) IS 'Sets what recovery charges a stranded request (estimate | dispatched | none) and what a measured settlement arriving after recovery does (audit | true_up); 22023 for another word, LL002 for an unknown organization.';

CREATE FUNCTION llm.settle_invocation(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint DEFAULT NULL::bigint, p_output_tokens bigint DEFAULT NULL::bigint, p_now timestamp with time zone DEFAULT now()) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 bd0ffc331781ea1b09aab16d3a75a361 $$;

COMMENT ON FUNCTION llm.settle_invocation(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone) IS 'Settles a request with measured usage: charges it once, releases its hold, moves its own period, adds to its task and records crossed thresholds. Returns settled, or already_settled / already_recovered / already_failed with nothing charged (LL007 when a stored measured settlement has other figures); under late_settlement = true_up the first measured settlement of a recovered request returns trued_up and moves the books by the signed difference.';

CREATE FUNCTION llm.settle_usage(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamp with time zone DEFAULT now()) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 44b9ed2cc66a3b81afd74c1218f42a82 $$;

COMMENT ON FUNCTION llm.settle_usage(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamp with time zone) IS 'Settles a request with the provider''s measured usage, priced exactly at the version and credit rate its admission pinned: charges the credits, records cost_nanos, usage, price_tier and priced_by, and moves the books as settle_invocation does, with the same outcomes (LL014 for a request admitted with no price in force).';

CREATE FUNCTION llm.stale_by_organization_status(p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(organization_status text, stale_open_requests bigint, stale_held_credits numeric)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 07303d12cc29d488cdb149bd54b9ae22 $$;

COMMENT ON FUNCTION llm.stale_by_organization_status(p_now timestamp with time zone) IS 'Per organization status (operational, suspended, closed: every one, 0 when none), the open requests older than the recovery window at p_now and their holds.';

CREATE FUNCTION llm.unschedule_reconciliation() RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $_$ body in sql/, md5 660cd674366d81ce98a7043f1fbd6a05 $_$;

COMMENT ON FUNCTION llm.unschedule_reconciliation() IS 'Removes the schema owner''s pg_cron job llm-reconciliation of this database; false when there was none; LL010 without pg_cron, 42501 without its grants.';

CREATE FUNCTION llm.upsert_organization(p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint, p_status text DEFAULT NULL::text, p_notice_thresholds integer[] DEFAULT NULL::integer[], p_now timestamp with time zone DEFAULT now()) RETURNS llm.organization_settings
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'llm', 'pg_temp'
    AS $$ body in sql/, md5 9ed5e63a1c4fee55047453a5030241e2 $$;

COMMENT ON FUNCTION llm.upsert_organization(p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint, p_status text, p_notice_thresholds integer[], p_now timestamp with time zone) IS 'Creates or updates an organization; a NULL status or threshold list keeps the organization''s (a new one: operational, {80,100}). A changed allowance (NULL = unlimited) also applies to the period containing p_now and later open ones, which owe at once every threshold their usage now stands at or above; a changed threshold list applies to every period.';

CREATE VIEW llm._execution_charges AS
 SELECT i.organization_id,
    i.execution_id,
    count(*) AS n,
    sum((i.charged_credits)::bigint) AS credits,
    sum(COALESCE((i.charged_cents)::bigint, (0)::bigint)) AS cents
   FROM llm.invocations i
  WHERE ((i.execution_id IS NOT NULL) AND ((i.status)::text = ANY (ARRAY['settled'::text, 'failed'::text])))
  GROUP BY i.organization_id, i.execution_id;

COMMENT ON VIEW llm._execution_charges IS 'Internal: each task''s terminal requests, counted, with their charged credits and cents.';

CREATE TABLE llm.invocation_scopes (
    organization_id uuid NOT NULL,
    invocation_id uuid NOT NULL,
    project text,
    api_key text,
    end_user text,
    budget_mask smallint NOT NULL
);

COMMENT ON TABLE llm.invocation_scopes IS 'The project, API key and end user a request named at admission, and the budget counters it moves (budget_mask); one row per request that named a scope id or was admitted under a budget.';

COMMENT ON COLUMN llm.invocation_scopes.budget_mask IS 'The budget counters the request moves, fixed at admission: bit 3 * scope + window (organization 0, project 1, api_key 2, end_user 3; day 0, week 1, month 2); 0 when none.';

CREATE VIEW llm._invocation_budget_keys AS
 SELECT i.organization_id,
    i.id AS invocation_id,
    i.status,
    i.created_at,
    i.budget_stripe,
    i.hold_credits,
    i.charged_credits,
    i.charged_cents,
    i.recovered_credits,
    k.slot,
    k.scope,
    k.scope_id,
    k.budget_window,
    k.window_start
   FROM ((llm.invocations i
     LEFT JOIN llm.invocation_scopes s ON (((s.organization_id = i.organization_id) AND (s.invocation_id = i.id) AND (i.budget_mask IS NULL))))
     CROSS JOIN LATERAL llm._budget_keys((COALESCE(i.budget_mask, s.budget_mask))::integer, COALESCE(i.project, s.project), COALESCE(i.api_key, s.api_key), COALESCE(i.end_user, s.end_user), i.created_at) k(slot, scope, scope_id, budget_window, window_start));

COMMENT ON VIEW llm._invocation_budget_keys IS 'Internal: each request (of this release or the previous one) with each budget counter it moves (scope, id, window, window start).';

CREATE TABLE llm.period_stripes (
    organization_id uuid NOT NULL,
    period_start date NOT NULL,
    stripe llm.stripe NOT NULL,
    used_credits llm.amount DEFAULT 0 NOT NULL,
    held_credits llm.amount DEFAULT 0 NOT NULL,
    used_cents llm.amount DEFAULT 0 NOT NULL,
    admit_room llm.amount,
    notice_room llm.amount,
    cents_room llm.amount,
    open_requests integer,
    open_since timestamp with time zone,
    quiet boolean,
    settle_lag_hours integer,
    settle_lead_hours integer,
    priced_nanos numeric DEFAULT 0 NOT NULL
);

COMMENT ON TABLE llm.period_stripes IS 'A period''s counters, spread over stripes: used and held credits and used cents of the requests whose hold is on the stripe, and its escrow: admit_room (credits it may hold without the other stripes; NULL: unlimited) and notice_room (usage it may add before the period could reach its next threshold; NULL: no threshold ahead).';

COMMENT ON COLUMN llm.period_stripes.admit_room IS 'Credits this stripe may still hold on its own; the stripes'' rooms never add up to more than the period has left to its allowance and to the sum limit (NULL: spread on its next exact movement).';

COMMENT ON COLUMN llm.period_stripes.notice_room IS 'Usage this stripe may still add on its own before the period could reach its next threshold (NULL: none ahead); a movement that does not fit decides on the exact totals.';

COMMENT ON COLUMN llm.period_stripes.cents_room IS 'Cents this stripe may still charge on its own; the stripes'' rooms never add up to more than the sum limit less the period''s used cents (NULL: spread on its next exact movement).';

COMMENT ON COLUMN llm.period_stripes.open_requests IS 'How many reserved or dispatched requests hold on this stripe (NULL: not known yet).';

COMMENT ON COLUMN llm.period_stripes.open_since IS 'No open request of this stripe was admitted before it (NULL: none is open, or not known yet while open_requests is): where the pass and the reports start reading open requests.';

COMMENT ON COLUMN llm.period_stripes.quiet IS 'True: a pass found no open request here and none was admitted since; the index period_stripes_open holds the others.';

COMMENT ON COLUMN llm.period_stripes.settle_lag_hours IS 'No terminal request of this stripe was settled more than this many hours (rounded up) after its admission: the daily rebuild reads requests by admission time from the settlement day less this.';

COMMENT ON COLUMN llm.period_stripes.settle_lead_hours IS 'No terminal request of this stripe was settled more than this many hours (rounded up) before its admission (a clock behind at settlement).';

COMMENT ON COLUMN llm.period_stripes.priced_nanos IS 'The cost (nanos) of the stripe''s requests priced from usage, corrections included; its used cost is used_cents * 10^7 + priced_nanos.';

CREATE VIEW llm._open_floors AS
 SELECT s.organization_id,
    min(
        CASE
            WHEN (s.open_requests IS NULL) THEN ((s.period_start)::timestamp without time zone AT TIME ZONE 'UTC'::text)
            ELSE s.open_since
        END) AS floor
   FROM llm.period_stripes s
  WHERE ((s.quiet IS NOT TRUE) AND ((s.open_requests IS NULL) OR (s.open_requests > 0)))
  GROUP BY s.organization_id;

COMMENT ON VIEW llm._open_floors IS 'Internal: each organization with open requests and the earliest admission time one of them may have (its open floor).';

CREATE TABLE llm.budget_counters (
    organization_id uuid NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    scope text NOT NULL,
    scope_id text,
    budget_window text NOT NULL,
    window_start date NOT NULL,
    used_credits bigint DEFAULT 0 NOT NULL,
    held_credits bigint DEFAULT 0 NOT NULL,
    used_cents bigint DEFAULT 0 NOT NULL,
    admitted_limit bigint NOT NULL,
    admitted_revision uuid NOT NULL,
    stripe smallint DEFAULT 0 NOT NULL,
    stripes smallint DEFAULT 1 NOT NULL,
    admit_room bigint,
    notice_room bigint,
    cents_room bigint,
    rooms_revision uuid,
    priced_nanos numeric DEFAULT 0 NOT NULL
)
WITH (fillfactor='70');

COMMENT ON TABLE llm.budget_counters IS 'What the requests admitted under a budget use, per (organization, scope, id, window, window start); an own budget and its scope''s ''*'' share the row.';

COMMENT ON COLUMN llm.budget_counters.admitted_limit IS 'The limit the last admission counted here was decided against (invariant 14).';

COMMENT ON COLUMN llm.budget_counters.admitted_revision IS 'The revision of the budget that limit came from (budget_limits.revision, new at every set_budget): when the budget that applies now has another, the limit changed after the last admission.';

COMMENT ON COLUMN llm.budget_counters.stripe IS 'Which of its counter''s stripes this row is (0 .. stripes - 1).';

COMMENT ON COLUMN llm.budget_counters.stripes IS 'How many stripes its counter has (the same on every stripe of a counter).';

COMMENT ON COLUMN llm.budget_counters.admit_room IS 'Credits this stripe may still hold on its own; the stripes'' rooms never add up to more than the limit of rooms_revision less the counter''s used + held (NULL: spread on its next exact movement).';

COMMENT ON COLUMN llm.budget_counters.notice_room IS 'Usage this stripe may still add on its own before the counter could reach the next threshold of rooms_revision not notified yet (NULL: none ahead).';

COMMENT ON COLUMN llm.budget_counters.cents_room IS 'Cents this stripe may still charge on its own, under the sum limit (NULL: spread on its next exact movement).';

COMMENT ON COLUMN llm.budget_counters.rooms_revision IS 'The budget revision the rooms were spread under: a movement that reads another revision in force takes the exact path.';

COMMENT ON COLUMN llm.budget_counters.priced_nanos IS 'The cost (nanos) of the counter stripe''s requests priced from usage, corrections included; its used cost is used_cents * 10^7 + priced_nanos.';

CREATE TABLE llm.budget_horizons (
    organization_id uuid NOT NULL,
    horizon date NOT NULL,
    updated_at timestamp with time zone NOT NULL
);

COMMENT ON TABLE llm.budget_horizons IS 'Per organization, the day on or before which every budget window ended may have lost its counter to retention; admissions that would create a counter of such a window are refused (LL012). Only raised.';

CREATE TABLE llm.budget_limits (
    organization_id uuid NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    scope text NOT NULL,
    scope_id text,
    budget_window text NOT NULL,
    limit_credits bigint NOT NULL,
    thresholds integer[] NOT NULL,
    revision uuid NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    stripes smallint,
    CONSTRAINT budget_limits_budget_window_check CHECK ((budget_window = ANY (ARRAY['day'::text, 'week'::text, 'month'::text]))),
    CONSTRAINT budget_limits_limit_credits_check CHECK (((limit_credits >= 0) AND (limit_credits <= '1000000000000000'::bigint))),
    CONSTRAINT budget_limits_not_allowance CHECK ((NOT ((scope = 'organization'::text) AND (budget_window = 'month'::text)))),
    CONSTRAINT budget_limits_scope_check CHECK ((scope = ANY (ARRAY['organization'::text, 'project'::text, 'api_key'::text, 'end_user'::text]))),
    CONSTRAINT budget_limits_scope_id CHECK (((scope = 'organization'::text) = (scope_id IS NULL)))
);

COMMENT ON TABLE llm.budget_limits IS 'The budgets llm.set_budget sets: a limit and thresholds per (organization, scope, scope id or ''*'', window); listed by llm.budgets.';

COMMENT ON COLUMN llm.budget_limits.stripes IS 'Over how many stripes the counters of this budget spread (llm.set_budget_stripes; NULL: 1).';

CREATE VIEW llm.budget_usage WITH (security_invoker='true') AS
 SELECT c.organization_id,
    c.scope,
    c.scope_id,
    c.budget_window,
    c.window_start,
    COALESCE(own.limit_credits, dflt.limit_credits) AS limit_credits,
    c.used_credits,
    c.held_credits,
    c.used_cents,
    COALESCE(own.thresholds, dflt.thresholds) AS thresholds,
        CASE
            WHEN (own.organization_id IS NOT NULL) THEN own.scope_id
            ELSE dflt.scope_id
        END AS budget_scope_id,
    c.used_cost_nanos
   FROM ((( SELECT s.organization_id,
            s.scope,
            s.scope_id,
            s.budget_window,
            s.window_start,
            (sum(s.used_credits))::bigint AS used_credits,
            (sum(s.held_credits))::bigint AS held_credits,
            (sum(s.used_cents))::bigint AS used_cents,
            ((sum(s.used_cents) * (10000000)::numeric) + sum(s.priced_nanos)) AS used_cost_nanos
           FROM llm.budget_counters s
          GROUP BY s.organization_id, s.scope, s.scope_id, s.budget_window, s.window_start) c
     LEFT JOIN llm.budget_limits own ON (((own.organization_id = c.organization_id) AND (own.scope = c.scope) AND (own.budget_window = c.budget_window) AND (COALESCE(own.scope_id, ''::text) = COALESCE(c.scope_id, ''::text)))))
     LEFT JOIN llm.budget_limits dflt ON (((dflt.organization_id = c.organization_id) AND (dflt.scope = c.scope) AND (dflt.scope_id = '*'::text) AND (dflt.budget_window = c.budget_window))));

COMMENT ON VIEW llm.budget_usage IS 'One row per scope id and window that counted a request (the sum of its counter''s stripes), under the real id (a default budget''s rows too), with the budget that applies to it now (the id''s own, else the scope''s ''*''): its limit, thresholds and scope_id in llm.budgets (budget_scope_id; NULL columns: none), and its used cost in nanos (used_cost_nanos: used_cents * 10^7 plus the cost the book priced).';

CREATE VIEW llm.budgets WITH (security_invoker='true') AS
 SELECT b.organization_id,
    b.scope,
    b.scope_id,
    b.budget_window,
    b.limit_credits,
    b.thresholds
   FROM llm.budget_limits b;

COMMENT ON VIEW llm.budgets IS 'Every budget set with llm.set_budget (not the monthly allowance, which is in llm.organizations): ''*'' is the default of its scope.';

CREATE TABLE llm.cost_corrections (
    organization_id uuid NOT NULL,
    invocation_id uuid NOT NULL,
    seq integer NOT NULL,
    price_version_id bigint NOT NULL,
    difference_nanos bigint NOT NULL,
    corrected_at timestamp with time zone NOT NULL
);

COMMENT ON TABLE llm.cost_corrections IS 'Corrections of priced requests written by llm.reprice: a request''s cost moves by difference_nanos, priced from then on at price_version_id (its last entry, by seq, names the version in force for it); its settled row is never edited.';

CREATE TABLE llm.credit_rates (
    id bigint NOT NULL,
    organization_id uuid,
    effective_from timestamp with time zone NOT NULL,
    nanos_per_credit bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT credit_rates_nanos_per_credit_check CHECK (((nanos_per_credit >= 1) AND (nanos_per_credit <= '1000000000000000'::bigint)))
);

COMMENT ON TABLE llm.credit_rates IS 'What one credit is worth in nanos of the book''s currency from effective_from on, for the book (organization_id NULL) or one organization; never updated.';

ALTER TABLE llm.credit_rates ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME llm.credit_rates_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE llm.daily_usage (
    organization_id uuid NOT NULL,
    day date NOT NULL,
    model text NOT NULL,
    requests bigint NOT NULL,
    recovered_requests bigint NOT NULL,
    credits llm.total NOT NULL,
    cents llm.total NOT NULL,
    input_tokens llm.total NOT NULL,
    output_tokens llm.total NOT NULL,
    priced_nanos numeric,
    uncosted_requests bigint,
    fallback_requests bigint,
    corrections_nanos numeric
);

COMMENT ON TABLE llm.daily_usage IS 'Terminal invocations aggregated by UTC settlement day and model; rebuilt idempotently by rebuild_daily_usage.';

COMMENT ON COLUMN llm.daily_usage.priced_nanos IS 'The cost (nanos) of the day''s requests priced from usage, as first priced (their corrections: corrections_nanos; NULL: 0).';

COMMENT ON COLUMN llm.daily_usage.uncosted_requests IS 'The day''s requests with no money figure (recovered at their estimate): in no cost sum (NULL: a row built before 0.4.0).';

COMMENT ON COLUMN llm.daily_usage.fallback_requests IS 'The day''s requests the book priced at the fallback price (''*''): their model has no price of its own (NULL: 0).';

COMMENT ON COLUMN llm.daily_usage.corrections_nanos IS 'The corrections llm.reprice applied to the day''s requests (signed nanos): the day''s corrected cost is cents * 10^7 + priced_nanos + corrections_nanos (NULL: 0).';

CREATE TABLE llm.drift_findings (
    organization_id uuid NOT NULL,
    execution_id uuid NOT NULL,
    recorded_request_count bigint NOT NULL,
    recorded_credits llm.total NOT NULL,
    recorded_cents llm.total NOT NULL,
    settled_request_count bigint NOT NULL,
    settled_credits llm.total NOT NULL,
    settled_cents llm.total NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    last_run_id uuid
);

COMMENT ON TABLE llm.drift_findings IS 'Executions whose recorded totals disagree with their terminal invocations; refreshed each pass, never repaired.';

CREATE TABLE llm.executions (
    organization_id uuid NOT NULL,
    id uuid NOT NULL,
    task_key text NOT NULL,
    subject_type text,
    subject_id text,
    replay_key text,
    status llm.execution_status DEFAULT 'running'::text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    ended_at timestamp with time zone,
    duration_ms llm.amount,
    request_count llm.amount DEFAULT 0 NOT NULL,
    credits llm.total DEFAULT 0 NOT NULL,
    cents llm.total DEFAULT 0 NOT NULL,
    error text,
    priced_nanos numeric,
    CONSTRAINT executions_check CHECK ((((status)::text = 'running'::text) = (ended_at IS NULL))),
    CONSTRAINT executions_check1 CHECK ((((status)::text <> 'abandoned'::text) OR (duration_ms IS NULL)))
);

COMMENT ON TABLE llm.executions IS 'Tasks grouping invocations: running -> completed | failed | abandoned; totals grow with every terminal invocation.';

COMMENT ON COLUMN llm.executions.priced_nanos IS 'The cost (nanos) of the task''s requests priced from usage, corrections included; its cost is cents * 10^7 + priced_nanos (NULL: 0).';

CREATE VIEW llm.ledger AS
 SELECT i.organization_id,
    i.id AS invocation_id,
    (e.entry)::llm.ledger_entry AS entry,
    i.period_start,
    e.credits,
    e.cents,
    e.recorded_at
   FROM (llm.invocations i
     CROSS JOIN LATERAL ( VALUES ('hold'::text,(i.hold_credits)::bigint,NULL::bigint,i.created_at,true), ('release'::text,(i.hold_credits)::bigint,NULL::bigint,i.settled_at,(i.settled_at IS NOT NULL)), ('charge'::text,(COALESCE(i.recovered_credits, i.charged_credits))::bigint,
                CASE
                    WHEN (i.recovered_credits IS NULL) THEN (i.charged_cents)::bigint
                    ELSE NULL::bigint
                END,i.settled_at,((i.settled_at IS NOT NULL) AND (((COALESCE(i.recovered_credits, i.charged_credits))::bigint > 0) OR ((i.recovered_credits IS NULL) AND (COALESCE((i.charged_cents)::bigint, (0)::bigint) > 0))))), ('adjustment'::text,((i.charged_credits)::bigint - (i.recovered_credits)::bigint),(i.charged_cents)::bigint,i.late_reported_at,(NOT ((i.settlement_kind)::text IS DISTINCT FROM 'trued_up'::text)))) e(entry, credits, cents, recorded_at, present))
  WHERE e.present;

COMMENT ON VIEW llm.ledger IS 'The credit ledger, derived from the requests: one hold, one release, at most one charge and at most one adjustment (a true-up, signed) per request, with amounts and times.';

CREATE TABLE llm.period_findings (
    organization_id uuid NOT NULL,
    period_start date NOT NULL,
    recorded_used_credits bigint NOT NULL,
    computed_used_credits bigint NOT NULL,
    recorded_used_cents bigint NOT NULL,
    computed_used_cents bigint NOT NULL,
    recorded_held_credits bigint NOT NULL,
    computed_held_credits bigint NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    resolved_at timestamp with time zone,
    last_run_id uuid
);

COMMENT ON TABLE llm.period_findings IS 'Periods whose counters (used credits, used cents, held credits) disagreed with their requests when the pass audited them; reported, never repaired; resolved_at once they agree again.';

CREATE VIEW llm.periods AS
 SELECT h.organization_id,
    h.period_start,
    h.period_end,
    h.allowance_credits,
    (sum((s.used_credits)::bigint))::bigint AS used_credits,
    (sum((s.held_credits)::bigint))::bigint AS held_credits,
    (sum((s.used_cents)::bigint))::bigint AS used_cents,
    ((sum((s.used_cents)::bigint) * (10000000)::numeric) + sum(s.priced_nanos)) AS used_cost_nanos
   FROM (llm.period_heads h
     JOIN llm.period_stripes s ON (((s.organization_id = h.organization_id) AND (s.period_start = h.period_start))))
  GROUP BY h.organization_id, h.period_start, h.period_end, h.allowance_credits;

COMMENT ON VIEW llm.periods IS 'One calendar month (UTC) of an organization: allowance, used and held credits, used cents (the sums of its stripes).';

CREATE TABLE llm.price_versions (
    id bigint NOT NULL,
    model text NOT NULL,
    organization_id uuid,
    effective_from timestamp with time zone NOT NULL,
    currency text NOT NULL,
    rates jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    unit_nanos jsonb,
    CONSTRAINT price_versions_currency_check CHECK ((currency ~ '^[A-Z]{3}$'::text)),
    CONSTRAINT price_versions_model_check CHECK (((model <> ''::text) AND (length(model) <= 200))),
    CONSTRAINT price_versions_rates_check CHECK ((jsonb_typeof(rates) = 'object'::text)),
    CONSTRAINT price_versions_unit_nanos_check CHECK ((jsonb_typeof(unit_nanos) = 'object'::text))
);

COMMENT ON TABLE llm.price_versions IS 'The price book: a model''s rates from effective_from on, for the book (organization_id NULL) or one organization; never updated. Listed by llm.prices.';

COMMENT ON COLUMN llm.price_versions.rates IS 'Rates per million tokens of each class (per call for requests), exact JSON numbers, and optional tiers [{above_prompt_tokens, class: rate ...}] in ascending order.';

COMMENT ON COLUMN llm.price_versions.unit_nanos IS 'The base rates as nanos per token of each class (reasoning at the output rate unless priced; requests per call, 0 unless priced; 10^30 for a class with no rate); NULL for a version with tiers. Derived from rates by llm._unit_nanos.';

ALTER TABLE llm.price_versions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME llm.price_versions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE VIEW llm.prices WITH (security_invoker='true') AS
 SELECT v.id,
    v.model,
    v.organization_id,
    v.effective_from,
    v.currency,
    v.rates
   FROM llm.price_versions v;

COMMENT ON VIEW llm.prices IS 'Every price version: model (''*'': the fallback), organization (NULL: the book''s), from when, currency and rates per million tokens (per call for requests).';

CREATE TABLE llm.sweep_totals (
    organization_id uuid NOT NULL,
    recovered_requests bigint DEFAULT 0 NOT NULL,
    recovered_uncharged bigint DEFAULT 0 NOT NULL,
    past_window_alerts bigint DEFAULT 0 NOT NULL,
    audited_at timestamp with time zone,
    audit_due_at timestamp with time zone,
    updated_at timestamp with time zone
);

COMMENT ON TABLE llm.sweep_totals IS 'Per organization, written by its sweeps (the pass''s and direct reconcile_org calls alike): monotonic totals of requests recovered, of those charged nothing, and of past-window alerts; and when its periods were last audited and are due again.';

CREATE VIEW llm.sweep_summary AS
 SELECT t.recovered_requests,
    t.recovered_uncharged,
    t.past_window_alerts,
    f.period_findings
   FROM (( SELECT (COALESCE(sum(s.recovered_requests), (0)::numeric))::bigint AS recovered_requests,
            (COALESCE(sum(s.recovered_uncharged), (0)::numeric))::bigint AS recovered_uncharged,
            (COALESCE(sum(s.past_window_alerts), (0)::numeric))::bigint AS past_window_alerts
           FROM llm.sweep_totals s) t
     CROSS JOIN ( SELECT count(*) AS period_findings
           FROM llm.period_findings p
          WHERE (p.resolved_at IS NULL)) f);

COMMENT ON VIEW llm.sweep_summary IS 'One row: requests recovered (and of them, charged nothing) and past-window alerts by every sweep, ever, and the period findings not yet resolved.';

CREATE TABLE llm.task_kinds (
    key text NOT NULL,
    description text,
    declared_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT task_kinds_key_check CHECK (((key <> ''::text) AND (length(key) <= 200)))
);

COMMENT ON TABLE llm.task_kinds IS 'The declared task catalog; executions may only open declared keys.';

CREATE TABLE llm.threshold_notices (
    organization_id uuid NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    period_start date NOT NULL,
    threshold_pct integer NOT NULL,
    crossed_at timestamp with time zone NOT NULL,
    used_credits bigint NOT NULL,
    allowance_credits bigint NOT NULL,
    status text DEFAULT 'owed'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    next_attempt_at timestamp with time zone NOT NULL,
    claimed_at timestamp with time zone,
    sent_at timestamp with time zone,
    claim_token uuid,
    scope text DEFAULT 'organization'::text NOT NULL,
    scope_id text,
    budget_window text DEFAULT 'month'::text NOT NULL,
    window_start date,
    limit_credits bigint,
    CONSTRAINT threshold_notices_names CHECK (((NOT (window_start IS DISTINCT FROM period_start)) AND (NOT (limit_credits IS DISTINCT FROM allowance_credits)))),
    CONSTRAINT threshold_notices_status_check CHECK ((status = ANY (ARRAY['owed'::text, 'sending'::text, 'sent'::text]))),
    CONSTRAINT threshold_notices_threshold_pct_check CHECK ((threshold_pct >= 0))
);

COMMENT ON TABLE llm.threshold_notices IS 'One notice per (organization, period, threshold) crossed: owed -> sending -> sent, with retries and backoff.';

COMMENT ON COLUMN llm.threshold_notices.threshold_pct IS 'The whole percentage of the limit crossed by used credits; 0: the limit reached, a notice of the first refusal of its window (llm.note_refusal).';

COMMENT ON COLUMN llm.threshold_notices.claim_token IS 'The live claim''s token while sending (claim_notices returns it; complete_notice, fail_notice and release_notice need it); NULL when owed or sent.';

COMMENT ON COLUMN llm.threshold_notices.scope IS 'organization for the allowance and the organization''s day and week budgets; else the budget''s scope.';

COMMENT ON COLUMN llm.threshold_notices.scope_id IS 'The real id the budget counted (never ''*''); NULL for the organization scope.';

COMMENT ON COLUMN llm.threshold_notices.window_start IS 'The first day of the window the notice is for: the month of the allowance, a budget''s day, week or month. The same as period_start, its name until 0.4.0.';

COMMENT ON COLUMN llm.threshold_notices.limit_credits IS 'The limit whose threshold was crossed: the monthly allowance, or the budget''s limit. The same as allowance_credits, its name until 0.4.0.';

CREATE TABLE llm.upgrade_steps (
    step text NOT NULL,
    finished_at timestamp with time zone NOT NULL
);

COMMENT ON TABLE llm.upgrade_steps IS 'The contract steps migrate has finished (migrations/contract/), and the marks they leave for the functions: only what this release''s functions wrote is in the books.';

ALTER TABLE ONLY llm.budget_counters
    ADD CONSTRAINT budget_counters_pkey PRIMARY KEY (organization_id, id);

ALTER TABLE ONLY llm.budget_horizons
    ADD CONSTRAINT budget_horizons_pkey PRIMARY KEY (organization_id);

ALTER TABLE ONLY llm.budget_limits
    ADD CONSTRAINT budget_limits_key UNIQUE NULLS NOT DISTINCT (organization_id, scope, scope_id, budget_window);

ALTER TABLE ONLY llm.budget_limits
    ADD CONSTRAINT budget_limits_pkey PRIMARY KEY (organization_id, id);

ALTER TABLE ONLY llm.cost_corrections
    ADD CONSTRAINT cost_corrections_pkey PRIMARY KEY (organization_id, invocation_id, seq);

ALTER TABLE ONLY llm.credit_rates
    ADD CONSTRAINT credit_rates_key UNIQUE NULLS NOT DISTINCT (organization_id, effective_from);

ALTER TABLE ONLY llm.credit_rates
    ADD CONSTRAINT credit_rates_pkey PRIMARY KEY (id);

ALTER TABLE ONLY llm.daily_usage
    ADD CONSTRAINT daily_usage_pkey PRIMARY KEY (organization_id, day, model);

ALTER TABLE ONLY llm.drift_findings
    ADD CONSTRAINT drift_findings_pkey PRIMARY KEY (organization_id, execution_id);

ALTER TABLE ONLY llm.executions
    ADD CONSTRAINT executions_pkey PRIMARY KEY (organization_id, id);

ALTER TABLE ONLY llm.invocation_scopes
    ADD CONSTRAINT invocation_scopes_pkey PRIMARY KEY (organization_id, invocation_id);

ALTER TABLE ONLY llm.invocations
    ADD CONSTRAINT invocations_pkey PRIMARY KEY (organization_id, id);

ALTER TABLE ONLY llm.organizations
    ADD CONSTRAINT organizations_pkey PRIMARY KEY (id);

ALTER TABLE ONLY llm.pass_lease
    ADD CONSTRAINT pass_lease_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY llm.period_findings
    ADD CONSTRAINT period_findings_pkey PRIMARY KEY (organization_id, period_start);

ALTER TABLE ONLY llm.period_stripes
    ADD CONSTRAINT period_stripes_pkey PRIMARY KEY (organization_id, period_start, stripe);

ALTER TABLE ONLY llm.period_heads
    ADD CONSTRAINT periods_pkey PRIMARY KEY (organization_id, period_start);

ALTER TABLE ONLY llm.price_versions
    ADD CONSTRAINT price_versions_key UNIQUE NULLS NOT DISTINCT (model, organization_id, effective_from);

ALTER TABLE ONLY llm.price_versions
    ADD CONSTRAINT price_versions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY llm.reconciliation_runs
    ADD CONSTRAINT reconciliation_runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY llm.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY llm.sweep_totals
    ADD CONSTRAINT sweep_totals_pkey PRIMARY KEY (organization_id);

ALTER TABLE ONLY llm.task_kinds
    ADD CONSTRAINT task_kinds_pkey PRIMARY KEY (key);

ALTER TABLE ONLY llm.threshold_notices
    ADD CONSTRAINT threshold_notices_pkey PRIMARY KEY (organization_id, id);

ALTER TABLE ONLY llm.upgrade_steps
    ADD CONSTRAINT upgrade_steps_pkey PRIMARY KEY (step);

CREATE UNIQUE INDEX budget_counters_stripe_key ON llm.budget_counters USING btree (organization_id, scope, scope_id, budget_window, window_start, stripe) NULLS NOT DISTINCT;

CREATE INDEX daily_usage_day ON llm.daily_usage USING btree (day);

CREATE INDEX executions_closed ON llm.executions USING btree (organization_id, ended_at) WHERE ((status)::text <> 'running'::text);

CREATE UNIQUE INDEX executions_replay_key ON llm.executions USING btree (organization_id, replay_key) WHERE (replay_key IS NOT NULL);

CREATE INDEX executions_running ON llm.executions USING btree (organization_id, started_at) WHERE ((status)::text = 'running'::text);

CREATE INDEX invocations_created ON llm.invocations USING btree (organization_id, created_at);

CREATE INDEX invocations_execution ON llm.invocations USING btree (organization_id, execution_id) WHERE (execution_id IS NOT NULL);

CREATE INDEX period_findings_open ON llm.period_findings USING btree (organization_id) WHERE (resolved_at IS NULL);

CREATE INDEX period_stripes_open ON llm.period_stripes USING btree (organization_id) WHERE (quiet IS NOT TRUE);

CREATE INDEX period_stripes_settled ON llm.period_stripes USING btree ((((period_start + 32) + ((COALESCE(settle_lag_hours, 0) + 23) / 24))));

CREATE INDEX reconciliation_runs_started ON llm.reconciliation_runs USING btree (started_at DESC);

CREATE UNIQUE INDEX threshold_notices_key ON llm.threshold_notices USING btree (organization_id, scope, scope_id, budget_window, period_start, threshold_pct) NULLS NOT DISTINCT;

CREATE INDEX threshold_notices_owed ON llm.threshold_notices USING btree (next_attempt_at, crossed_at) WHERE (status = 'owed'::text);

CREATE INDEX threshold_notices_sending ON llm.threshold_notices USING btree (claimed_at) WHERE (status = 'sending'::text);

ALTER TABLE ONLY llm.drift_findings
    ADD CONSTRAINT drift_findings_organization_id_execution_id_fkey FOREIGN KEY (organization_id, execution_id) REFERENCES llm.executions(organization_id, id);

ALTER TABLE ONLY llm.executions
    ADD CONSTRAINT executions_organization_id_fkey FOREIGN KEY (organization_id) REFERENCES llm.organizations(id);

ALTER TABLE ONLY llm.executions
    ADD CONSTRAINT executions_task_key_fkey FOREIGN KEY (task_key) REFERENCES llm.task_kinds(key);

ALTER TABLE ONLY llm.period_stripes
    ADD CONSTRAINT period_stripes_organization_id_period_start_fkey FOREIGN KEY (organization_id, period_start) REFERENCES llm.period_heads(organization_id, period_start);

ALTER TABLE ONLY llm.period_heads
    ADD CONSTRAINT periods_organization_id_fkey FOREIGN KEY (organization_id) REFERENCES llm.organizations(id);

GRANT USAGE ON SCHEMA llm TO llm_app;
GRANT USAGE ON SCHEMA llm TO llm_operator;
GRANT USAGE ON SCHEMA llm TO llm_reader;

REVOKE ALL ON FUNCTION llm._abandon_stale_tasks(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._add_stripes(p_organization_id uuid, p_period_start date, p_stripes integer) FROM PUBLIC;

GRANT SELECT ON TABLE llm.invocations TO llm_reader;
GRANT SELECT ON TABLE llm.invocations TO llm_operator;

REVOKE ALL ON FUNCTION llm._admission(p_inv llm.invocations, p_replayed boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._admit_invocation(p_organization_id uuid, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_invocation_id uuid, p_now timestamp with time zone, p_project text, p_api_key text, p_end_user text, p_input_tokens bigint, p_max_output_tokens bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._allowances_near_limit(p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._amount_ok(p_value bigint, p_nullable boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._apply_to_periods(p_organization_id uuid, p_allowance bigint, p_thresholds integer[], p_every_period boolean, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._audit_budgets(p_organization_id uuid, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._audit_org(p_organization_id uuid, p_now timestamp with time zone, p_run_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._audits_due(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._audits_due(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm._begin_run(p_now timestamp with time zone, OUT run_id uuid, OUT token uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._begin_run(p_now timestamp with time zone, OUT run_id uuid, OUT token uuid) TO llm_operator;

REVOKE ALL ON FUNCTION llm._book_true_up(p_inv llm.invocations, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._bound_locks() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budget_keys(p_mask integer, p_project text, p_api_key text, p_end_user text, p_at timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budget_reached(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budget_scopes() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budget_slot(p_scope text, p_window text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budget_terms(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, OUT limit_credits bigint, OUT thresholds integer[], OUT revision uuid, OUT stripes integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budget_windows() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budgets_changed(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._budgets_revision(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_amount(p_name text, p_value bigint, p_nullable boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_call(p_organization_id uuid, p_now timestamp with time zone, p_what text, p_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_claim(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_clock(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._check_clock(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm._check_day_range(p_from date, p_to date) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_deadline(p_organization_id uuid, p_deadline timestamp with time zone, p_step text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_estimate_source(p_estimate_credits bigint, p_input_tokens bigint, p_max_output_tokens bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_report_scope(p_scope text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_retry(p_message text, p_format text, p_stored text[], p_given text[], p_hint text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_scope_and_window(p_scope text, p_window text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_scope_id(p_name text, p_value text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_stripes(p_stripes integer, p_whose text, p_hint text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_text(p_name text, p_value text, p_max integer, p_nullable boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_thresholds(p_thresholds integer[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._check_usage(p_usage jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._class_cost(p_rates jsonb, p_tier jsonb, p_usage jsonb, p_class text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._clock_ok(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._clock_ok(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm._close_execution(p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._correct_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripe smallint, p_difference bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._cost_metrics(p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._create_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer, p_limit bigint, p_revision uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._credits_of(p_cost_nanos bigint, p_nanos_per_credit bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._cron_job_seen() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._end_claim(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_end text, p_error text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._end_invocation(p_organization_id uuid, p_invocation_id uuid, p_status text, p_error text, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone, p_price llm.priced_usage) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._ensure_period(p_organization_id uuid, p_period_start date) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._estimate_usage(p_input_tokens bigint, p_max_output_tokens bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._exact_rate(p_model text, p_where text, p_value jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._exact_rates(p_model text, p_where text, p_rates jsonb, p_extra text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._fail_invocation(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_now timestamp with time zone, p_usage jsonb) FROM PUBLIC;

GRANT SELECT ON TABLE llm.reconciliation_runs TO llm_reader;
GRANT SELECT ON TABLE llm.reconciliation_runs TO llm_operator;

REVOKE ALL ON FUNCTION llm._finish_run(p_run_id uuid, p_token uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._finish_run(p_run_id uuid, p_token uuid) TO llm_operator;

REVOKE ALL ON FUNCTION llm._full_usage(p_usage jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._functions_only() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._hours_up(p_span interval) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_1() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_10() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_11() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_12() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_13() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_14() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_15() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_16() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_17() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_18() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_19() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_2() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_20() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_21() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_2b() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_3() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_4() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_4b() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_5() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_5b() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_6() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_7() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_8() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._invariant_9() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._kept_finding(p_finding text, p_last_seen_at timestamp with time zone, p_subject text, p_subject_exists boolean, p_figures text) FROM PUBLIC;

GRANT SELECT ON TABLE llm.pass_lease TO llm_reader;
GRANT SELECT ON TABLE llm.pass_lease TO llm_operator;

REVOKE ALL ON FUNCTION llm._lease_holder_running(p_lease llm.pass_lease) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._lease_locker_pid() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._lock_budgets_of(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._lock_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, OUT stripes integer, OUT used bigint, OUT held bigint, OUT cents bigint) FROM PUBLIC;

GRANT SELECT ON TABLE llm.period_heads TO llm_reader;
GRANT SELECT ON TABLE llm.period_heads TO llm_operator;

REVOKE ALL ON FUNCTION llm._lock_period(p_organization_id uuid, p_period_start date) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._lock_sweep_of(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._mask_elements(p_of integer, p_mask integer, p_values anyarray) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._max_amount() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._max_sum() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._may_cross(p_old_used bigint, p_new_used bigint, p_allowance bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._move_budgets(p_organization_id uuid, p_invs llm.invocations[], p_true_up boolean, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._move_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_seeds smallint[], p_used bigint[], p_held bigint[], p_cents bigint[], p_priced bigint[], p_admit_limit bigint, p_admit_revision uuid, p_epoch uuid, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._move_request_counters(p_organization_id uuid, p_mask integer, p_project text, p_api_key text, p_end_user text, p_created_at timestamp with time zone, p_budget_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_admit_limits bigint[], p_admit_revisions uuid[], p_epoch uuid, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._move_stripe(p_organization_id uuid, p_period_start date, p_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_now timestamp with time zone, p_open integer, p_admitted_at timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._move_within_counter_room(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripe integer, p_off_zero boolean, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_epoch uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._move_within_rooms(p_organization_id uuid, p_period_start date, p_stripe smallint, p_used bigint, p_held bigint, p_cents bigint, p_priced bigint, p_open integer, p_now timestamp with time zone, p_lag integer, p_lead integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._named_scopes_mask(p_project text, p_api_key text, p_end_user text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._normalized_rates(p_model text, p_rates jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._note_refusal(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._notify_notices_owed(p_reason text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._open_execution(p_organization_id uuid, p_task_key text, p_subject_type text, p_subject_id text, p_replay_key text, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._open_floor(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._open_since(p_open_requests integer, p_open_since timestamp with time zone, p_open integer, p_at timestamp with time zone) FROM PUBLIC;

GRANT SELECT ON TABLE llm.organizations TO llm_reader;
GRANT SELECT ON TABLE llm.organizations TO llm_operator;

REVOKE ALL ON FUNCTION llm._operational_org(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._organization_settings(p_org llm.organizations) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._owe_notices(p_organization_id uuid, p_period_start date, p_thresholds integer[], p_used bigint, p_allowance bigint, p_now timestamp with time zone, p_scope text, p_scope_id text, p_window text, p_old_used bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._own_budget_ids(p_organization_id uuid, p_scope text, p_window text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._pass_metrics(p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._pass_organizations() FROM PUBLIC;
GRANT ALL ON FUNCTION llm._pass_organizations() TO llm_operator;

REVOKE ALL ON FUNCTION llm._period_start(p_at timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._price_classes() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._price_in_force(p_organization_id uuid, p_model text, p_at timestamp with time zone, OUT price_version_id bigint, OUT rates jsonb, OUT fallback boolean, OUT credit_rate_id bigint, OUT nanos_per_credit bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._price_request(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._price_tier(p_rates jsonb, p_usage jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._quote(p_organization_id uuid, p_model text, p_usage jsonb, p_at timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._raise_bad_price(p_model text, p_what text, p_detail text, p_hint text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._raise_open_floors(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._raise_price_missing(p_organization_id uuid, p_model text, p_at timestamp with time zone, p_what text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._raise_unknown_execution(p_organization_id uuid, p_execution_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._raise_unknown_invocation(p_organization_id uuid, p_invocation_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._raise_unknown_org(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._rebuild_days(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._rebuild_days(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm._reconcile_org(p_organization_id uuid, p_now timestamp with time zone, p_batch integer, p_run_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._record_crossings(p_organization_id uuid, p_period_start date, p_old_used bigint, p_new_used bigint, p_allowance bigint, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._record_reached(p_organization_id uuid, p_period_start date, p_thresholds integer[], p_allowance bigint, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._recover_stranded(p_organization_id uuid, p_now timestamp with time zone, p_cutoff timestamp with time zone, p_batch integer, p_recovery_charge text, INOUT p_sweep llm.org_sweep) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._refresh_drift(p_organization_id uuid, p_now timestamp with time zone, p_since timestamp with time zone, p_run_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._refuse_sum(p_table text, p_column text, p_sum numeric, p_subject text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._renew_lease(p_run_id uuid, p_token uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._reprice_org(p_organization_id uuid, p_model text, p_from timestamp with time zone, p_to timestamp with time zone, p_version_id bigint, p_apply boolean, OUT requests bigint, OUT cost_before_nanos numeric, OUT cost_after_nanos numeric) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._require_cron(p_schedule text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._require_notice(p_organization_id uuid, p_notice_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._require_org_id(p_organization_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._require_price(p_organization_id uuid, p_model text, p_at timestamp with time zone, p_price_version_id bigint, p_credit_rate_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._restripe_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._retain_budgets(p_organization_id uuid, p_now timestamp with time zone, p_retention interval) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._retried_estimate(p_inv llm.invocations, p_estimate_credits bigint, p_priced_estimate jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._run_audit(p_run_id uuid, p_organization_id uuid, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._run_audit(p_run_id uuid, p_organization_id uuid, p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm._run_followup(p_run_id uuid, p_token uuid, p_step text, p_now timestamp with time zone, p_day date) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._run_followup(p_run_id uuid, p_token uuid, p_step text, p_now timestamp with time zone, p_day date) TO llm_operator;

REVOKE ALL ON FUNCTION llm._run_org(p_run_id uuid, p_token uuid, p_organization_id uuid, p_now timestamp with time zone, p_batch integer) FROM PUBLIC;
GRANT ALL ON FUNCTION llm._run_org(p_run_id uuid, p_token uuid, p_organization_id uuid, p_now timestamp with time zone, p_batch integer) TO llm_operator;

REVOKE ALL ON FUNCTION llm._same_admission(p_inv llm.invocations, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_project text, p_api_key text, p_end_user text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._same_settlement(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_usage jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._scope_id_ok(p_value text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._set_allowance(p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._set_budget(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint, p_thresholds integer[], p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._set_budget_stripes(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._set_period_stripes(p_organization_id uuid, p_stripes integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._set_recovery_policy(p_organization_id uuid, p_recovery_charge text, p_late_settlement text) FROM PUBLIC;

GRANT SELECT ON TABLE llm.settings TO llm_reader;
GRANT SELECT ON TABLE llm.settings TO llm_operator;
GRANT SELECT ON TABLE llm.settings TO llm_app;

REVOKE ALL ON FUNCTION llm._settings() FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._settle_invocation(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._settle_late(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone, p_price llm.priced_usage) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._settle_usage(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._settle_window(p_organization_id uuid, p_from date, p_to date, OUT created_from timestamp with time zone, OUT created_to timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._settled_usage(p_from date, p_to date) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._skip_run(p_now timestamp with time zone, p_lease llm.pass_lease, p_holder_pid integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._spread_counter(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_stripes integer, p_used bigint, p_held bigint, p_cents bigint, p_room_limit bigint, p_limit bigint, p_thresholds integer[], p_epoch uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._spread_rooms(p_organization_id uuid, p_period_start date, p_allowance bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._task_admits(p_organization_id uuid, p_execution_id uuid, p_invocation_id uuid, p_estimate_credits bigint, p_model text, p_project text, p_api_key text, p_end_user text) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._terminal_outcome(p_organization_id uuid, p_invocation_id uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._text_ok(p_value text, p_max integer, p_nullable boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._true_up_daily_usage(p_inv llm.invocations, p_credits bigint, p_cents bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._unit_cost(p_unit_nanos jsonb, p_usage jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._unit_estimate(p_unit_nanos jsonb, p_input bigint, p_output bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._unit_nanos(p_rates jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._upsert_organization(p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint, p_status text, p_notice_thresholds integer[], p_now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._usage_cost(p_model text, p_version_id bigint, p_rates jsonb, p_usage jsonb, p_nanos_per_credit bigint, OUT cost_nanos bigint, OUT price_tier bigint, OUT credits bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._usage_ok(p_usage jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._window_end(p_window text, p_start date) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm._window_start(p_window text, p_at timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm.admit_invocation(p_organization_id uuid, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_invocation_id uuid, p_now timestamp with time zone, p_project text, p_api_key text, p_end_user text, p_input_tokens bigint, p_max_output_tokens bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.admit_invocation(p_organization_id uuid, p_estimate_credits bigint, p_model text, p_execution_id uuid, p_invocation_id uuid, p_now timestamp with time zone, p_project text, p_api_key text, p_end_user text, p_input_tokens bigint, p_max_output_tokens bigint) TO llm_app;

REVOKE ALL ON FUNCTION llm.books_history(p_organization_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.books_history(p_organization_ids uuid[]) TO llm_reader;
GRANT ALL ON FUNCTION llm.books_history(p_organization_ids uuid[]) TO llm_operator;

REVOKE ALL ON FUNCTION llm.books_snapshot(p_organization_ids uuid[], p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.books_snapshot(p_organization_ids uuid[], p_now timestamp with time zone) TO llm_reader;
GRANT ALL ON FUNCTION llm.books_snapshot(p_organization_ids uuid[], p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.check_daily_usage(p_from date, p_to date) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.check_daily_usage(p_from date, p_to date) TO llm_operator;

REVOKE ALL ON FUNCTION llm.check_invariants() FROM PUBLIC;
GRANT ALL ON FUNCTION llm.check_invariants() TO llm_operator;

REVOKE ALL ON FUNCTION llm.claim_notices(p_limit integer, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.claim_notices(p_limit integer, p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.close_execution(p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.close_execution(p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text, p_now timestamp with time zone) TO llm_app;

REVOKE ALL ON FUNCTION llm.complete_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.complete_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.declare_task_kind(p_key text, p_description text) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.declare_task_kind(p_key text, p_description text) TO llm_operator;

REVOKE ALL ON FUNCTION llm.distribute(p_shard_count integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION llm.fail_invocation(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_now timestamp with time zone, p_usage jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.fail_invocation(p_organization_id uuid, p_invocation_id uuid, p_error text, p_credits bigint, p_cents bigint, p_now timestamp with time zone, p_usage jsonb) TO llm_app;

REVOKE ALL ON FUNCTION llm.fail_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_error text, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.fail_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_error text, p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.last_run(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.last_run(p_now timestamp with time zone) TO llm_reader;
GRANT ALL ON FUNCTION llm.last_run(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.mark_dispatched(p_organization_id uuid, p_invocation_id uuid, p_now timestamp with time zone) TO llm_app;

REVOKE ALL ON FUNCTION llm.metrics(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.metrics(p_now timestamp with time zone) TO llm_reader;
GRANT ALL ON FUNCTION llm.metrics(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.note_refusal(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.note_refusal(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_window_start date, p_now timestamp with time zone) TO llm_app;

REVOKE ALL ON FUNCTION llm.open_execution(p_organization_id uuid, p_task_key text, p_subject_type text, p_subject_id text, p_replay_key text, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.open_execution(p_organization_id uuid, p_task_key text, p_subject_type text, p_subject_id text, p_replay_key text, p_now timestamp with time zone) TO llm_app;

REVOKE ALL ON FUNCTION llm.organization_totals(p_organization_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.organization_totals(p_organization_ids uuid[]) TO llm_reader;
GRANT ALL ON FUNCTION llm.organization_totals(p_organization_ids uuid[]) TO llm_operator;

REVOKE ALL ON FUNCTION llm.pass_progress(p_since timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.pass_progress(p_since timestamp with time zone) TO llm_reader;
GRANT ALL ON FUNCTION llm.pass_progress(p_since timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.price_usage(p_model text, p_usage jsonb, p_organization_id uuid, p_at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.price_usage(p_model text, p_usage jsonb, p_organization_id uuid, p_at timestamp with time zone) TO llm_app;

REVOKE ALL ON FUNCTION llm.rearm_notices(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.rearm_notices(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.rebuild_daily_usage(p_from date, p_to date) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.rebuild_daily_usage(p_from date, p_to date) TO llm_operator;

REVOKE ALL ON FUNCTION llm.reconcile_org(p_organization_id uuid, p_now timestamp with time zone, p_batch integer, p_run_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.reconcile_org(p_organization_id uuid, p_now timestamp with time zone, p_batch integer, p_run_id uuid) TO llm_operator;

REVOKE ALL ON FUNCTION llm.reconciliation_health(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.reconciliation_health(p_now timestamp with time zone) TO llm_operator;
GRANT ALL ON FUNCTION llm.reconciliation_health(p_now timestamp with time zone) TO llm_reader;

REVOKE ALL ON FUNCTION llm.release_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.release_notice(p_organization_id uuid, p_notice_id uuid, p_claim_token uuid, p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.report_budgets_near_limit(p_scope text, p_organization_ids uuid[], p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.report_budgets_near_limit(p_scope text, p_organization_ids uuid[], p_now timestamp with time zone) TO llm_reader;
GRANT ALL ON FUNCTION llm.report_budgets_near_limit(p_scope text, p_organization_ids uuid[], p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.report_costs(p_from date, p_to date, p_organization_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.report_costs(p_from date, p_to date, p_organization_ids uuid[]) TO llm_reader;
GRANT ALL ON FUNCTION llm.report_costs(p_from date, p_to date, p_organization_ids uuid[]) TO llm_operator;

REVOKE ALL ON FUNCTION llm.report_daily_usage(p_from date, p_to date, p_organization_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.report_daily_usage(p_from date, p_to date, p_organization_ids uuid[]) TO llm_reader;
GRANT ALL ON FUNCTION llm.report_daily_usage(p_from date, p_to date, p_organization_ids uuid[]) TO llm_operator;

REVOKE ALL ON FUNCTION llm.report_open_holds(p_organization_ids uuid[], p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.report_open_holds(p_organization_ids uuid[], p_now timestamp with time zone) TO llm_reader;
GRANT ALL ON FUNCTION llm.report_open_holds(p_organization_ids uuid[], p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.report_periods(p_from date, p_to date, p_organization_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.report_periods(p_from date, p_to date, p_organization_ids uuid[]) TO llm_reader;
GRANT ALL ON FUNCTION llm.report_periods(p_from date, p_to date, p_organization_ids uuid[]) TO llm_operator;

REVOKE ALL ON FUNCTION llm.report_scope_usage(p_scope text, p_from date, p_to date, p_organization_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.report_scope_usage(p_scope text, p_from date, p_to date, p_organization_ids uuid[]) TO llm_reader;
GRANT ALL ON FUNCTION llm.report_scope_usage(p_scope text, p_from date, p_to date, p_organization_ids uuid[]) TO llm_operator;

REVOKE ALL ON FUNCTION llm.report_tasks(p_from date, p_organization_ids uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.report_tasks(p_from date, p_organization_ids uuid[]) TO llm_reader;
GRANT ALL ON FUNCTION llm.report_tasks(p_from date, p_organization_ids uuid[]) TO llm_operator;

REVOKE ALL ON FUNCTION llm.reprice(p_model text, p_from timestamp with time zone, p_to timestamp with time zone, p_version_id bigint, p_apply boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.reprice(p_model text, p_from timestamp with time zone, p_to timestamp with time zone, p_version_id bigint, p_apply boolean) TO llm_operator;

REVOKE ALL ON PROCEDURE llm.run_reconciliation(IN p_now timestamp with time zone, IN p_batch integer) FROM PUBLIC;
GRANT ALL ON PROCEDURE llm.run_reconciliation(IN p_now timestamp with time zone, IN p_batch integer) TO llm_operator;

REVOKE ALL ON FUNCTION llm.schedule_reconciliation(p_schedule text) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.schedule_reconciliation(p_schedule text) TO llm_operator;

REVOKE ALL ON FUNCTION llm.set_allowance(p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.set_allowance(p_organization_id uuid, p_monthly_allowance_credits bigint, p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.set_budget(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint, p_thresholds integer[], p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.set_budget(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_limit_credits bigint, p_thresholds integer[], p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.set_budget_stripes(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.set_budget_stripes(p_organization_id uuid, p_scope text, p_scope_id text, p_window text, p_stripes integer, p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.set_credit_rate(p_nanos_per_credit bigint, p_organization_id uuid, p_effective_from timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.set_credit_rate(p_nanos_per_credit bigint, p_organization_id uuid, p_effective_from timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.set_period_stripes(p_organization_id uuid, p_stripes integer) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.set_period_stripes(p_organization_id uuid, p_stripes integer) TO llm_operator;

REVOKE ALL ON FUNCTION llm.set_price(p_model text, p_rates jsonb, p_effective_from timestamp with time zone, p_organization_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.set_price(p_model text, p_rates jsonb, p_effective_from timestamp with time zone, p_organization_id uuid) TO llm_operator;

REVOKE ALL ON FUNCTION llm.set_recovery_policy(p_organization_id uuid, p_recovery_charge text, p_late_settlement text) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.set_recovery_policy(p_organization_id uuid, p_recovery_charge text, p_late_settlement text) TO llm_operator;

REVOKE ALL ON FUNCTION llm.settle_invocation(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.settle_invocation(p_organization_id uuid, p_invocation_id uuid, p_credits bigint, p_cents bigint, p_input_tokens bigint, p_output_tokens bigint, p_now timestamp with time zone) TO llm_app;

REVOKE ALL ON FUNCTION llm.settle_usage(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.settle_usage(p_organization_id uuid, p_invocation_id uuid, p_usage jsonb, p_now timestamp with time zone) TO llm_app;

REVOKE ALL ON FUNCTION llm.stale_by_organization_status(p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.stale_by_organization_status(p_now timestamp with time zone) TO llm_reader;
GRANT ALL ON FUNCTION llm.stale_by_organization_status(p_now timestamp with time zone) TO llm_operator;

REVOKE ALL ON FUNCTION llm.unschedule_reconciliation() FROM PUBLIC;
GRANT ALL ON FUNCTION llm.unschedule_reconciliation() TO llm_operator;

REVOKE ALL ON FUNCTION llm.upsert_organization(p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint, p_status text, p_notice_thresholds integer[], p_now timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION llm.upsert_organization(p_organization_id uuid, p_name text, p_monthly_allowance_credits bigint, p_status text, p_notice_thresholds integer[], p_now timestamp with time zone) TO llm_operator;

GRANT SELECT ON TABLE llm.invocation_scopes TO llm_reader;
GRANT SELECT ON TABLE llm.invocation_scopes TO llm_operator;

GRANT SELECT ON TABLE llm.period_stripes TO llm_reader;
GRANT SELECT ON TABLE llm.period_stripes TO llm_operator;

GRANT SELECT ON TABLE llm.budget_counters TO llm_reader;
GRANT SELECT ON TABLE llm.budget_counters TO llm_operator;
GRANT SELECT ON TABLE llm.budget_counters TO llm_app;

GRANT SELECT ON TABLE llm.budget_horizons TO llm_reader;
GRANT SELECT ON TABLE llm.budget_horizons TO llm_operator;

GRANT SELECT ON TABLE llm.budget_limits TO llm_reader;
GRANT SELECT ON TABLE llm.budget_limits TO llm_operator;
GRANT SELECT ON TABLE llm.budget_limits TO llm_app;

GRANT SELECT ON TABLE llm.budget_usage TO llm_reader;
GRANT SELECT ON TABLE llm.budget_usage TO llm_operator;
GRANT SELECT ON TABLE llm.budget_usage TO llm_app;

GRANT SELECT ON TABLE llm.budgets TO llm_reader;
GRANT SELECT ON TABLE llm.budgets TO llm_operator;
GRANT SELECT ON TABLE llm.budgets TO llm_app;

GRANT SELECT ON TABLE llm.cost_corrections TO llm_reader;
GRANT SELECT ON TABLE llm.cost_corrections TO llm_operator;

GRANT SELECT ON TABLE llm.credit_rates TO llm_reader;
GRANT SELECT ON TABLE llm.credit_rates TO llm_operator;
GRANT SELECT ON TABLE llm.credit_rates TO llm_app;

GRANT SELECT ON TABLE llm.daily_usage TO llm_reader;
GRANT SELECT ON TABLE llm.daily_usage TO llm_operator;

GRANT SELECT ON TABLE llm.drift_findings TO llm_reader;
GRANT SELECT ON TABLE llm.drift_findings TO llm_operator;

GRANT SELECT ON TABLE llm.executions TO llm_reader;
GRANT SELECT ON TABLE llm.executions TO llm_operator;

GRANT SELECT ON TABLE llm.ledger TO llm_reader;
GRANT SELECT ON TABLE llm.ledger TO llm_operator;

GRANT SELECT ON TABLE llm.period_findings TO llm_reader;
GRANT SELECT ON TABLE llm.period_findings TO llm_operator;

GRANT SELECT ON TABLE llm.periods TO llm_reader;
GRANT SELECT ON TABLE llm.periods TO llm_operator;

GRANT SELECT ON TABLE llm.price_versions TO llm_reader;
GRANT SELECT ON TABLE llm.price_versions TO llm_operator;
GRANT SELECT ON TABLE llm.price_versions TO llm_app;

GRANT SELECT ON TABLE llm.prices TO llm_reader;
GRANT SELECT ON TABLE llm.prices TO llm_operator;
GRANT SELECT ON TABLE llm.prices TO llm_app;

GRANT SELECT ON TABLE llm.sweep_totals TO llm_reader;
GRANT SELECT ON TABLE llm.sweep_totals TO llm_operator;

GRANT SELECT ON TABLE llm.sweep_summary TO llm_reader;
GRANT SELECT ON TABLE llm.sweep_summary TO llm_operator;

GRANT SELECT ON TABLE llm.task_kinds TO llm_reader;
GRANT SELECT ON TABLE llm.task_kinds TO llm_operator;
GRANT SELECT ON TABLE llm.task_kinds TO llm_app;

GRANT SELECT ON TABLE llm.threshold_notices TO llm_reader;
GRANT SELECT ON TABLE llm.threshold_notices TO llm_operator;

GRANT SELECT ON TABLE llm.upgrade_steps TO llm_reader;
GRANT SELECT ON TABLE llm.upgrade_steps TO llm_operator;
