-- cycle.sql (organizations without budgets), plus in each of its two statements the
-- writes of two budget counters as floor_budgets.sql makes them, with no check: the
-- counters of organization n + :offset's project month and API key day (those
-- benchmarks/queries.py PREFILL_COUNTERS made for the day of the run), held by 100 at
-- admission and released at settlement, so they end each request as they began and the
-- invariants hold after it. What those four updates add to the package's cycle, set
-- against what they add to the floor (floors.py's floor_budgets_writes): benchmarks/floors.py.
\set n random(1, :norgs)
\set slot :client_id % 8
\set p random(1, :nprojects)
\set k random(1, :nkeys)
\set m :n + :offset
WITH a AS (
    SELECT i.id FROM llm.admit_invocation(md5('bench-org-' || :n)::uuid, 100, 'bench-model',
                                          md5('bench-exec-' || :n || '-' || :slot)::uuid, gen_random_uuid()) AS i
), c AS (
    UPDATE llm.budget_counters AS c
       SET held_credits = c.held_credits + 100
      FROM a, (VALUES ('project', 'project-' || :p, 'month'), ('api_key', 'key-' || :m || '-' || :k, 'day'))
             AS k (scope, scope_id, budget_window)
     WHERE c.organization_id = md5('bench-org-' || :m)::uuid AND c.scope = k.scope AND c.scope_id = k.scope_id
       AND c.budget_window = k.budget_window AND c.window_start = llm._window_start(k.budget_window, now())
       AND c.stripe = 0
)
SELECT a.id AS inv FROM a \gset
WITH s AS (
    SELECT llm.settle_invocation(md5('bench-org-' || :n)::uuid, :inv::uuid, 80, 3, 1200, 300) AS outcome
), c AS (
    UPDATE llm.budget_counters AS c
       SET held_credits = c.held_credits - 100
      FROM s, (VALUES ('project', 'project-' || :p, 'month'), ('api_key', 'key-' || :m || '-' || :k, 'day'))
             AS k (scope, scope_id, budget_window)
     WHERE c.organization_id = md5('bench-org-' || :m)::uuid AND c.scope = k.scope AND c.scope_id = k.scope_id
       AND c.budget_window = k.budget_window AND c.window_start = llm._window_start(k.budget_window, now())
       AND c.stripe = 0
)
SELECT s.outcome FROM s;
