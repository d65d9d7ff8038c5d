"""Every SQL statement the driver runs, once, by name.

Parameters are named (``%(name)s``) and cast explicitly, and arguments are
passed by name (``p_x => ...``), so a reader sees which value goes where and a
new optional parameter in SQL breaks nothing here. The statements are static:
psycopg prepares each one on a connection after a few executions.

Every ``p_now`` is passed as ``%(now)s::timestamptz``; None means the server's
``now()`` (each function does ``coalesce(p_now, now())``), a datetime moves
the clock for tests.
"""

# ----------------------------------------------------------- organizations

UPSERT_ORGANIZATION = """
SELECT * FROM llm.upsert_organization(
    p_organization_id => %(organization_id)s::uuid,
    p_name => %(name)s::text,
    p_monthly_allowance_credits => %(monthly_allowance_credits)s::bigint,
    p_status => %(status)s::text,
    p_notice_thresholds => %(notice_thresholds)s::integer[],
    p_now => %(now)s::timestamptz)
"""

SET_RECOVERY_POLICY = """
SELECT * FROM llm.set_recovery_policy(
    p_organization_id => %(organization_id)s::uuid,
    p_recovery_charge => %(recovery_charge)s::text,
    p_late_settlement => %(late_settlement)s::text)
"""

SET_PERIOD_STRIPES = """
SELECT llm.set_period_stripes(
    p_organization_id => %(organization_id)s::uuid,
    p_stripes => %(stripes)s::integer) AS stripes
"""

DECLARE_TASK_KIND = """
SELECT llm.declare_task_kind(
    p_key => %(key)s::text,
    p_description => %(description)s::text)
"""

# ----------------------------------------------------------- requests

ADMIT = """
SELECT * FROM llm.admit_invocation(
    p_organization_id => %(organization_id)s::uuid,
    p_estimate_credits => %(estimate_credits)s::bigint,
    p_model => %(model)s::text,
    p_execution_id => %(execution_id)s::uuid,
    p_invocation_id => %(invocation_id)s::uuid,
    p_now => %(now)s::timestamptz)
"""

# The same call when the caller needs only the request's id: one column back
# instead of the 22 of llm.invocations.
ADMIT_ID = """
SELECT i.id FROM llm.admit_invocation(
    p_organization_id => %(organization_id)s::uuid,
    p_estimate_credits => %(estimate_credits)s::bigint,
    p_model => %(model)s::text,
    p_execution_id => %(execution_id)s::uuid,
    p_invocation_id => %(invocation_id)s::uuid,
    p_now => %(now)s::timestamptz) AS i
"""

MARK_DISPATCHED = """
SELECT * FROM llm.mark_dispatched(
    p_organization_id => %(organization_id)s::uuid,
    p_invocation_id => %(invocation_id)s::uuid,
    p_now => %(now)s::timestamptz)
"""

SETTLE = """
SELECT llm.settle_invocation(
    p_organization_id => %(organization_id)s::uuid,
    p_invocation_id => %(invocation_id)s::uuid,
    p_credits => %(credits)s::bigint,
    p_cents => %(cents)s::bigint,
    p_input_tokens => %(input_tokens)s::bigint,
    p_output_tokens => %(output_tokens)s::bigint,
    p_now => %(now)s::timestamptz) AS outcome
"""

FAIL = """
SELECT llm.fail_invocation(
    p_organization_id => %(organization_id)s::uuid,
    p_invocation_id => %(invocation_id)s::uuid,
    p_error => %(error)s::text,
    p_credits => %(credits)s::bigint,
    p_cents => %(cents)s::bigint,
    p_now => %(now)s::timestamptz) AS outcome
"""

# ----------------------------------------------------------- tasks

OPEN_EXECUTION = """
SELECT * FROM llm.open_execution(
    p_organization_id => %(organization_id)s::uuid,
    p_task_key => %(task_key)s::text,
    p_subject_type => %(subject_type)s::text,
    p_subject_id => %(subject_id)s::text,
    p_replay_key => %(replay_key)s::text,
    p_now => %(now)s::timestamptz)
"""

