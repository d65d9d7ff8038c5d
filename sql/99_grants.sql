-- Roles (docs/contract.md "Roles and grants"): PUBLIC has nothing; llm_app runs the request and
-- task calls; llm_operator runs recovery, notices, reporting and scheduling;
-- llm_reader reads tables. Tables are written only through functions.

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA llm FROM PUBLIC;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA llm FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA llm FROM PUBLIC;
REVOKE ALL ON SCHEMA llm FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA llm FROM llm_app, llm_operator, llm_reader;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA llm FROM llm_app, llm_operator, llm_reader;
REVOKE ALL ON ALL TABLES IN SCHEMA llm FROM llm_app, llm_operator, llm_reader;

GRANT USAGE ON SCHEMA llm TO llm_app, llm_operator, llm_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA llm TO llm_reader, llm_operator;
-- Internal: it calls the private llm._budget_keys, which a view runs with its reader's
-- rights; only the owner's routines read it (sql/28_budgets.sql).
REVOKE SELECT ON llm._invocation_budget_keys FROM llm_reader, llm_operator;
-- Internal too: what the invariants compare a task's totals with (sql/95_invariants.sql).
REVOKE SELECT ON llm._execution_charges FROM llm_reader, llm_operator;
-- and each organization's open floor (sql/20_stripes.sql)
REVOKE SELECT ON llm._open_floors FROM llm_reader, llm_operator;
GRANT SELECT ON llm.task_kinds, llm.settings, llm.budgets, llm.budget_usage TO llm_app;
-- The two views are security_invoker (sql/28_budgets.sql): their reader needs the tables.
GRANT SELECT ON llm.budget_limits, llm.budget_counters TO llm_app;
-- The price book: llm.prices is security_invoker too.
GRANT SELECT ON llm.prices, llm.price_versions, llm.credit_rates TO llm_app;

GRANT EXECUTE ON FUNCTION
    llm.admit_invocation(uuid, bigint, text, uuid, uuid, timestamptz, text, text, text, bigint, bigint),
    llm.mark_dispatched(uuid, uuid, timestamptz),
    llm.settle_invocation(uuid, uuid, bigint, bigint, bigint, bigint, timestamptz),
    llm.fail_invocation(uuid, uuid, text, bigint, bigint, timestamptz, jsonb),
    llm.settle_usage(uuid, uuid, jsonb, timestamptz),
    llm.open_execution(uuid, text, text, text, text, timestamptz),
    llm.close_execution(uuid, uuid, text, text, timestamptz),
    llm.note_refusal(uuid, text, text, text, date, timestamptz),
    llm.price_usage(text, jsonb, uuid, timestamptz)
TO llm_app;

GRANT EXECUTE ON FUNCTION
    llm.upsert_organization(uuid, text, bigint, text, integer[], timestamptz),
    llm.set_allowance(uuid, bigint, timestamptz),
    llm.set_recovery_policy(uuid, text, text),
    llm.set_period_stripes(uuid, integer),
    llm.set_budget(uuid, text, text, text, bigint, integer[], timestamptz),
    llm.set_budget_stripes(uuid, text, text, text, integer, timestamptz),
    llm.declare_task_kind(text, text),
    llm.set_price(text, jsonb, timestamptz, uuid),
    llm.set_credit_rate(bigint, uuid, timestamptz),
    llm.reprice(text, timestamptz, timestamptz, bigint, boolean),
    llm.reconcile_org(uuid, timestamptz, integer, uuid),
    llm.reconciliation_health(timestamptz),
    llm.schedule_reconciliation(text),
    llm.unschedule_reconciliation(),
    llm.claim_notices(integer, timestamptz),
    llm.complete_notice(uuid, uuid, uuid, timestamptz),
    llm.fail_notice(uuid, uuid, uuid, text, timestamptz),
    llm.release_notice(uuid, uuid, uuid, timestamptz),
    llm.rearm_notices(timestamptz),
    llm.rebuild_daily_usage(date, date),
    llm.check_daily_usage(date, date),
    llm.check_invariants(),
    -- the steps run_reconciliation (a committing procedure, so SECURITY INVOKER) calls
    llm._begin_run(timestamptz),
    llm._pass_organizations(),
    llm._audits_due(timestamptz),
    llm._run_org(uuid, uuid, uuid, timestamptz, integer),
    llm._run_followup(uuid, uuid, text, timestamptz, date),
    llm._rebuild_days(timestamptz),
    llm._run_audit(uuid, uuid, timestamptz),
    llm._finish_run(uuid, uuid),
    llm._check_clock(timestamptz),
    llm._clock_ok(timestamptz)  -- what _check_clock calls, with the caller's rights here
TO llm_operator;
GRANT EXECUTE ON PROCEDURE llm.run_reconciliation(timestamptz, integer) TO llm_operator;
-- The missing-run alarm is a read, and `llm-db metrics` reports it: a monitoring scrape
-- runs as llm_reader, the least privilege.
GRANT EXECUTE ON FUNCTION llm.reconciliation_health(timestamptz) TO llm_reader;
-- The reads of `llm-db report`, `metrics`, `demo` and the pass's progress (sql/81, 82)
-- only read what both roles may SELECT already; llm_app has none.
GRANT EXECUTE ON FUNCTION
    llm.report_periods(date, date, uuid[]),
    llm.report_daily_usage(date, date, uuid[]),
    llm.report_costs(date, date, uuid[]),
    llm.report_open_holds(uuid[], timestamptz),
    llm.report_tasks(date, uuid[]),
    llm.report_scope_usage(text, date, date, uuid[]),
    llm.report_budgets_near_limit(text, uuid[], timestamptz),
    llm.books_snapshot(uuid[], timestamptz),
    llm.stale_by_organization_status(timestamptz),
    llm.books_history(uuid[]),
    llm.organization_totals(uuid[]),
    llm.last_run(timestamptz),
    llm.pass_progress(timestamptz),
    llm.metrics(timestamptz)
TO llm_reader, llm_operator;
