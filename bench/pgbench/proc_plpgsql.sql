-- proc: the new-key request in one call of a PL/pgSQL function (bench.request_plpgsql).
\set r random(2000000000000000000, 8999999999999999999)
\set acct random(1, 1000)
\set amt random(1, 100000)
SELECT bench.request_plpgsql(:kp || :r, :h, :acct, :amt, :body);
