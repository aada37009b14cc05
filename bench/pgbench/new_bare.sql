-- new: a request without idempotency.
\set acct random(1, 1000)
\set amt random(1, 100000)
BEGIN;
INSERT INTO bench.ledger (account_id, amount_cents) VALUES (:acct, :amt);
COMMIT;
