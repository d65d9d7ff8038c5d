-- depends: 0022_lean_write_path_indexes
-- llm-db 0023: the price book (docs/architecture.md "The price book").
--
-- The books price a request themselves from the usage the provider measured. Money
-- is an exact integer of nanos, 10^-9 of the book's one currency (the currency of
-- llm.settings, an ISO 4217 code, USD by default).
--
-- - price_versions: a model's rates per million tokens of each token class (per call
--   for requests), from a time on, for the whole book (organization_id NULL) or for one
--   organization (its negotiated price, which wins for it). Versions are never changed:
--   a new price is a new version. The model '*' is the fallback, used only when no
--   version of the model is in force. Listed by the view llm.prices.
-- - credit_rates: how many nanos one credit is worth, from a time on, for the book or
--   one organization; a request's credits are its cost divided by it, rounded up.
-- - price_quote: what llm.price_usage returns.
--
-- Both tables are catalogs (reference tables under Citus, like settings): every
-- organization's admission reads them, and an organization's own version is a row
-- with its id, not a distributed row, so that one statement finds the organization's
-- version and the book's. No foreign key to organizations for the same reason
-- (a reference table cannot reference a distributed one): set_price checks the id.
--
-- Under live traffic: two new tables, a new type and a settings column with a
-- constant default (no rewrite); settings is one row, locked briefly.

ALTER TABLE llm.settings ADD COLUMN currency text NOT NULL DEFAULT 'USD',
    ADD CONSTRAINT settings_currency_range CHECK (currency ~ '^[A-Z]{3}$');
COMMENT ON COLUMN llm.settings.currency IS
    'The book''s currency, an ISO 4217 code: every price is in it and every cost is nanos (10^-9) of it.';

CREATE TABLE llm.price_versions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model text NOT NULL CHECK (model <> '' AND length(model) <= 200),
    organization_id uuid,
    effective_from timestamptz NOT NULL,
    currency text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    rates jsonb NOT NULL CHECK (jsonb_typeof(rates) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT price_versions_key UNIQUE NULLS NOT DISTINCT (model, organization_id, effective_from)
);
COMMENT ON TABLE llm.price_versions IS
    'The price book: a model''s rates from effective_from on, for the book (organization_id NULL) or one organization; never updated. Listed by llm.prices.';
COMMENT ON COLUMN llm.price_versions.rates IS
    'Rates per million tokens of each class (per call for requests), exact JSON numbers, and optional tiers [{above_prompt_tokens, class: rate ...}] in ascending order.';

CREATE TABLE llm.credit_rates (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    organization_id uuid,
    effective_from timestamptz NOT NULL,
    nanos_per_credit bigint NOT NULL CHECK (nanos_per_credit BETWEEN 1 AND 1000000000000000),
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT credit_rates_key UNIQUE NULLS NOT DISTINCT (organization_id, effective_from)
);
COMMENT ON TABLE llm.credit_rates IS
    'What one credit is worth in nanos of the book''s currency from effective_from on, for the book (organization_id NULL) or one organization; never updated.';

CREATE TYPE llm.price_quote AS (
    cost_nanos       bigint,
    credits          bigint,
    price_version_id bigint,
    credit_rate_id   bigint,
    price_tier       bigint,
    priced_by        text,
    currency         text
);
COMMENT ON TYPE llm.price_quote IS
    'What llm.price_usage returns: the exact cost in nanos, the credits it is charged, the versions that priced it, the tier (NULL at base rates) and whether the model''s price or the fallback priced it.';
