-- mix: the branches of mix_extension.sql with trivial statements in place of claim and complete.
\set p random(1, 100)
\set acct random(1, 1000)
\set amt random(1, 100000)
\if :p <= 89
\set r random(2000000000000000000, 8999999999999999999)
BEGIN;
SELECT :kp || :r, :h;
INSERT INTO bench.ledger (account_id, amount_cents) VALUES (:acct, :amt);
SELECT :kp || :r, 201, :body;
COMMIT;
\set last :r
\elif :p <= 99
BEGIN;
SELECT :kp || :last, :h;
COMMIT;
\else
\set held 3000000000000000000 + random(1, 100)
BEGIN;
SELECT :kp || :held, :h;
COMMIT;
\endif
