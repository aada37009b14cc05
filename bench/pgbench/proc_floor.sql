-- proc: one call with trivial statements where claim and complete would be (bench.request_floor).
\set r random(2000000000000000000, 8999999999999999999)
\set acct random(1, 1000)
\set amt random(1, 100000)
SELECT bench.request_floor(:kp || :r, :h, :acct, :amt, :body);
