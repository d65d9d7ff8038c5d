-- depends: 0012_sweep_totals_recount
-- llm-db 0013: how far a lowered allowance left a period over it (invariant 4).
--
-- Invariant 4 holds used + held - overrun within the allowance, where overrun is
-- what terminal requests booked beyond their holds. A lowered allowance may leave a
-- period over it; until now the check recognised that by comparing clocks (the
-- organization's updated_at against the last admission's created_at), which follow
-- neither commit nor lock order, so an admission that waited for an upsert, or a
-- later month opened by a clock moved ahead, was reported. The change itself now
-- records, under the period's stripe locks, how far used + held stood over the new
-- allowance: from then on nothing but admission raises used + held - overrun, and
-- admission only within the allowance.
--
-- Under live traffic: a new column with a constant default (no rewrite) and one
-- UPDATE of period_heads, a row per organization and month. Existing periods take
-- the excess they hold now, which covers every allowance lowered before 0.3.0.

ALTER TABLE llm.period_heads ADD COLUMN allowance_excess bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN llm.period_heads.allowance_excess IS
    'How far used + held stood over the allowance when it was last changed (0 when within it): the most invariant 4 lets used + held - overrun exceed the allowance by.';

UPDATE llm.period_heads AS h
   SET allowance_excess = s.used + s.held - h.allowance_credits
  FROM (SELECT s.organization_id, s.period_start, sum(s.used_credits) AS used, sum(s.held_credits) AS held
          FROM llm.period_stripes AS s GROUP BY 1, 2) AS s
 WHERE s.organization_id = h.organization_id AND s.period_start = h.period_start
   AND h.allowance_credits IS NOT NULL
   AND s.used + s.held > h.allowance_credits;
