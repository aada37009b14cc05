-- Keys in flight (1.1), the C edition's shared-memory slots (split from in_flight.sql, issue 40): a transaction's
-- first eight claims are listed, the rest counted. The managed edition lists every claim of the session's own
-- (managed/DIFFERENCES.md, "Other sessions' transactional claims cannot be listed"): this file runs on the C
-- edition only (managed/SUPPORTED).
TRUNCATE idempotency_keys;

-- Eight keys per transaction are listed; more are rows without scope and key (since: the first of them).
BEGIN;
SELECT count(*) AS claimed FROM generate_series(1, 11) g,
    LATERAL idem_claim('many-' || g, idem_hash('a')) c WHERE c.outcome = 'claimed';
SELECT count(key) AS listed, count(*) - count(key) AS unlisted, count(DISTINCT pid) AS pids
FROM idem_keys_in_flight();
SELECT idem_release('many-' || g) FROM generate_series(1, 11) g WHERE g IN (1, 9) ORDER BY g;
SELECT count(key) AS listed, count(*) - count(key) AS unlisted FROM idem_keys_in_flight();
COMMIT;
SELECT count(*) AS after_commit FROM idem_keys_in_flight();
TRUNCATE idempotency_keys;
