-- depends: 0023_price_book
-- llm-db 0024: a request priced by the book (docs/architecture.md "The price book").
--
-- An admission pins the price version and credit rate in force for its model, and a
-- settlement with the provider's usage (llm.settle_usage) records what it cost:
--
-- - price_version_id, credit_rate_id: pinned at admission (NULL: no price in force).
-- - priced_by: model or fallback (the book priced it from usage: settle_usage, or a
--   failure or true-up with usage); NULL until then, when the caller priced it
--   (settle_invocation: its cost is charged_cents * 10^7), and for a request
--   recovered at its estimate, which has no money figure.
-- - cost_nanos: the exact cost the book computed (nanos of llm.settings.currency);
--   NULL when the caller priced it (its cost is charged_cents * 10^7) or nothing did.
-- - usage: the measured usage it was priced from, every token class present.
-- - price_tier: the tier's above_prompt_tokens (NULL at base rates).
--
-- Under live traffic: nullable columns without defaults or constraints on
-- llm.invocations (no rewrite, no scan; a CHECK would scan the table under its lock:
-- invariant 19 checks what one would). No public routine of the previous release returns this table's
-- row (0014), so no call planned before sees a row it does not expect.

ALTER TABLE llm.invocations
    ADD COLUMN price_version_id bigint,
    ADD COLUMN credit_rate_id bigint,
    ADD COLUMN priced_by text,
    ADD COLUMN cost_nanos bigint,
    ADD COLUMN usage jsonb,
    ADD COLUMN price_tier bigint;
COMMENT ON COLUMN llm.invocations.price_version_id IS
    'The price version in force for the request''s model when it was admitted (llm.prices), which prices its usage; NULL: none was.';
COMMENT ON COLUMN llm.invocations.cost_nanos IS
    'What the book priced the measured usage at, exactly, in nanos; NULL when the caller priced it (its cost is charged_cents * 10^7) or nothing did (recovered).';

CREATE TYPE llm.priced_usage AS (
    credits       bigint,
    input_tokens  bigint,
    output_tokens bigint,
    cost_nanos    bigint,
    usage         jsonb,
    price_tier    bigint,
    priced_by     text
);
COMMENT ON TYPE llm.priced_usage IS
    'A request''s usage priced at its pinned version: the credits to charge, the tokens in (the prompt) and out (output and reasoning), the cost, the usage with every class, the tier and priced_by.';
