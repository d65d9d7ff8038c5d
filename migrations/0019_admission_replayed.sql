-- depends: 0018_sum_limits
-- llm-db 0019: an admission says whether it replayed an earlier one.
--
-- admit_invocation returns the stored request when its invocation id was admitted
-- before (a retry), and mark_dispatched returns it unchanged when it was already
-- dispatched; neither said so, and a retried HTTP call could not tell a replay from
-- a new request. llm.admission, the result type of both, gains a last column,
-- replayed: true when the call created or changed nothing.
--
-- A change of a public result type (docs/architecture.md "Conventions" 16). A
-- client that reads named columns, as the driver of every release does, keeps its
-- statement and its plan. One that prepared `SELECT * FROM
-- llm.admit_invocation(...)` gets 0A000 (cached plan must not change result type)
-- once per prepared statement after the upgrade; the CHANGELOG gives the shim.
--
-- Under live traffic: ALTER TYPE only; no table is touched. The previous release's
-- functions keep filling the type's first columns; replayed is NULL from them.

ALTER TYPE llm.admission ADD ATTRIBUTE replayed boolean;
COMMENT ON TYPE llm.admission IS
    'A request as admit_invocation and mark_dispatched return it: the columns of llm.invocations as of 0.2.0, then replayed (the call returned an earlier admission or dispatch unchanged).';
