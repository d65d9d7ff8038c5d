-- Tasks (WF-PFM-LLM-002, STATE-PFM-LLM-002): open with an optional replay key,
-- close as completed or failed; recovery abandons (see 60_recovery.sql).
-- Totals grow in _end_invocation, in the settlement's own transaction.

CREATE OR REPLACE FUNCTION llm._open_execution(
    p_organization_id uuid, p_task_key text, p_subject_type text, p_subject_id text,
    p_replay_key text, p_now timestamptz)
RETURNS TABLE (execution_id uuid, status text, replayed boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_exec llm.executions;
BEGIN
    PERFORM llm._operational_org(p_organization_id);
    PERFORM FROM llm.task_kinds AS k WHERE k.key = p_task_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'llm: unknown task kind %', p_task_key
            USING ERRCODE = 'LL004',
                  HINT = 'Declare it first with llm.declare_task_kind(key, description).';
    END IF;

    IF p_replay_key IS NOT NULL THEN
        SELECT * INTO v_exec FROM llm.executions AS x
         WHERE x.organization_id = p_organization_id AND x.replay_key = p_replay_key;
    END IF;
    IF v_exec.id IS NULL THEN
        INSERT INTO llm.executions AS x
               (organization_id, id, task_key, subject_type, subject_id, replay_key, status, started_at)
        VALUES (p_organization_id, pg_catalog.gen_random_uuid(), p_task_key, p_subject_type, p_subject_id,
                p_replay_key, 'running', p_now)
        ON CONFLICT (organization_id, replay_key) WHERE replay_key IS NOT NULL DO NOTHING
        RETURNING x.* INTO v_exec;
        IF FOUND THEN
            RETURN QUERY SELECT v_exec.id, v_exec.status::text, false;
            RETURN;
        END IF;
        -- opened concurrently with the same key; that transaction has committed
        SELECT * INTO STRICT v_exec FROM llm.executions AS x
         WHERE x.organization_id = p_organization_id AND x.replay_key = p_replay_key;
    END IF;

    PERFORM llm._check_retry(
        pg_catalog.format('llm: replay key %s was used for a different task', p_replay_key),
        'task=%s subject=%s/%s',
        ARRAY[v_exec.task_key, v_exec.subject_type, v_exec.subject_id],
        ARRAY[p_task_key, p_subject_type, p_subject_id],
        'A replay key names one task; choose a new key for new work.');
    RETURN QUERY SELECT v_exec.id, v_exec.status::text, true;
END
$$;
COMMENT ON FUNCTION llm._open_execution(uuid, text, text, text, text, timestamptz) IS
    'Distributed twin of open_execution; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.open_execution(
    p_organization_id uuid, p_task_key text, p_subject_type text DEFAULT NULL,
    p_subject_id text DEFAULT NULL, p_replay_key text DEFAULT NULL, p_now timestamptz DEFAULT now())
RETURNS TABLE (execution_id uuid, status text, replayed boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now);
    PERFORM llm._check_text('p_task_key', p_task_key, 200);
    PERFORM llm._check_text('p_subject_type', p_subject_type, 200, true);
    PERFORM llm._check_text('p_subject_id', p_subject_id, 200, true);
    PERFORM llm._check_text('p_replay_key', p_replay_key, 200, true);
    RETURN QUERY
    SELECT o.execution_id, o.status, o.replayed
      FROM llm._open_execution(p_organization_id, p_task_key, p_subject_type, p_subject_id,
                               p_replay_key, coalesce(p_now, pg_catalog.now())) AS o;
END
$$;
COMMENT ON FUNCTION llm.open_execution(uuid, text, text, text, text, timestamptz) IS
    'Opens a running task of a declared kind (LL004 otherwise). A replay key is unique per organization: opening it again returns the earlier task, whatever its status, with replayed = true; with a different task or subject, LL007.';

CREATE OR REPLACE FUNCTION llm._close_execution(
    p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- compare-and-set on running: close and abandonment race, one wins
    UPDATE llm.executions AS x
       SET status = p_outcome,
           ended_at = p_now,
           duration_ms = GREATEST(0, (extract(epoch FROM p_now - x.started_at) * 1000)::bigint),
           error = p_error
     WHERE x.organization_id = p_organization_id AND x.id = p_execution_id AND x.status = 'running';
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM FROM llm.executions AS x WHERE x.organization_id = p_organization_id AND x.id = p_execution_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'llm: unknown execution % for organization %', p_execution_id, p_organization_id
            USING ERRCODE = 'LL006',
                  HINT = 'Pass the execution_id open_execution returned, with its own organization.';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION llm._close_execution(uuid, uuid, text, text, timestamptz) IS
    'Distributed twin of close_execution; arguments already checked.';

CREATE OR REPLACE FUNCTION llm.close_execution(
    p_organization_id uuid, p_execution_id uuid, p_outcome text, p_error text DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_closed boolean;
BEGIN
    PERFORM llm._check_call(p_organization_id, p_now, 'execution', p_execution_id);
    IF p_outcome IS NULL OR p_outcome NOT IN ('completed', 'failed') THEN
        RAISE EXCEPTION 'llm: cannot close an execution as %', coalesce(p_outcome, 'NULL')
            USING ERRCODE = 'LL009',
                  DETAIL = 'A task closes as completed or failed; only recovery abandons.',
                  HINT = 'Pass p_outcome => ''completed'' or ''failed''.';
    END IF;
    PERFORM llm._check_text('p_error', p_error, 4000, true);
    SELECT c INTO v_closed
      FROM llm._close_execution(p_organization_id, p_execution_id, p_outcome, p_error,
                                coalesce(p_now, pg_catalog.now())) AS c;
    RETURN v_closed;
END
$$;
COMMENT ON FUNCTION llm.close_execution(uuid, uuid, text, text, timestamptz) IS
    'Closes a running task as completed or failed, stamping ended_at and duration_ms and keeping its totals; false when it was no longer running (a closed task never reopens). LL009 for any other outcome.';
