-- The request cycle of cycle.sql with every request under three budgets: its
-- organization's allowance, its project's month and its API key's day (the
-- organization's '*' defaults, benchmarks/queries.py SET_BUDGETS). Organizations
-- :first .. :first + :norgs - 1, each with projects 1 .. :nprojects and keys
-- 1 .. :nkeys (pgbench -D first=101 -D norgs=100 -D nprojects=100 -D nkeys=50 spreads
-- the keys over 5,000 ids; -D norgs=1 -D nkeys=1 puts every client on one key's day).
\set n random(:first, :first + :norgs - 1)
\set slot :client_id % 8
\set p random(1, :nprojects)
\set k random(1, :nkeys)
SELECT i.id AS inv FROM llm.admit_invocation(md5('bench-org-' || :n)::uuid, 100, 'bench-model', md5('bench-exec-' || :n || '-' || :slot)::uuid, gen_random_uuid(), p_project => 'project-' || :p, p_api_key => 'key-' || :n || '-' || :k) AS i \gset
SELECT llm.settle_invocation(md5('bench-org-' || :n)::uuid, :inv::uuid, 80, 3, 1200, 300);
