-- new: a new key, claimed, the business insert, completed; one statement per round trip.
\set r random(2000000000000000000, 8999999999999999999)
\set acct random(1, 1000)
\set amt random(1, 100000)
BEGIN;
SELECT * FROM public.idem_claim(:kp || :r, :h);
INSERT INTO bench.ledger (account_id, amount_cents) VALUES (:acct, :amt);
SELECT public.idem_complete(:kp || :r, 201, :body);
COMMIT;