CLOSE_EXECUTION = """
SELECT llm.close_execution(
    p_organization_id => %(organization_id)s::uuid,
    p_execution_id => %(execution_id)s::uuid,
    p_outcome => %(outcome)s::text,
    p_error => %(error)s::text,
    p_now => %(now)s::timestamptz) AS closed
"""

# ----------------------------------------------------------- recovery

RECONCILE_ORG = """
SELECT * FROM llm.reconcile_org(
    p_organization_id => %(organization_id)s::uuid,
    p_now => %(now)s::timestamptz,
    p_batch => %(batch)s::integer)
"""

# The procedure commits after each organization, so it runs outside any
# transaction block (the driver switches the connection to autocommit).
RUN_RECONCILIATION = """
CALL llm.run_reconciliation(
    p_now => %(now)s::timestamptz,
    p_batch => %(batch)s::integer)
"""

# The server clock before the CALL, to find the run row the CALL recorded.
CLOCK = "SELECT pg_catalog.clock_timestamp() AS clock"

RUN_RECORDED_SINCE = """
SELECT * FROM llm.reconciliation_runs AS r
 WHERE r.started_at >= %(since)s::timestamptz AND r.finished_at IS NOT NULL
 ORDER BY r.started_at DESC
 LIMIT 1
"""

HEALTH = """
SELECT * FROM llm.reconciliation_health(p_now => %(now)s::timestamptz)
"""

SCHEDULE_RECONCILIATION = """
SELECT llm.schedule_reconciliation(p_schedule => %(schedule)s::text) AS job_id
"""

UNSCHEDULE_RECONCILIATION = """
SELECT llm.unschedule_reconciliation() AS removed
"""

# ----------------------------------------------------------- notices

CLAIM_NOTICES = """
SELECT * FROM llm.claim_notices(
    p_limit => %(limit)s::integer,
    p_now => %(now)s::timestamptz)
"""

COMPLETE_NOTICE = """
SELECT llm.complete_notice(
    p_organization_id => %(organization_id)s::uuid,
    p_notice_id => %(notice_id)s::uuid,
    p_now => %(now)s::timestamptz) AS done
"""

FAIL_NOTICE = """
SELECT llm.fail_notice(
    p_organization_id => %(organization_id)s::uuid,
    p_notice_id => %(notice_id)s::uuid,
    p_error => %(error)s::text,
    p_now => %(now)s::timestamptz) AS done
"""

RELEASE_NOTICE = """
SELECT llm.release_notice(
    p_organization_id => %(organization_id)s::uuid,
    p_notice_id => %(notice_id)s::uuid,
    p_now => %(now)s::timestamptz) AS released
"""

REARM_NOTICES = """
SELECT llm.rearm_notices(p_now => %(now)s::timestamptz) AS rearmed
"""

# The worker sleeps until the next owed notice is due (or a NOTIFY, or --poll):
# seconds from the server's now(), NULL when nothing is owed. The partial index
# threshold_notices_owed answers it.
NEXT_NOTICE_DUE = """
SELECT GREATEST(0, EXTRACT(EPOCH FROM min(n.next_attempt_at) - pg_catalog.now()))::float8 AS seconds
  FROM llm.threshold_notices AS n
 WHERE n.status = 'owed'
"""

NOTICE_CLAIM_TIMEOUT = """
SELECT EXTRACT(EPOCH FROM s.notice_claim_timeout)::float8 AS seconds FROM llm.settings AS s
"""

# ----------------------------------------------------------- reporting and checks

REBUILD_DAILY_USAGE = """
SELECT llm.rebuild_daily_usage(
    p_from => %(day_from)s::date,
    p_to => %(day_to)s::date) AS rows_written
"""

CHECK_INVARIANTS = """
SELECT * FROM llm.check_invariants()
"""

# ----------------------------------------------------------- scale-out

DISTRIBUTE = """
SELECT llm.distribute(p_shard_count => %(shard_count)s::integer) AS report
"""
