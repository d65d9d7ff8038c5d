-- The examples of the reference pages (docs/reference/), one section per public routine.
-- scripts/reference.py runs them on a freshly migrated database, as its owner: first the
-- setup, committed; then each example in a transaction of its own, rolled back, so the
-- examples do not depend on each other; the procedure that commits (run_reconciliation)
-- runs last and keeps its work. Every clock is a fixed p_now, every id is given, and the
-- examples select columns whose values do not depend on when they run, so the pages are
-- the same at every run. A section is "-- example: <routine>"; a statement ends with ";"
-- at the end of a line; a line "-- note: <text>" in a section is shown on its page as a
-- comment before the statements.

-- setup
SELECT name FROM llm.upsert_organization(
    '00000000-0000-0000-0000-00000000000a', 'acme', 10000,
    p_now => '2026-01-15 09:00+00');
SELECT llm.declare_task_kind('summarize', 'Summarize one document');
SELECT llm.set_budget('00000000-0000-0000-0000-00000000000a', 'project', 'search', 'day', 500,
    p_now => '2026-01-15 09:00+00');
SELECT status FROM llm.admit_invocation(
    '00000000-0000-0000-0000-00000000000a', 450, 'gpt-x',
    p_invocation_id => '00000000-0000-0000-0000-000000000001',
    p_now => '2026-01-15 10:00+00', p_project => 'search');
-- 420 of the project's 500: its 80% threshold is crossed, a notice is owed
SELECT llm.settle_invocation('00000000-0000-0000-0000-00000000000a',
    '00000000-0000-0000-0000-000000000001', 420, 7, p_input_tokens => 1200,
    p_output_tokens => 300, p_now => '2026-01-15 10:00:05+00');
SELECT status FROM llm.admit_invocation(
    '00000000-0000-0000-0000-00000000000a', 30, 'gpt-x',
    p_invocation_id => '00000000-0000-0000-0000-000000000002',
    p_now => '2026-01-15 11:00+00');

-- example: upsert_organization
SELECT id, name, status, monthly_allowance_credits, notice_thresholds, period_stripes
FROM llm.upsert_organization(
    '00000000-0000-0000-0000-00000000000b', 'globex', 50000,
    p_notice_thresholds => '{50,90,100}', p_now => '2026-01-15 12:00+00');

-- example: set_allowance
-- note: only the allowance changes; a suspended organization stays suspended
SELECT name, status, monthly_allowance_credits, notice_thresholds
FROM llm.set_allowance('00000000-0000-0000-0000-00000000000a', 12000, p_now => '2026-01-15 12:00+00');

-- example: set_recovery_policy
SELECT name, recovery_charge, late_settlement
FROM llm.set_recovery_policy('00000000-0000-0000-0000-00000000000a', 'dispatched', 'true_up');

-- example: set_period_stripes
SELECT llm.set_period_stripes('00000000-0000-0000-0000-00000000000a', 8);

-- example: set_budget
SELECT llm.set_budget('00000000-0000-0000-0000-00000000000a', 'end_user', '*', 'week', 2000,
    p_thresholds => '{90}', p_now => '2026-01-15 12:00+00');
SELECT scope, scope_id, budget_window, limit_credits, thresholds FROM llm.budgets
ORDER BY scope, scope_id;

-- example: set_budget_stripes
-- note: a key every worker of a service shares: its counters spread over 8 rows from now on
SELECT llm.set_budget('00000000-0000-0000-0000-00000000000a', 'api_key', 'shared-key', 'day', 100000,
    p_now => '2026-01-15 12:00+00');
SELECT llm.set_budget_stripes('00000000-0000-0000-0000-00000000000a', 'api_key', 'shared-key', 'day', 8,
    p_now => '2026-01-15 12:00+00') AS stripes;

-- example: note_refusal
-- note: after an LL001 from admit_invocation, in a transaction of its own; the driver does this
SELECT llm.note_refusal('00000000-0000-0000-0000-00000000000a', 'organization', NULL, 'month',
    '2026-01-01', p_now => '2026-01-15 12:00+00') AS first_report,
       llm.note_refusal('00000000-0000-0000-0000-00000000000a', 'organization', NULL, 'month',
    '2026-01-01', p_now => '2026-01-15 12:00+00') AS again;

-- example: declare_task_kind
SELECT llm.declare_task_kind('translate', 'Translate one document');
SELECT key, description FROM llm.task_kinds ORDER BY key;

