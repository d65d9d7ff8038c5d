-- The ceiling of any request cycle that commits twice: admission must be durable
-- before the model call and settlement after it. Two one-row UPDATEs of
-- pgbench_accounts, each its own transaction (no BEGIN), on the simple-update
-- database: whatever the books cost, a two-commit cycle cannot beat this.
-- Variables: rows (pgbench -D rows=N): the UPDATEs pick one of the first N
-- accounts; rows=1 is the hot case, every transaction on the same row, as every
-- admission and settlement of one organization updates its period row.
\set aid random(1, :rows)
\set delta random(-5000, 5000)
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE pgbench_accounts SET abalance = abalance - :delta WHERE aid = :aid;
