-- llm-db contract step 0019: 0.3.0's result type of admission and dispatch goes.
--
-- admit_invocation and mark_dispatched return llm.admission_result since the functions
-- step (migration 0019). A call of 0.3.0 planned before it returned llm.admission to
-- its end; after the barrier none can run, and no routine of this release names it.

DROP TYPE IF EXISTS llm.admission;
