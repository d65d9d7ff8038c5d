-- One request cycle: admit a request (random organization, linked to one of that
-- organization's running tasks, the one of this client's slot, with a client-chosen
-- id) and settle it with measured usage. Each statement is its own transaction, as
-- for a real worker that calls the model between the two. Organization n has the id
-- md5('bench-org-' || n)::uuid and its task of slot c md5('bench-exec-' || n || '-' || c)::uuid
-- (benchmarks/queries.py OPEN_TASKS: a tenant's agents each run their own task).
-- Variables: norgs (pgbench -D norgs=100); :client_id is pgbench's own (0 .. clients - 1).
\set n random(1, :norgs)
\set slot :client_id % 8
SELECT i.id AS inv FROM llm.admit_invocation(md5('bench-org-' || :n)::uuid, 100, 'bench-model', md5('bench-exec-' || :n || '-' || :slot)::uuid, gen_random_uuid()) AS i \gset
SELECT llm.settle_invocation(md5('bench-org-' || :n)::uuid, :inv::uuid, 80, 3, 1200, 300);
