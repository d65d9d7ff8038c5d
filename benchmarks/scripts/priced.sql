-- One priced request cycle: the cycle of cycle.sql, its estimate priced by
-- the book from token counts and its settlement priced from the provider's usage
-- (llm.settle_usage), on the same organizations and tasks. The model 'bench-priced'
-- has a book price and a credit rate (benchmarks/queries.py SET_PRICES); cycle.sql's
-- 'bench-model' has none, so its requests pin nothing.
-- Variables: norgs (pgbench -D norgs=100); :client_id is pgbench's own (0 .. clients - 1).
\set n random(1, :norgs)
\set slot :client_id % 8
\set inp random(800, 1600)
SELECT i.id AS inv FROM llm.admit_invocation(md5('bench-org-' || :n)::uuid, NULL, 'bench-priced', md5('bench-exec-' || :n || '-' || :slot)::uuid, gen_random_uuid(), p_input_tokens => :inp, p_max_output_tokens => 400) AS i \gset
SELECT llm.settle_usage(md5('bench-org-' || :n)::uuid, :inv::uuid, jsonb_build_object('input', :inp::bigint, 'cache_read', 600, 'output', 300));
