-- One request cycle: admit a request (random organization, linked to that
-- organization's running task, client-chosen id) and settle it with measured
-- usage. Each statement is its own transaction, as for a real worker that
-- calls the model between the two. Organization n and its task have the ids
-- md5('bench-org-' || n)::uuid and md5('bench-exec-' || n)::uuid.
-- Variables: norgs (pgbench -D norgs=100).
\set n random(1, :norgs)
SELECT i.id AS inv FROM llm.admit_invocation(md5('bench-org-' || :n)::uuid, 100, 'bench-model', md5('bench-exec-' || :n)::uuid, gen_random_uuid()) AS i \gset
SELECT llm.settle_invocation(md5('bench-org-' || :n)::uuid, :inv::uuid, 80, 3, 1200, 300);
