-- lease floor: the round trips and row writes of lease_extension.sql without the extension. Transaction 1
-- inserts the key row as a lease (the INSERT idem_lease runs, into a copy of idempotency_keys), transaction 2
-- the business insert and the completing UPDATE that idem_lease_complete runs. No lock, lookup or decision.
\set r random(2000000000000000000, 8999999999999999999)
\set acct random(1, 1000)
\set amt random(1, 100000)
BEGIN;
INSERT INTO bench.lease_floor (expires_at, created_at, scope, key, request_hash, lease_until, lease_token)
    VALUES (now() + '24 h', now(), '', :kp || :r, decode(:h, 'hex'), clock_timestamp() + '30 s', gen_random_uuid())
    RETURNING lease_token \gset
COMMIT;
BEGIN;
INSERT INTO bench.ledger (account_id, amount_cents) VALUES (:acct, :amt);
UPDATE bench.lease_floor SET http_status = 201, response_body = :body, response_headers = NULL,
        lease_until = NULL, lease_token = NULL
    WHERE scope = '' AND key = :kp || :r AND lease_token = :lease_token AND http_status IS NULL;
COMMIT;
