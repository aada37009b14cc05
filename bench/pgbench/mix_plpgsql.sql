-- mix: 89 % new keys, 10 % retries of this client's last key (replay),
-- 1 % duplicates of a request still in flight (keys held by run.sh's holder session: in_progress).
\set p random(1, 100)
\set acct random(1, 1000)
\set amt random(1, 100000)
\if :p <= 89
\set r random(2000000000000000000, 8999999999999999999)
BEGIN;
SELECT * FROM plpgsql_idem.idem_claim(:kp || :r, :h);
INSERT INTO bench.ledger (account_id, amount_cents) VALUES (:acct, :amt);
SELECT plpgsql_idem.idem_complete(:kp || :r, 201, :body);
COMMIT;
\set last :r
\elif :p <= 99
BEGIN;
SELECT * FROM plpgsql_idem.idem_claim(:kp || :last, :h);
COMMIT;
\else
\set held 3000000000000000000 + random(1, 100)
BEGIN;
SELECT * FROM plpgsql_idem.idem_claim(:kp || :held, :h);
COMMIT;
\endif
