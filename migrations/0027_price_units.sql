-- depends: 0026_cost_views
-- llm-db 0027: each price version keeps its base rates as the nanos one unit of each
-- token class costs (unit_nanos), for the request path's one-expression cost
-- (docs/architecture.md "The price book", its paragraph on the request path).
--
-- A version is never changed, so the column is written once, by set_price, from the
-- version's rates. NULL (a version with tiers, or one set before this migration) prices
-- by the rates themselves, class by class, as before: the same exact cost, found with
-- more work.
--
-- Under live traffic: a nullable column on a small catalog (no rewrite), locked briefly.

ALTER TABLE llm.price_versions ADD COLUMN unit_nanos jsonb
    CHECK (jsonb_typeof(unit_nanos) = 'object');
COMMENT ON COLUMN llm.price_versions.unit_nanos IS
    'The base rates as nanos per token of each class (reasoning at the output rate unless priced; requests per call, 0 unless priced; 10^30 for a class with no rate); NULL for a version with tiers. Derived from rates by llm._unit_nanos.';
