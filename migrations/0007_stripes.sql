-- depends: 0006_period_index
-- llm-db 0007: striped period counters (escrow), so one organization is not one row.
--
-- Every admission and settlement of an organization used to update its period
-- row, and a transaction holds that row lock through its WAL flush: one row per
-- period caps an organization's request rate at what one row can take, whatever
-- the server. Now a period's counters are spread over N stripe rows
-- (llm.period_stripes; N = llm.organizations.period_stripes, 1 to 64, set with
-- llm.set_period_stripes): each admission takes its hold from one stripe, chosen
-- by its session, and each settlement moves the stripe that holds its request's
-- hold (llm.invocations.stripe).
--
-- Exactness is kept by escrow. Each stripe carries admit_room, the credits it
-- may still hold without looking at the others (the stripes' rooms never add up
-- to more than the period has left), and notice_room, the usage it may add
-- before the period could reach its next threshold. A movement that fits its
-- stripe's rooms touches one row; one that does not locks the period (head, then
-- its stripes in order), decides on the exact totals (LL001, threshold notices)
-- and spreads the rooms again. So an admission is refused iff used + held +
-- estimate > allowance over the whole period, and the transaction whose commit
-- takes the total across a threshold records its notice.
--
-- llm.periods keeps its rows and columns, as a view: the head (llm.period_heads,
-- the old table renamed, with the allowance and the bounds) joined with the sums
-- of its stripes. threshold_notices' foreign key keeps pointing at the head.
--
-- Upgrading a populated database: each period's counters become its stripe 0
-- (rooms 0: the first movement of each period takes the exact path and spreads
-- them); the old counter columns are dropped from the head (no rewrite);
-- invocations get stripe 0 (a constant default: no rewrite).

ALTER TABLE llm.organizations
    ADD COLUMN period_stripes integer NOT NULL DEFAULT 1 CHECK (period_stripes BETWEEN 1 AND 64);
COMMENT ON COLUMN llm.organizations.period_stripes IS
    'How many stripe rows the organization''s period counters are spread over (1 to 64, llm.set_period_stripes): admissions of different sessions take their holds from different stripes.';

-- a domain, not a table CHECK: checked when a stripe number is written, not on every
-- update of a counter row (see 0002)
CREATE DOMAIN llm.stripe AS smallint CHECK (VALUE BETWEEN 0 AND 63);
COMMENT ON DOMAIN llm.stripe IS 'A stripe of a period''s counters: 0 to 63.';

ALTER TABLE llm.periods RENAME TO period_heads;
COMMENT ON TABLE llm.period_heads IS
    'One calendar month (UTC) of an organization: its bounds and allowance. Its counters are the sums of its llm.period_stripes rows (the view llm.periods).';

CREATE TABLE llm.period_stripes (
    organization_id uuid       NOT NULL,
    period_start    date       NOT NULL,
    stripe          llm.stripe NOT NULL,
    used_credits    llm.amount NOT NULL DEFAULT 0,
    held_credits    llm.amount NOT NULL DEFAULT 0,
    used_cents      llm.amount NOT NULL DEFAULT 0,
    admit_room      llm.amount,
    notice_room     llm.amount,
    PRIMARY KEY (organization_id, period_start, stripe),
    FOREIGN KEY (organization_id, period_start) REFERENCES llm.period_heads (organization_id, period_start)
);
COMMENT ON TABLE llm.period_stripes IS
    'A period''s counters, spread over stripes: used and held credits and used cents of the requests whose hold is on the stripe, and its escrow: admit_room (credits it may hold without the other stripes; NULL: unlimited) and notice_room (usage it may add before the period could reach its next threshold; NULL: no threshold ahead).';
COMMENT ON COLUMN llm.period_stripes.admit_room IS
    'Credits this stripe may still hold on its own; the stripes'' rooms never add up to more than the period has left (NULL: unlimited allowance).';
COMMENT ON COLUMN llm.period_stripes.notice_room IS
    'Usage this stripe may still add on its own before the period could reach its next threshold (NULL: none ahead); a movement that does not fit decides on the exact totals.';

INSERT INTO llm.period_stripes
       (organization_id, period_start, stripe, used_credits, held_credits, used_cents, admit_room, notice_room)
SELECT h.organization_id, h.period_start, 0, h.used_credits, h.held_credits, h.used_cents,
       CASE WHEN h.allowance_credits IS NOT NULL THEN 0 END,
       CASE WHEN h.allowance_credits IS NOT NULL THEN 0 END
  FROM llm.period_heads AS h;

ALTER TABLE llm.period_heads
    DROP COLUMN used_credits,
    DROP COLUMN held_credits,
    DROP COLUMN used_cents;

CREATE VIEW llm.periods AS
SELECT h.organization_id, h.period_start, h.period_end, h.allowance_credits,
       sum(s.used_credits)::bigint AS used_credits,
       sum(s.held_credits)::bigint AS held_credits,
       sum(s.used_cents)::bigint AS used_cents
  FROM llm.period_heads AS h
  JOIN llm.period_stripes AS s
    ON s.organization_id = h.organization_id AND s.period_start = h.period_start
 GROUP BY h.organization_id, h.period_start;
COMMENT ON VIEW llm.periods IS
    'One calendar month (UTC) of an organization: allowance, used and held credits, used cents (the sums of its stripes).';

-- plain smallint: a constrained domain would make PostgreSQL rewrite the table to add it,
-- and a table CHECK is evaluated on every update of a request; only the functions write it
ALTER TABLE llm.invocations ADD COLUMN stripe smallint NOT NULL DEFAULT 0;
COMMENT ON COLUMN llm.invocations.stripe IS
    'The stripe of its period that holds this request''s hold (and takes its charge).';
