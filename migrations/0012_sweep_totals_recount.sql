-- depends: 0011_notice_claim_tokens
-- llm-db 0012: the sweeps' totals start from the books (invariant 10).
--
-- llm.sweep_totals are recounted from the requests. 0005 started them from the
-- books, but counted a request recovered at its zero estimate as uncharged,
-- which the sweeps never do.
--
-- Under live traffic: sweep_totals (a row per organization) is locked against
-- writes (reads go on) while the requests are read once: a sweep that recovered
-- requests this snapshot does not see waits to add its own increments
-- afterwards, so none is lost or counted twice. A sweep that waits past
-- org_lock_timeout is recorded (55P03) and redone by the next pass. Its own
-- transaction, apart from 0010's settings: a sweep reads llm.settings before it
-- writes sweep_totals, so holding settings through this read would stall every
-- sweep and notice call for the length of the scan.

LOCK TABLE llm.sweep_totals IN EXCLUSIVE MODE;
INSERT INTO llm.sweep_totals AS t (organization_id, recovered_requests, recovered_uncharged, past_window_alerts)
SELECT i.organization_id,
       count(*) FILTER (WHERE i.recovered_credits IS NOT NULL),
       count(*) FILTER (WHERE i.recovered_credits = 0 AND i.estimate_credits > 0),
       count(*) FILTER (WHERE i.past_window_alerted_at IS NOT NULL)
  FROM llm.invocations AS i
 WHERE i.recovered_credits IS NOT NULL OR i.past_window_alerted_at IS NOT NULL
 GROUP BY i.organization_id
ON CONFLICT (organization_id) DO UPDATE
   SET recovered_requests = excluded.recovered_requests,
       recovered_uncharged = excluded.recovered_uncharged,
       past_window_alerts = excluded.past_window_alerts
 WHERE (t.recovered_requests, t.recovered_uncharged, t.past_window_alerts)
       IS DISTINCT FROM (excluded.recovered_requests, excluded.recovered_uncharged, excluded.past_window_alerts);
