-- lease: a new key in lease mode, two transactions per request. The lease is taken and committed at once
-- (no transaction stays open across the handler's external call), then the business insert and the
-- completion with the lease's fencing token commit together. \gset hands the token to the second one.
\set r random(2000000000000000000, 8999999999999999999)
\set acct random(1, 1000)
\set amt random(1, 100000)
BEGIN;
SELECT * FROM public.idem_lease(:kp || :r, :h, '30 s') \gset
COMMIT;
BEGIN;
INSERT INTO bench.ledger (account_id, amount_cents) VALUES (:acct, :amt);
SELECT public.idem_lease_complete(:kp || :r, :lease_token, 201, :body);
COMMIT;
