-- new: two trivial statements with the parameters of claim and complete.
\set r random(2000000000000000000, 8999999999999999999)
\set acct random(1, 1000)
\set amt random(1, 100000)
BEGIN;
SELECT :kp || :r, :h;
INSERT INTO bench.ledger (account_id, amount_cents) VALUES (:acct, :amt);
SELECT :kp || :r, 201, :body;
COMMIT;