-- example: set_price
-- note: Claude Sonnet 4's published prices, with the long-context tier above 200,000 prompt tokens
SELECT llm.set_price('claude-sonnet-4', '{"input": "3", "cache_write_5m": "3.75", "cache_write_1h": "6",
    "cache_read": "0.30", "output": "15", "tiers": [{"above_prompt_tokens": 200000, "input": "6",
    "cache_write_5m": "7.50", "cache_write_1h": "12", "cache_read": "0.60", "output": "22.50"}]}',
    '2026-01-01 00:00+00') > 0 AS added;
SELECT model, organization_id, effective_from, currency, rates FROM llm.prices ORDER BY id;

-- example: set_credit_rate
-- note: a credit worth a micro-dollar (1,000 nanos of USD)
SELECT llm.set_credit_rate(1000, p_effective_from => '2026-01-01 00:00+00') > 0 AS added;
SELECT organization_id, effective_from, nanos_per_credit FROM llm.credit_rates ORDER BY id;

-- example: price_usage
SELECT llm.set_price('claude-sonnet-4', '{"input": "3", "cache_read": "0.30", "output": "15"}',
    '2026-01-01 00:00+00') > 0 AS added;
SELECT llm.set_credit_rate(1000, p_effective_from => '2026-01-01 00:00+00') > 0 AS added;
-- note: 1,200 input tokens, 50,000 read from the cache and 800 output: $0.0306, exactly
SELECT cost_nanos, credits, price_tier, priced_by, currency
  FROM llm.price_usage('claude-sonnet-4', '{"input": 1200, "cache_read": 50000, "output": 800}',
                       p_at => '2026-01-15 12:00+00');

-- example: reprice
-- note: a request priced at $3 and $15 a million tokens; the provider's corrected price, published late, as a version in the past; a dry run, then applied
SELECT llm.set_price('m', '{"input": "3", "output": "15"}', '2026-01-01 00:00+00') > 0 AS added;
SELECT llm.set_credit_rate(1000, p_effective_from => '2026-01-01 00:00+00') > 0 AS added;
SELECT count(*) AS admitted FROM llm.admit_invocation('00000000-0000-0000-0000-00000000000a', NULL, 'm',
    p_invocation_id => '00000000-0000-0000-0000-000000000003', p_now => '2026-01-15 11:30+00',
    p_input_tokens => 1000, p_max_output_tokens => 200);
SELECT llm.settle_usage('00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-000000000003',
    '{"input": 1000, "output": 200}', '2026-01-15 11:30:04+00');
SELECT llm.set_price('m', '{"input": "2.50", "output": "12"}', '2026-01-02 00:00+00') > 0 AS added;
SELECT organization_id, requests, cost_before_nanos, cost_after_nanos, difference_nanos
  FROM llm.reprice('m', '2026-01-01 00:00+00', '2026-02-01 00:00+00',
                   (SELECT max(id) FROM llm.prices WHERE model = 'm'));
SELECT organization_id, requests, cost_before_nanos, cost_after_nanos, difference_nanos
  FROM llm.reprice('m', '2026-01-01 00:00+00', '2026-02-01 00:00+00',
                   (SELECT max(id) FROM llm.prices WHERE model = 'm'), true);
SELECT used_cents, used_cost_nanos FROM llm.periods WHERE organization_id = '00000000-0000-0000-0000-00000000000a';

-- example: admit_invocation
SELECT id, status, estimate_credits, hold_credits, period_start
FROM llm.admit_invocation(
    '00000000-0000-0000-0000-00000000000a', 300, 'gpt-x',
    p_invocation_id => '00000000-0000-0000-0000-000000000003',
    p_now => '2026-01-15 12:00+00', p_project => 'search');

-- example: mark_dispatched
SELECT id, status, dispatched_at
FROM llm.mark_dispatched('00000000-0000-0000-0000-00000000000a',
    '00000000-0000-0000-0000-000000000002', p_now => '2026-01-15 11:00:01+00');

-- example: settle_invocation
SELECT llm.settle_invocation('00000000-0000-0000-0000-00000000000a',
    '00000000-0000-0000-0000-000000000002', 28, 1, p_input_tokens => 90,
    p_output_tokens => 20, p_now => '2026-01-15 11:00:05+00');
