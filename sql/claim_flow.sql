-- The life of a key within one session: claim, complete, replay, mismatch, release, 5xx.
TRUNCATE idempotency_keys;
CREATE FUNCTION claim_summary(k text, h text, s text DEFAULT '')
RETURNS text LANGUAGE sql AS $$
    SELECT c.outcome || ' ' || coalesce(c.http_status::text, '-') || ' ' ||
           coalesce(c.response_body::text, '-') || ' ' || coalesce(c.response_headers::text, '-') ||
           ' ' || (c.expires_at IS NOT NULL)::text
    FROM idem_claim(k, h, NULL, s) c
$$;

BEGIN;
SELECT claim_summary('pay-1', idem_hash('{"amount":100}'::jsonb));
-- The same transaction asking again is told the request is already running.
SELECT claim_summary('pay-1', idem_hash('{"amount":100}'::jsonb));
SELECT idem_complete('pay-1', 201, '{"payment_id": 7}', '{"Location": "/payments/7"}');
-- Once completed, the same transaction sees the stored response.
SELECT claim_summary('pay-1', idem_hash('{"amount":100}'::jsonb));
COMMIT;

SELECT claim_summary('pay-1', idem_hash('{"amount":100}'::jsonb));
-- Upper-case hex is the same hash.
SELECT claim_summary('pay-1', upper(idem_hash('{"amount":100}'::jsonb)));
SELECT claim_summary('pay-1', idem_hash('{"amount":999999}'::jsonb));
SET idempotency.mismatch_status = 400;
SELECT claim_summary('pay-1', idem_hash('{"amount":999999}'::jsonb));
RESET idempotency.mismatch_status;

-- claimed: expires_at is now() + ttl.
BEGIN;
SELECT expires_at = now() + interval '24 hours' AS default_ttl FROM idem_claim('pay-2', idem_hash('x'));
SELECT expires_at = now() + interval '5 minutes' AS explicit_ttl FROM idem_claim('pay-3', idem_hash('x'), interval '5 minutes');
SET LOCAL idempotency.ttl = '1h';
SELECT expires_at = now() + interval '1 hour' AS guc_ttl FROM idem_claim('pay-4', idem_hash('x'));
SELECT idem_complete('pay-3', 200);
SELECT expires_at = now() + interval '5 minutes' AS stored_expiry FROM idempotency_keys WHERE key = 'pay-3';
ROLLBACK;

-- A 4xx business answer is stored and replayed.
BEGIN;
SELECT claim_summary('pay-5', idem_hash('x'));
SELECT idem_complete('pay-5', 402, '{"error": "insufficient_funds"}');
COMMIT;
SELECT claim_summary('pay-5', idem_hash('x'));

-- A 5xx is never stored: the key is released and can be claimed again.
BEGIN;
SELECT claim_summary('pay-6', idem_hash('x'));
SELECT idem_complete('pay-6', 503, '{"error": "try later"}');
-- The released key cannot be completed any more in this transaction.
SAVEPOINT s;
SELECT idem_complete('pay-6', 200);
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS stored_5xx FROM idempotency_keys WHERE key = 'pay-6';
BEGIN;
SELECT claim_summary('pay-6', idem_hash('x'));
ROLLBACK;

-- idem_release gives the key back without storing anything.
BEGIN;
SELECT claim_summary('pay-7', idem_hash('x'));
SELECT idem_release('pay-7');
SELECT claim_summary('pay-7', idem_hash('x'));
SELECT idem_complete('pay-7', 200, '"second"');
COMMIT;
SELECT claim_summary('pay-7', idem_hash('x'));

-- Commit without completing leaves nothing behind.
BEGIN;
SELECT claim_summary('pay-8', idem_hash('x'));
COMMIT;
SELECT claim_summary('pay-8', idem_hash('x'));

-- Scopes: the same key string in two scopes is two keys.
BEGIN;
SELECT claim_summary('shared', idem_hash('x'), 'tenant_a');
SELECT claim_summary('shared', idem_hash('x'), 'tenant_b');
SELECT idem_complete('shared', 200, '"for a"', NULL, 'tenant_a');
SELECT idem_complete('shared', 200, '"for b"', NULL, 'tenant_b');
COMMIT;
SELECT claim_summary('shared', idem_hash('x'), 'tenant_a');
SELECT claim_summary('shared', idem_hash('x'), 'tenant_b');
SELECT claim_summary('shared', idem_hash('x'));

-- Keys are bytes: case and Unicode are kept.
BEGIN;
SELECT claim_summary('Ключ-é-🙂', idem_hash('x'));
SELECT claim_summary('ключ-é-🙂', idem_hash('x'));
ROLLBACK;

-- An expired key behaves as absent before anything deletes it, and its row is replaced.
BEGIN;
SELECT claim_summary('old', idem_hash('x'));
SELECT idem_complete('old', 200, '"first"');
COMMIT;
UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'old';
BEGIN;
SELECT claim_summary('old', idem_hash('another payload'));
SELECT idem_complete('old', 200, '"second"');
COMMIT;
SELECT key, response_body, count(*) OVER () FROM idempotency_keys WHERE key = 'old';

-- Savepoints: a claim rolled back to a savepoint is undone, a completion too.
BEGIN;
SAVEPOINT a;
SELECT claim_summary('sp-1', idem_hash('x'));
ROLLBACK TO SAVEPOINT a;
SELECT claim_summary('sp-1', idem_hash('x'));
SAVEPOINT b;
SELECT idem_complete('sp-1', 200, '"rolled back"');
ROLLBACK TO SAVEPOINT b;
SELECT claim_summary('sp-1', idem_hash('x'));
SAVEPOINT c;
SELECT idem_release('sp-1');
ROLLBACK TO SAVEPOINT c;
SELECT idem_complete('sp-1', 200, '"kept"');
RELEASE SAVEPOINT c;
COMMIT;
SELECT claim_summary('sp-1', idem_hash('x'));

-- A PL/pgSQL exception block is a subtransaction too.
DO $$
BEGIN
    PERFORM idem_claim('sp-2', idem_hash('x'));
    BEGIN
        PERFORM idem_complete('sp-2', 200, '"inner"');
        RAISE EXCEPTION 'business failure';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
    PERFORM idem_complete('sp-2', 201, '"outer"');
END $$;
SELECT claim_summary('sp-2', idem_hash('x'));

SELECT scope, key, http_status, response_body FROM idempotency_keys ORDER BY scope, key;
DROP FUNCTION claim_summary(text, text, text);