SELECT llm.settle_invocation('00000000-0000-0000-0000-00000000000a',
    '00000000-0000-0000-0000-000000000002', 28, 1, p_input_tokens => 90,
    p_output_tokens => 20, p_now => '2026-01-15 11:00:06+00');

-- example: settle_usage
-- note: a credit worth a tenth of a cent; admitted with 2,000 prompt tokens and at most 500 output, priced; settled with what the provider measured
SELECT llm.set_price('claude-sonnet-4', '{"input": "3", "cache_read": "0.30", "output": "15"}',
    '2026-01-01 00:00+00') > 0 AS added;
SELECT llm.set_credit_rate(100000, p_effective_from => '2026-01-01 00:00+00') > 0 AS added;
SELECT estimate_credits FROM llm.admit_invocation('00000000-0000-0000-0000-00000000000a', NULL,
    'claude-sonnet-4', p_invocation_id => '00000000-0000-0000-0000-000000000003',
    p_now => '2026-01-15 11:30+00', p_input_tokens => 2000, p_max_output_tokens => 500);
SELECT llm.settle_usage('00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-000000000003',
    '{"input": 400, "cache_read": 1600, "output": 120, "reasoning": 80}', '2026-01-15 11:30:04+00');
SELECT charged_credits, cost_nanos, priced_by, price_tier FROM llm.invocations
 WHERE id = '00000000-0000-0000-0000-000000000003';

-- example: fail_invocation
SELECT llm.fail_invocation('00000000-0000-0000-0000-00000000000a',
    '00000000-0000-0000-0000-000000000002', 'provider timeout',
    p_now => '2026-01-15 11:00:30+00');

-- example: open_execution
SELECT status, replayed FROM llm.open_execution('00000000-0000-0000-0000-00000000000a',
    'summarize', p_subject_type => 'document', p_subject_id => '7',
    p_replay_key => 'doc-7', p_now => '2026-01-15 12:00+00');
SELECT status, replayed FROM llm.open_execution('00000000-0000-0000-0000-00000000000a',
    'summarize', p_subject_type => 'document', p_subject_id => '7',
    p_replay_key => 'doc-7', p_now => '2026-01-15 12:05+00');

-- example: close_execution
SELECT status FROM llm.open_execution('00000000-0000-0000-0000-00000000000a', 'summarize',
    p_replay_key => 'doc-8', p_now => '2026-01-15 12:00+00');
SELECT llm.close_execution('00000000-0000-0000-0000-00000000000a',
    (SELECT id FROM llm.executions WHERE replay_key = 'doc-8'), 'completed',
    p_now => '2026-01-15 12:00:42+00');
SELECT status, duration_ms FROM llm.executions WHERE replay_key = 'doc-8';

-- example: reconcile_org
SELECT organization_id, recovered_requests, released_hold_credits, more_pending
FROM llm.reconcile_org('00000000-0000-0000-0000-00000000000a',
    p_now => '2026-01-17 10:00+00');

-- example: reconciliation_health
SELECT status, last_run_status FROM llm.reconciliation_health(p_now => '2026-01-17 10:00+00');

-- example: schedule_reconciliation
SELECT llm.schedule_reconciliation('0 * * * *');

-- example: unschedule_reconciliation
SELECT llm.unschedule_reconciliation();

-- example: claim_notices
SELECT scope, scope_id, budget_window, threshold_pct, used_credits, status, attempts
FROM llm.claim_notices(p_limit => 10, p_now => '2026-01-15 10:01+00');

-- example: complete_notice
SELECT count(*) AS claimed FROM llm.claim_notices(p_now => '2026-01-15 10:01+00');
SELECT llm.complete_notice(organization_id, id, claim_token, p_now => '2026-01-15 10:01:02+00')
FROM llm.threshold_notices WHERE status = 'sending';
SELECT threshold_pct, status, sent_at FROM llm.threshold_notices;

-- example: fail_notice
SELECT count(*) AS claimed FROM llm.claim_notices(p_now => '2026-01-15 10:01+00');
SELECT llm.fail_notice(organization_id, id, claim_token, 'HTTP 503',
    p_now => '2026-01-15 10:01:02+00')
FROM llm.threshold_notices WHERE status = 'sending';
SELECT status, attempts, last_error, next_attempt_at FROM llm.threshold_notices;

-- example: release_notice
SELECT count(*) AS claimed FROM llm.claim_notices(p_now => '2026-01-15 10:01+00');
SELECT llm.release_notice(organization_id, id, claim_token, p_now => '2026-01-15 10:01:02+00')
FROM llm.threshold_notices WHERE status = 'sending';
SELECT status, attempts, next_attempt_at FROM llm.threshold_notices;

-- example: rearm_notices
SELECT count(*) AS claimed FROM llm.claim_notices(p_now => '2026-01-15 10:01+00');
SELECT llm.rearm_notices(p_now => '2026-01-15 11:00+00');

-- example: rebuild_daily_usage
SELECT llm.rebuild_daily_usage('2026-01-15', '2026-01-15');
SELECT day, model, requests, credits, cents, input_tokens, output_tokens FROM llm.daily_usage;

-- example: check_daily_usage
SELECT organization_id, day, recorded, computed
FROM llm.check_daily_usage('2026-01-15', '2026-01-15');

-- example: check_invariants
SELECT count(*) AS violations FROM llm.check_invariants();

-- example: report_periods
SELECT name, period_start, period_end, allowance_credits, used_credits, held_credits, used_cents
FROM llm.report_periods('2026-01-01', '2026-01-31');

-- example: report_daily_usage
SELECT llm.rebuild_daily_usage('2026-01-15', '2026-01-15');
SELECT day, name, model, requests, credits, cents, input_tokens, output_tokens
FROM llm.report_daily_usage('2026-01-15', '2026-01-15');

-- example: report_costs
SELECT llm.rebuild_daily_usage('2026-01-15', '2026-01-15');
SELECT name, model, currency, requests, cost_nanos, original_cost_nanos, uncosted_requests, fallback_requests
FROM llm.report_costs('2026-01-15', '2026-01-15');

-- example: report_open_holds
SELECT name, open_requests, held_credits, oldest_created_at, past_window
FROM llm.report_open_holds(p_now => '2026-01-15 12:00+00');

-- example: report_tasks
SELECT status FROM llm.open_execution('00000000-0000-0000-0000-00000000000a', 'summarize',
    p_now => '2026-01-15 12:00+00');
SELECT name, status, tasks, requests, credits, cents FROM llm.report_tasks('2026-01-15');

-- example: report_scope_usage
SELECT name, scope_id, requests, open_requests, used_credits, held_credits, used_cents
FROM llm.report_scope_usage('project', '2026-01-15', '2026-01-15');

-- example: report_budgets_near_limit
SELECT name, scope, scope_id, budget_window, window_start, limit_credits, first_threshold,
       used_credits, held_credits
FROM llm.report_budgets_near_limit(p_now => '2026-01-15 12:00+00');

-- example: books_snapshot
SELECT open_requests, held_credits, stale_open_requests, running_tasks, notices_owed
FROM llm.books_snapshot(p_now => '2026-01-15 12:00+00');

-- example: stale_by_organization_status
SELECT organization_status, stale_open_requests, stale_held_credits
FROM llm.stale_by_organization_status(p_now => '2026-01-17 12:00+00');

-- example: books_history
SELECT recovered_requests, past_window_alerts, abandoned_tasks, notices_sent
FROM llm.books_history(ARRAY['00000000-0000-0000-0000-00000000000a']::uuid[]);

-- example: organization_totals
SELECT name, status, allowance_credits, used_credits, held_credits, used_cents, notices
FROM llm.organization_totals(ARRAY['00000000-0000-0000-0000-00000000000a']::uuid[]);

-- example: last_run
-- no pass has run yet in this database: no row
SELECT status, orgs_visited FROM llm.last_run(p_now => '2026-01-15 12:00+00');

-- example: pass_progress
SELECT organizations, orgs_visited FROM llm.pass_progress(NULL);

-- example: metrics
SELECT metric, labels, value FROM llm.metrics(p_now => '2026-01-15 12:00+00')
WHERE metric IN ('llm_open_requests', 'llm_open_hold_credits', 'llm_budgets_near_limit')
ORDER BY metric, labels::text;

-- example: distribute
-- note: These pages are generated on a server without Citus, so the example is its error.
SELECT llm.distribute();

-- example: run_reconciliation
CALL llm.run_reconciliation(p_now => '2026-01-17 10:00+00');
SELECT status, clock, orgs_visited, orgs_failed, requests_recovered, released_hold_credits
FROM llm.reconciliation_runs;
